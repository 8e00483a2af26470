"""The tiny pair: deterministic files, loadable offline, useful laws, a correlated draft."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from specpair.draft import propose
from specpair.errors import BadInput
from specpair.models import cli as models_cli
from specpair.models import tokenizer
from specpair.models.tiny import TinyPair, TinySpec, make_tiny
from specpair.sampling import SamplingParams
from specpair.verify import verify


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def test_same_seed_gives_bit_identical_files(tmp_path: Path, tiny_pair: TinyPair) -> None:
    again = make_tiny(tmp_path / "again")
    other = make_tiny(tmp_path / "other", TinySpec(seed=1))
    ref = _digests(tiny_pair.target.parent)
    assert _digests(again.target.parent) == ref
    assert len(ref) == 12  # 6 files per model
    changed = {k for k, v in _digests(other.target.parent).items() if ref[k] != v}
    assert changed == {"target/model.safetensors", "draft/model.safetensors"}


def test_refuses_to_overwrite(tiny_pair: TinyPair) -> None:
    with pytest.raises(FileExistsError, match="exists"):
        make_tiny(tiny_pair.target.parent)


def test_cli_writes_the_pair_and_reports_json(tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    models_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["models", "make-tiny", "--out", str(tmp_path), "--seed", "3",
                              "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"target": str(tmp_path / "target"), "draft": str(tmp_path / "draft"), "seed": 3}
    with pytest.raises(BadInput, match="exists"):
        args.func(args)
    args = parser.parse_args(["models", "make-tiny", "--out", str(tmp_path / "x"), "--seed",
                              "-1"])
    with pytest.raises(BadInput, match=r"seed must lie in \[0, 2\*\*63\)"):
        args.func(args)
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_loads_offline_with_shared_tokenizer(tiny_pair: TinyPair) -> None:
    tok_t = AutoTokenizer.from_pretrained(tiny_pair.target, local_files_only=True)
    tok_d = AutoTokenizer.from_pretrained(tiny_pair.draft, local_files_only=True)
    ids = tok_t("ba be, bo.").input_ids
    assert ids == tok_d("ba be, bo.").input_ids == [1, 10, 11, 5, 13, 4]
    assert tok_t.decode(ids, skip_special_tokens=True) == "ba be , bo ."
    assert (tok_t.bos_token_id, tok_t.eos_token_id, tok_t.pad_token_id) == (1, 2, 3)
    assert tokenizer.fingerprint(tiny_pair.target) == tokenizer.fingerprint(tiny_pair.draft)
    assert len(tokenizer.fingerprint(tiny_pair.target)) == 32
    t, d = _load(tiny_pair.target), _load(tiny_pair.draft)
    assert t.config.num_hidden_layers == 4 and d.config.num_hidden_layers == 2
    assert t.config.head_dim == 32 and t.config.vocab_size == tokenizer.VOCAB_SIZE


def test_chat_template_renders_a_conversation(tiny_pair: TinyPair, tmp_path: Path) -> None:
    """vLLM's /v1/chat/completions needs a chat template: the tiny tokenizer carries one."""
    tok = AutoTokenizer.from_pretrained(tiny_pair.target, local_files_only=True)
    chat = [{"role": "user", "content": "ba be, bo."}, {"role": "assistant", "content": "bu da"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == "<s>user : ba be, bo. </s> assistant : bu da </s> assistant :"
    ids = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    unk, colon, eos = 0, tok.convert_tokens_to_ids(":"), 2
    assert ids == [1, unk, colon, 10, 11, 5, 13, 4, eos, unk, colon, 14, 15, eos, unk, colon]
    assert ids.count(1) == 1  # one <s>: the template's, not a second from the post-processor
    assert AutoTokenizer.from_pretrained(tiny_pair.draft, local_files_only=True) \
        .apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == text
    # The template is in tokenizer_config.json, so the fingerprint covers it.
    copy = tmp_path / "tok"
    copy.mkdir()
    for name in tokenizer.TOKENIZER_FILES:
        (copy / name).write_bytes((tiny_pair.target / name).read_bytes())
    assert tokenizer.fingerprint(copy) == tokenizer.fingerprint(tiny_pair.target)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tokenizer.CHAT_TEMPLATE
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer.fingerprint(copy) != tokenizer.fingerprint(tiny_pair.target)


def test_draft_shares_the_targets_first_layers(tiny_pair: TinyPair) -> None:
    t = load_file(tiny_pair.target / "model.safetensors")
    d = load_file(tiny_pair.draft / "model.safetensors")
    assert set(d) < set(t)
    assert all(torch.equal(d[n], t[n]) for n in d)


@torch.no_grad()
def test_target_laws_are_neither_uniform_nor_one_hot_and_depend_on_context(
        tiny_pair: TinyPair) -> None:
    model = _load(tiny_pair.target)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(10, tokenizer.VOCAB_SIZE, (64, 12), generator=gen)
    x[:, -1] = 77  # same last token, different contexts
    logp = torch.log_softmax(model(x).logits[:, -1].float(), dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)  # nats; uniform would be ln 512 = 6.24
    assert 1.5 < float(entropy.mean()) < 4.5, entropy.mean()
    assert float(p.max(-1).values.max()) < 0.95
    tv = 0.5 * (p[:32] - p[32:]).abs().sum(-1)
    assert float(tv.mean()) > 0.3  # the context matters


@torch.no_grad()
def test_sampled_drafting_accepts_at_least_one_per_round_at_k3_t1(tiny_pair: TinyPair) -> None:
    """Mean accepted drafts per round with the core (propose + verify) on real logits.

    32 requests x 8 rounds, K = 3, temperature 1, seeded (deterministic). Measured
    mean ~1.5 (per-round std ~1.1, so the standard error is ~0.07): the bound 1.0
    sits ~7 standard errors below it.
    """
    mean = _mean_accepted(tiny_pair, k=3, rounds=8, requests=32)
    print(f"tiny pair: mean accepted per round (K=3, T=1) = {mean:.3f} over 256 rounds")
    assert 1.0 <= mean < 2.9, mean  # materially often, and the draft is not the target


def _mean_accepted(tiny_pair: TinyPair, k: int, rounds: int, requests: int) -> float:
    target, draft = _load(tiny_pair.target), _load(tiny_pair.draft)
    gen = torch.Generator().manual_seed(1)
    accepted = []
    for r in range(requests):
        ctx = torch.cat([torch.ones(1, dtype=torch.int64),
                         torch.randint(10, tokenizer.VOCAB_SIZE, (7,), generator=gen)])
        params = SamplingParams.make(1, temperature=1.0, seed=1000 + r)
        for _ in range(rounds):
            pos = torch.tensor([ctx.numel()])
            grown = [ctx]

            def next_logits(d: torch.Tensor, _k: int, grown: list = grown) -> torch.Tensor:
                grown.append(d)
                return draft(torch.cat(grown)[None]).logits[:, -1]

            prop = propose(draft(ctx[None]).logits[:, -1], next_logits, params, pos, k)
            tl = target(torch.cat([ctx, prop.tokens[0]])[None]).logits[:, -k - 1:]
            verdict = verify(tl, prop, params, pos)
            accepted.append(int(verdict.num_accepted[0]))
            ctx = torch.cat([ctx, verdict.tokens[0, : int(verdict.num_emitted[0])]])
    return sum(accepted) / len(accepted)
