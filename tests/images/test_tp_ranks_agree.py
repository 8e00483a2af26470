"""The production target's two ranks (rank 0 serving the API, rank 1 headless), as compose
starts them (compose/sparkhead.yml, sparkworker.yml) and as the deploy roles do
(inventories/prod/group_vars/sparkhead.yml, sparkworker.yml), describe one engine: each node
builds its workers from its own arguments, so the model, the tensor parallelism, the nodes and
the speculative config must be the same words on both (a worker without the speculative config
would not verify the drafts rank 0 shares).
Only rank 0 talks to the drafter."""

from __future__ import annotations

import shlex

import yaml

from .conftest import ROOT

SAME = ("--tensor-parallel-size", "--nnodes", "--master-addr", "--speculative-config")


def _service(name: str, service: str) -> dict:
    return yaml.safe_load((ROOT / "compose" / name).read_text())["services"][service]


def _args(service: dict) -> tuple[list[str], dict[str, str]]:
    words = shlex.split(service["command"])
    assert words[:2] == ["vllm", "serve"], words
    flags = {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--")
             else "" for i, w in enumerate(words) if w.startswith("--")}
    return words, flags


def test_both_ranks_describe_one_engine():
    head_words, head = _args(_service("sparkhead.yml", "target"))
    worker_words, worker = _args(_service("sparkworker.yml", "target-worker"))
    assert head_words[2] == worker_words[2]  # the model
    for flag in SAME:
        assert head.get(flag) is not None and head.get(flag) == worker.get(flag), flag
    assert head["--node-rank"] == "0" and worker["--node-rank"] == "1"
    assert "--headless" in worker and "--headless" not in head


def _inventory(host: str) -> tuple[list[str], dict[str, str]]:
    gv = yaml.safe_load((ROOT / "inventories" / "prod" / "group_vars" / f"{host}.yml").read_text())
    words = [str(w).strip() for w in gv["specpair_service_command"]]
    return words, {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--")
                   else "" for i, w in enumerate(words) if w.startswith("--")}


def test_the_deploy_roles_start_both_ranks_as_one_engine():
    head_words, head = _inventory("sparkhead")
    worker_words, worker = _inventory("sparkworker")
    assert head_words[2] == worker_words[2]
    for flag in SAME:
        assert head.get(flag) is not None and head.get(flag) == worker.get(flag), flag
    assert head["--node-rank"] == "0" and worker["--node-rank"] == "1" and "--headless" in worker


def test_only_rank_0_talks_to_the_drafter():
    head = _service("sparkhead.yml", "target")["environment"]
    worker = _service("sparkworker.yml", "target-worker")["environment"]
    assert "SPECPAIR_DRAFTER" in head
    assert not any(k.startswith("SPECPAIR_DRAFTER") for k in worker)
