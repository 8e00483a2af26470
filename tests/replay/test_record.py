"""Recording a replay file from the locally generated tiny model pair (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specpair.cli import main
from specpair.models.tiny import make_tiny
from specpair.replay.record import record_from_models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 128-wide model gains nothing from more on a busy machine
    yield make_tiny(Path(tmp_path_factory.mktemp("tiny")))
    torch.set_num_threads(threads)


def test_rounds_shapes_and_determinism(tiny):
    kw = dict(prompts=2, tokens=9, depth=2, temperature=1.0, seed=3)
    a = record_from_models(tiny.target, tiny.draft, **kw)
    # per sequence: rounds start at prompt end + 0, 3, 6 (each needs K + 1 = 3 positions)
    assert tuple(a.target_logits.shape) == (6, 3, 512)
    assert tuple(a.draft_logits.shape) == (6, 2, 512)
    b = record_from_models(tiny.target, tiny.draft, **kw)
    assert torch.equal(a.target_logits, b.target_logits)
    assert torch.equal(a.draft_logits, b.draft_logits)
    # the draft is close to the target but is not the target
    assert not torch.equal(a.draft_logits, a.target_logits[:, :2])


def test_cli_records_then_replays(tiny, tmp_path, capsys):
    out = tmp_path / "tiny.safetensors"
    assert main(["replay", str(out), "--from-models", str(tiny.target), str(tiny.draft),
                 "--depth", "2", "--prompts", "2", "--tokens", "9", "--bootstrap", "200",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["rounds"] == 6 and res["depth"] == 2 and out.exists()
    assert main(["replay", str(out), "--from-models", str(tiny.target), str(tiny.draft)]) == 4
    assert "--from-models needs --depth" in capsys.readouterr().err
