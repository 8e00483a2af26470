"""The sampled speculator: exact q, q(d) > 0, encodings, autoregression, positions."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specpair import draft, qlaw, sampling
from specpair.draft import DraftMode, draft_step, propose
from specpair.proposal import QKind
from specpair.sampling import SamplingParams, process_logits


def _table(seed, k, v, b=1, scale=2.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, k, v, generator=g) * scale


def _propose(table, params, position, depth, **kw):
    b = params.batch
    return propose(table[:, 0].expand(b, -1), lambda d, k: table[:, k].expand(b, -1),
                   params, position, depth, **kw)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    v=st.integers(2, 200),
    depth=st.integers(1, 5),
    temp=st.sampled_from([0.0, 0.6, 1.0, 1.5]),
    top_k=st.integers(0, 30),
    top_p=st.sampled_from([1.0, 0.9, 0.3]),
    draft_top_k=st.sampled_from([0, 8]),
)
def test_q_is_a_normalized_law_with_the_draft_in_its_support(
        seed, v, depth, temp, top_k, top_p, draft_top_k):
    table = _table(seed, depth, v)
    params = SamplingParams.make(4, temp, top_k, top_p, seed=[seed, 1, 2, 3])
    prop = _propose(table, params, torch.tensor([0, 5, 9, 2**31]), depth,
                    draft_top_k=draft_top_k)
    truncated = temp == 0 or top_k > 0 or top_p < 1 or draft_top_k > 0
    assert prop.kind == (QKind.SPARSE if truncated else QKind.DENSE)
    lq = prop.q_logp.double()
    assert torch.allclose(lq.exp().sum(-1), torch.ones(4, depth, dtype=torch.float64), atol=1e-5)
    logq_d = qlaw.draft_logq(prop)
    assert bool(torch.isfinite(logq_d).all()), "q(d) must be > 0 for every drafted token"
    if prop.kind == QKind.SPARSE:
        ids = prop.q_ids
        assert bool((ids < v).all())
        for row in ids.reshape(-1, ids.shape[-1]):
            valid = row[row >= 0]
            assert valid.unique().numel() == valid.numel(), "support ids must be distinct"
            assert bool((row[valid.numel():] == -1).all()), "padding goes last"


def test_q_is_exactly_the_processed_law_of_the_draft_logits():
    table = _table(3, 1, 500)
    params = SamplingParams.make(2, 0.6, top_k=40, seed=[1, 2])
    prop = _propose(table, params, torch.tensor([4, 4]), 1)
    dense = process_logits(table[:, 0].expand(2, -1), params)
    for b in range(2):
        ids = prop.q_ids[b, 0]
        valid = ids >= 0
        assert torch.equal(dense[b, ids[valid]], prop.q_logp[b, 0][valid])


def test_greedy_mode_declares_point_mass_and_drafts_argmax():
    table = _table(4, 3, 64)
    params = SamplingParams.make(2, 1.0, seed=[5, 6])
    prop = _propose(table, params, torch.tensor([0, 0]), 3, mode=DraftMode.GREEDY)
    assert prop.kind == QKind.POINT_MASS and prop.q_logp is None
    assert torch.equal(prop.tokens, table.argmax(-1).expand(2, -1))


@pytest.mark.parametrize(("temps", "top_p", "top_k", "skips"), [
    ([0.0, 0.0, 0.0], 1.0, 0, True), ([0.0, 0.0, 0.0], 1.0, 5, True),
    ([0.0, 0.0, 0.0], 0.9, 0, False), ([0.0, 1.0, 0.0], 1.0, 5, False)])
def test_a_sampled_round_of_greedy_rows_is_the_argmax_law_bit_for_bit(
        temps, top_p, top_k, skips, monkeypatch):
    """SAMPLED mode, every row at T = 0 without top-p: the round skips the law and the
    uniforms (draft._argmax_law) and must give the tensors the step-by-step path gives
    (truncated_law, then the inverse-CDF draw); with top-p or a T > 0 row it takes that
    path itself. Logit ties included (the argmax's first index either way)."""
    table = _table(8, 3, 300).expand(3, -1, -1).clone()
    table[1, :, 7] = table[1, :, 9] = table[1].max() + 1  # a tie in row 1
    params = SamplingParams(torch.tensor(temps), torch.full((3,), top_k),
                            torch.full((3,), top_p), torch.tensor([1, 2, 3]))
    position = torch.tensor([4, 40, 400])
    laws = []
    monkeypatch.setattr(draft, "truncated_law",
                        lambda *a: laws.append(1) or sampling.truncated_law(*a))
    prop = propose(table[:, 0], lambda d, k: table[:, k], params, position, 3)
    assert (laws == []) == skips
    for k in range(3):
        d, kind, q_logp, q_ids = draft_step(table[:, k], params, position + k)
        width = q_ids.shape[1]
        assert kind == prop.kind == QKind.SPARSE and torch.equal(d, prop.tokens[:, k])
        assert torch.equal(q_ids, prop.q_ids[:, k, :width])
        assert torch.equal(q_logp, prop.q_logp[:, k, :width])
        assert q_logp.dtype == prop.q_logp.dtype and q_ids.dtype == prop.q_ids.dtype
        assert bool((prop.q_ids[:, k, width:] == -1).all())
    assert prop.tokens[1, 0] == 7


def test_drafting_is_autoregressive_and_positions_absolute():
    v = 32
    seen = []

    def next_logits(d, k):
        seen.append((k, d.clone()))
        # the next law depends on the previous draft: mass concentrated on d + 1
        x = torch.full((d.shape[0], v), -10.0)
        x[torch.arange(d.shape[0]), (d + 1) % v] = 10.0
        return x

    params = SamplingParams.make(3, 1.0, seed=[7, 8, 9])
    first = torch.zeros(3, v)
    prop = propose(first, next_logits, params, torch.tensor([10, 20, 30]), 3)
    assert [k for k, _ in seen] == [1, 2]
    assert torch.equal(seen[0][1], prop.tokens[:, 0])
    assert torch.equal(prop.tokens[:, 1], (prop.tokens[:, 0] + 1) % v)
    # step k uses the DRAFT uniform at position + k: redraw step 0 at position 11
    d_shift, *_ = draft_step(first, params, torch.tensor([11, 21, 31]))
    d_same, *_ = draft_step(first, params, torch.tensor([10, 20, 30]))
    assert torch.equal(d_same, prop.tokens[:, 0])
    assert not torch.equal(d_shift, d_same)


def test_draws_follow_q():
    v, n = 12, 60_000
    table = _table(9, 1, v, scale=1.0)
    params = SamplingParams.make(n, 1.0, seed=list(range(n)))
    prop = _propose(table, params, torch.full((n,), 3), 1)
    q = torch.softmax(table[0, 0].double(), -1)
    obs = torch.bincount(prop.tokens[:, 0], minlength=v).double()
    chi2 = ((obs - n * q) ** 2 / (n * q)).sum().item()
    assert chi2 < 45.0  # df = 11; chi2.isf(1e-6, 11) = 44.7


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        _propose(_table(0, 1, 4), SamplingParams.make(1), torch.tensor([0]), 0)


def test_a_request_draws_the_same_token_whatever_its_batch_encoding():
    v = 3000
    table = _table(11, 2, v, b=2)
    truncated = SamplingParams.make(1, 0.8, top_k=50, seed=[42])
    alone = _propose(table[:1], truncated, torch.tensor([7]), 2)
    assert alone.kind == QKind.SPARSE
    # the same request beside an untruncated one: the batch ships DENSE
    mixed = SamplingParams(
        temperature=torch.tensor([0.8, 1.0]), top_k=torch.tensor([50, 0]),
        top_p=torch.tensor([1.0, 1.0]), seed=torch.tensor([42, 43]))
    both = propose(table[:, 0], lambda d, k: table[:, k], mixed, torch.tensor([7, 7]), 2)
    assert both.kind == QKind.DENSE
    assert torch.equal(both.tokens[0], alone.tokens[0])
