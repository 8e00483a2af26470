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


def test_heldout_prompts_are_seeded_distinct_windows_of_the_stream(tiny):
    from bench.replay import heldout_prompts
    from tokenizers import Tokenizer

    from specpair.models.train import token_stream

    tok = tiny.target / "tokenizer.json"
    texts = ["ba be bi bo bu . " * 40, "da de di , do du ! " * 30]
    stream = token_stream(Tokenizer.from_file(str(tok)), texts)
    ids, offsets = heldout_prompts(tok, texts, 5, seed=7, length=16)
    assert tuple(ids.shape) == (5, 16) and len(set(offsets.tolist())) == 5
    for row, off in zip(ids, offsets.tolist(), strict=True):
        assert off % 16 == 0 and torch.equal(row, stream[off:off + 16])
    again, _ = heldout_prompts(tok, texts, 5, seed=7, length=16)
    assert torch.equal(ids, again)
    assert not torch.equal(ids, heldout_prompts(tok, texts, 5, seed=8, length=16)[0])
    windows = stream.numel() // 16
    with pytest.raises(ValueError, match=f"has {windows} windows of 16 tokens"):
        heldout_prompts(tok, texts, windows + 1, seed=0, length=16)


def test_bench_replay_rows_match_specpair_replay_of_the_written_files(tiny, tmp_path, capsys):
    from bench.replay import (
        DEPTH,
        DRAFT_TOP_KS,
        SETTINGS,
        TOP_K_DEPTH,
        format_table,
        format_truncated,
        measure,
    )

    prompts = torch.tensor([[1, 20, 30, 40], [1, 50, 60, 70]])
    rows, truncated = measure(tiny.target.parent, prompts, tokens=DEPTH + 1, bootstrap=100,
                              seed=0, out=tmp_path)
    assert [(r["setting"], r["depth"]) for r in rows] == [
        (s, d) for s in SETTINGS for d in range(1, DEPTH + 1)]
    assert all(r["rounds"] == 2 for r in rows)  # one round of K + 1 = 6 positions per prompt
    assert len(format_table(rows).splitlines()) == 2 + len(rows)
    row = rows[len(rows) - 3]  # the top-p setting at depth 3
    assert row["top_p"] == 0.9 and row["depth"] == 3
    assert main(["replay", row["recording"], "--depth", "3", "--bootstrap", "100",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["params"]["top_p"] == pytest.approx(0.9)
    assert res["accepted"]["sampled"] == pytest.approx(row["accepted"]["sampled"])
    assert res["accepted"]["diff_ci"] == pytest.approx(row["accepted"]["diff_ci"])
    # the draft-top-k rows: untruncated is the sampled row at the same depth; a cut q keeps
    # less of min(p, q) on the tiny pair's wide laws (V = 512)
    assert [(r["setting"], r["draft_top_k"]) for r in truncated] == [
        (s, k) for s in SETTINGS for k in DRAFT_TOP_KS]
    for s in SETTINGS:
        same = next(r for r in rows if r["setting"] == s and r["depth"] == TOP_K_DEPTH)
        got = [r for r in truncated if r["setting"] == s]
        assert got[0]["accepted"] == pytest.approx(same["accepted"]["sampled"])
        assert got[1]["accepted"] < got[2]["accepted"] < got[0]["accepted"]
    assert len(format_truncated(truncated).splitlines()) == 2 + len(truncated)


@pytest.mark.parametrize("argv, says", [
    (["--prompts", "0"], "--prompts must lie in 1..4096, got 0"),
    (["--tokens", "65"], "--tokens must lie in 6..64, got 65"),
    (["--pair", "NOPAIR"], "has no target/tokenizer.json"),
])
def test_bench_replay_refuses_bad_input_in_one_line(argv, says, tmp_path, capsys):
    from bench.replay import main as bench_main

    with pytest.raises(SystemExit) as e:
        bench_main([str(tmp_path / a) if a == "NOPAIR" else a for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 4 and says in err and err.count("\n") == 1


@pytest.mark.parametrize("ids, says", [
    (torch.tensor([1, 2, 3]), r"prompt_ids must be \[N, L >= 1\], got shape \(3,\)"),
    (torch.tensor([[1, 512]]), r"prompt_ids must be token ids in 0\.\.511"),
])
def test_given_prompts_are_checked(tiny, ids, says):
    with pytest.raises(ValueError, match=says):
        record_from_models(tiny.target, tiny.draft, prompt_ids=ids, tokens=3, depth=2,
                           temperature=1.0)
