"""specpair.drafter.llama_forward against transformers' own LlamaForCausalLM forward: the same
logits, bit for bit, at every begin and step of padded batches (new requests, cached pasts of
different lengths, one query and many), for the committed trained draft and a
grouped-query-attention Llama; and the models it must leave to transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from specpair.drafter.llama_forward import LlamaForward
from specpair.drafter.model import HFDraftModel, HFForward, Row

DRAFT = Path(__file__).resolve().parents[2] / "models" / "trained" / "draft"
# (past tokens already cached, new tokens fed) per row
BATCHES = [[(0, 5)], [(6, 3)], [(6, 1)], [(0, 5), (6, 3), (0, 1), (9, 2)], [(3, 1)] * 4,
           [(0, 4)] * 4, [(17, 1), (2, 6)]]


def _gqa_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def _rounds(model: HFDraftModel, forward, batch, vocab: int) -> list[torch.Tensor]:
    model.forward = forward
    gen = torch.Generator().manual_seed(len(batch))
    caches = []
    for past, _ in batch:
        if past:
            session, _ = model.begin([Row(None, 0, torch.randint(4, vocab, (past,),
                                                                 generator=gen), None)])
            caches.append(session.finish()[0])
        else:
            caches.append(None)
    rows = [Row(c, p, torch.randint(4, vocab, (n,), generator=gen), None)
            for c, (p, n) in zip(caches, batch, strict=True)]
    session, logits = model.begin(rows)
    out = [logits]
    for i in range(3):
        out.append(session.step(torch.full((len(batch),), 5 + i)))
    return out


@pytest.mark.parametrize("which", ["trained draft", "grouped-query llama"])
def test_the_same_logits_bit_for_bit_as_transformers(which, tmp_path):
    if which == "trained draft":
        model = HFDraftModel(DRAFT)
    else:
        _gqa_llama().save_pretrained(tmp_path / "gqa")
        model = HFDraftModel(tmp_path / "gqa")
    fast = model.forward
    assert isinstance(fast, LlamaForward)
    slow = HFForward(model.model)
    for batch in BATCHES:
        want = _rounds(model, slow, batch, model.vocab_size)
        got = _rounds(model, fast, batch, model.vocab_size)
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            assert torch.equal(w, g), (batch, i, (w - g).abs().max().item())


def test_models_it_does_not_mirror_are_left_to_transformers():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    assert LlamaForward.of(gpt2) is None
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2,
                      rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                       "factor": 2.0})
    assert LlamaForward.of(LlamaForCausalLM(cfg)) is None
    eager = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, attn_implementation="eager")
    assert LlamaForward.of(LlamaForCausalLM(eager)) is None
    assert LlamaForward.of(_gqa_llama()) is not None
