"""The target's two tensor-parallel ranks (rank 0 serving the API, rank 1 headless) describe one
engine wherever they are started: by compose in production (compose/sparkhead.yml,
sparkworker.yml), by the deploy roles (inventories/prod/group_vars/sparkhead.yml,
sparkworker.yml, and the local inventory's) and by `make up TP=2` (compose/local-cpu.yml with
compose/local-cpu-tp2.yml).
Each node builds its workers from its own arguments, so the model, the tensor parallelism, the
nodes, the rendezvous and the speculative config must be the same words on both (a worker
without the speculative config would not verify the drafts rank 0 shares). Only rank 0 talks
to the drafter."""

from __future__ import annotations

import shlex

import pytest
import yaml

from .conftest import ROOT

SAME = ("--tensor-parallel-size", "--nnodes", "--master-addr", "--master-port",
        "--speculative-config")
LOCAL_SAME = (*SAME, "--dtype", "--max-model-len", "--max-num-seqs", "--seed")
SERVE = (["vllm", "serve"], ["python", "-m", "specpair.vllm.serve"])


def _compose(name: str) -> dict:
    return yaml.safe_load((ROOT / "compose" / name).read_text())["services"]


def _parse(words: list[str]) -> tuple[str, dict[str, str]]:
    """(the model, {flag: value or ""}) of a `vllm serve` command line."""
    prog = next(p for p in SERVE if words[:len(p)] == p)
    words = words[len(prog):]
    flags = {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--")
             else "" for i, w in enumerate(words) if w.startswith("--")}
    return words[0], flags


def _inventory(host: str, inventory: str = "prod") -> tuple[str, dict[str, str]]:
    gv = yaml.safe_load((ROOT / "inventories" / inventory / "group_vars" / f"{host}.yml")
                        .read_text())
    return _parse([str(w).strip() for w in gv["specpair_service_command"]])


def _ranks(where: str):
    if where == "compose":
        return (_parse(shlex.split(_compose("sparkhead.yml")["target"]["command"])),
                _parse(shlex.split(_compose("sparkworker.yml")["target-worker"]["command"])),
                SAME)
    if where == "deploy roles":
        return _inventory("sparkhead"), _inventory("sparkworker"), SAME
    if where == "local deploy":
        return _inventory("sparkhead", "local"), _inventory("sparkworker", "local"), LOCAL_SAME
    local = _compose("local-cpu-tp2.yml")
    return (_parse(shlex.split(local["target"]["command"])),
            _parse(shlex.split(local["target-worker"]["command"])), LOCAL_SAME)


@pytest.mark.parametrize("where", ["compose", "deploy roles", "local deploy", "make up TP=2"])
def test_both_ranks_describe_one_engine(where):
    (head_model, head), (worker_model, worker), same = _ranks(where)
    assert head_model == worker_model
    for flag in same:
        assert head.get(flag) is not None and head.get(flag) == worker.get(flag), flag
    assert head["--node-rank"] == "0" and worker["--node-rank"] == "1"
    assert "--headless" in worker and "--headless" not in head


def test_only_rank_0_talks_to_the_drafter():
    for head, worker in ((_compose("sparkhead.yml")["target"],
                          _compose("sparkworker.yml")["target-worker"]),
                         (_compose("local-cpu.yml")["target"],
                          _compose("local-cpu-tp2.yml")["target-worker"])):
        assert "SPECPAIR_DRAFTER" in head["environment"]
        assert not any(k.startswith("SPECPAIR_DRAFTER") for k in worker["environment"])
    for inventory in ("prod", "local"):
        gv = {host: yaml.safe_load((ROOT / "inventories" / inventory / "group_vars" / f"{host}.yml")
                                   .read_text()) for host in ("sparkhead", "sparkworker")}
        assert "SPECPAIR_DRAFTER" in gv["sparkhead"]["specpair_service_env"]
        assert not any(k.startswith("SPECPAIR_DRAFTER")
                       for k in gv["sparkworker"]["specpair_service_env"]), inventory
        assert not gv["sparkworker"].get("specpair_service_key_file"), inventory
