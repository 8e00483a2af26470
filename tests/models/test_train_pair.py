"""`specpair models train-pair` (src/specpair/models/train.py, corpus.py, bpe.py).

The smoke preset runs in seconds; the committed pair (models/trained) is checked against its
own pins here, and reproduced bit for bit only by `specpair models train-pair --check`
(docs/models.md: about 5 minutes on a quiet 2-core box).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaForCausalLM

from specpair.cli import main
from specpair.models import corpus, platform
from specpair.models.tokenizer import fingerprint
from specpair.models.train import (
    PINNED_DIR,
    PRESETS,
    check_pinned,
    evaluate,
    file_hashes,
    token_stream,
    train_pair,
)

QUIET = lambda msg: None  # noqa: E731


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smoke")
    train_pair(out, "smoke", log=QUIET)
    return out


def test_smoke_training_is_bit_identical_twice(smoke: Path, tmp_path: Path) -> None:
    pair = train_pair(tmp_path, "smoke", log=QUIET)
    assert file_hashes(tmp_path) == file_hashes(smoke) == pair["sha256"]
    assert (tmp_path / "corpus.json").read_bytes() == (smoke / "corpus.json").read_bytes()
    # the control: one changed byte is found and named
    weights = tmp_path / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert check_pinned(tmp_path, pair).startswith("draft/model.safetensors: sha256 ")


def test_a_mismatch_on_another_platform_names_both(smoke: Path) -> None:
    pair = json.loads((smoke / "pair.json").read_text())
    assert pair["platform"] == list(platform.host())
    other = pair | {"platform": ["2.13.0+cpu", "AVX2", "GenuineIntel", "family 6 model 1"],
                    "sha256": pair["sha256"] | {"draft/model.safetensors": "0" * 64}}
    line = check_pinned(smoke, other)
    assert "pinned on 2.13.0+cpu / AVX2 / GenuineIntel / family 6 model 1, this is " in line
    assert "\n" not in line
    # the same platform: the mismatch alone
    assert "pinned on" not in check_pinned(smoke, other | {"platform": pair["platform"]})


def test_smoke_target_is_grown_from_the_draft(smoke: Path) -> None:
    target = load_file(smoke / "target" / "model.safetensors")
    draft = load_file(smoke / "draft" / "model.safetensors")
    assert set(draft) < set(target)  # the draft's names, and the target's extra layers
    assert any(not torch.equal(target[n], draft[n]) for n in draft)  # then trained further


def test_smoke_pair_loads_offline_and_shares_one_tokenizer(smoke: Path) -> None:
    assert fingerprint(smoke / "target") == fingerprint(smoke / "draft")
    tok = AutoTokenizer.from_pretrained(smoke / "target")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 3)
    text = "def f(x):\n    return x  # é\n"
    ids = tok(text).input_ids
    assert ids[0] == 1 and tok.decode(ids[1:]) == text  # byte-level: every string round-trips
    chat = tok.apply_chat_template([{"role": "user", "content": "sort a list"}],
                                   add_generation_prompt=True, tokenize=False)
    assert chat == "<s># user: sort a list\n# assistant:"
    for sub in ("target", "draft"):
        model = LlamaForCausalLM.from_pretrained(smoke / sub)
        assert model.config.tie_word_embeddings
        assert torch.isfinite(model(input_ids=torch.tensor([ids])).logits).all()


def test_cli_refuses_check_without_pins_and_an_existing_out(smoke: Path, capsys) -> None:
    assert main(["models", "train-pair", "--out", str(smoke), "--preset", "smoke",
                 "--check"]) == 4
    assert "--check needs --preset full" in capsys.readouterr().err
    assert main(["models", "train-pair", "--out", str(smoke), "--preset", "smoke"]) == 4
    assert "exists (pass --force to overwrite)" in capsys.readouterr().err


def test_cli_names_the_first_corpus_file_that_differs_exit_3(tmp_path: Path, capsys) -> None:
    files = corpus.scan()
    pinned = corpus.manifest(files)
    victim = pinned["files"][1]
    victim[1] = "0" * 64
    (tmp_path / "pin").mkdir()
    (tmp_path / "pin" / "corpus.json").write_text(json.dumps(pinned))
    rc = main(["models", "train-pair", "--out", str(tmp_path / "out"), "--pinned",
               str(tmp_path / "pin")])
    err = capsys.readouterr().err
    assert rc == 3
    assert err.count("\n") == 1 and f"corpus file {victim[0]} under " in err, err
    assert "pinned 0000000000000000..." in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_corpus_rule_excludes_tests_and_splits_by_path() -> None:
    files = corpus.scan()
    assert files and not any(set(Path(f.path).parts[:-1]) & corpus.EXCLUDED_DIRS for f in files)
    held = [f for f in files if f.split == "heldout"]
    assert 0.05 < len(held) / len(files) < 0.2
    assert all(corpus.split_of(f.path) == f.split for f in files)


PINNED_PAIR = PINNED_DIR / "pair.json"


@pytest.mark.skipif(not PINNED_PAIR.is_file(), reason="no committed pair in this tree")
def test_committed_pair_matches_its_pins_and_its_corpus() -> None:
    pair = json.loads(PINNED_PAIR.read_text())
    assert check_pinned(PINNED_DIR, pair) is None
    size = sum(p.stat().st_size for p in PINNED_DIR.rglob("*") if p.is_file())
    assert size < 40 * 2**20, f"{size} bytes committed"
    pinned_corpus = json.loads((PINNED_DIR / "corpus.json").read_text())
    if pinned_corpus["python"] != sys.version.split()[0]:
        pytest.skip(f"the corpus is Python {pinned_corpus['python']}'s stdlib, this is "
                    f"{sys.version.split()[0]}")
    corpus.check(pinned_corpus)
    target = load_file(PINNED_DIR / "target" / "model.safetensors")
    draft = load_file(PINNED_DIR / "draft" / "model.safetensors")
    m = pair["metrics"]
    assert sum(t.numel() for t in target.values()) == m["target_params"]
    assert sum(t.numel() for t in draft.values()) == m["draft_params"]
    assert m["draft_params"] * 4 < m["target_params"]


@pytest.mark.skipif(not PINNED_PAIR.is_file(), reason="no committed pair in this tree")
def test_committed_target_is_better_than_its_draft_on_heldout_text() -> None:
    """pair.json's held-out metrics are what the committed weights give (recomputed here over
    a quarter of pair.json's eval_tokens, seconds), and the target beats its draft."""
    pair = json.loads(PINNED_PAIR.read_text())
    pinned_corpus = json.loads((PINNED_DIR / "corpus.json").read_text())
    if pinned_corpus["python"] != sys.version.split()[0]:
        pytest.skip(f"the held-out text is Python {pinned_corpus['python']}'s stdlib, this is "
                    f"{sys.version.split()[0]}")
    cfg = dataclasses.replace(PRESETS["full"], eval_tokens=pair["config"]["eval_tokens"] // 4)
    tok = Tokenizer.from_file(str(PINNED_DIR / "target" / "tokenizer.json"))
    held = token_stream(tok, corpus.texts(corpus.check(pinned_corpus), "heldout"))
    models = [LlamaForCausalLM.from_pretrained(PINNED_DIR / sub).eval()
              for sub in ("target", "draft")]
    m = evaluate(cfg, *models, held)
    full = pair["metrics"]
    assert m["target_loss"] < m["draft_loss"] - 0.1, m  # clearly better (perplexity -10 %)
    assert full["target_loss"] < full["draft_loss"] - 0.1, full
    for key in ("target_loss", "draft_loss", "accept_t1_sum_min_pq"):  # a quarter of the text
        assert abs(m[key] - full[key]) < 0.1 * abs(full[key]), (key, m[key], full[key])
