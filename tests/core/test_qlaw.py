"""The q-law module against the formulas it replaced, bit for bit, and against the core law.

The ``_former_*`` functions are verbatim copies of the code that each widened or
converted q before ``specpair.qlaw`` existed (vllm/remote.py ``dense_logq``, the V1
and V2 writers, the drafter engine, the loopback drafter, wire/assemble.py)."""

from __future__ import annotations

import pytest
import torch

from specpair import qlaw
from specpair.draft import DraftMode, propose
from specpair.errors import InvalidProposal
from specpair.proposal import QKind
from specpair.qlaw import Drafts
from specpair.sampling import SamplingParams

K = 3


def _former_dense_logq(d: Drafts, vocab_size: int) -> torch.Tensor:  # vllm/remote.py
    k = int(d.tokens.numel())
    if d.kind == QKind.POINT_MASS:
        out = torch.full((k, vocab_size), float("-inf"), dtype=torch.float64)
        out.scatter_(1, d.tokens.view(k, 1), 0.0)
        return out.float()
    lq = d.q_logp.double()
    if d.kind == QKind.SPARSE:
        valid = d.q_ids >= 0
        lq = torch.where(valid, lq, float("-inf"))
        full = torch.full((k, vocab_size), float("-inf"), dtype=torch.float64)
        full.scatter_(1, torch.where(valid, d.q_ids, d.q_ids[:, :1]), torch.where(
            valid, lq, lq[:, :1]))
        lq = full
    elif lq.shape[1] < vocab_size:
        pad = torch.full((k, vocab_size - lq.shape[1]), float("-inf"), dtype=torch.float64)
        lq = torch.cat([lq, pad], dim=1)
    lq = lq - torch.logsumexp(lq, dim=1, keepdim=True)
    return lq.float()


def _former_v1(d: Drafts, vocab_size: int) -> torch.Tensor:  # vllm/v1.py propose_remote
    probs = torch.zeros(1, K, vocab_size, dtype=torch.float32)
    probs[0, : d.depth] = _former_dense_logq(d, vocab_size).exp()
    return probs[0, : d.depth]


def _former_v2(d: Drafts, vocab_size: int, t: float) -> torch.Tensor:  # write_draft_logits
    lq = _former_dense_logq(d, vocab_size)[:, :vocab_size]
    return torch.where(torch.isfinite(lq), lq * t, float("-inf"))


def _former_sparse_widen(d: Drafts, vocab_size: int) -> torch.Tensor:  # drafter engine
    valid = d.q_ids >= 0
    safe = torch.where(valid, d.q_ids, d.q_ids[:, :1])
    vals = torch.where(valid, d.q_logp, d.q_logp[:, :1])
    return torch.full((d.depth, vocab_size), float("-inf")).scatter_(1, safe, vals)


def _former_assemble(d: Drafts, vocab_size: int) -> torch.Tensor:  # wire/assemble.py
    out = torch.full((d.depth, vocab_size), float("-inf"))
    valid = d.q_ids >= 0
    k_idx = torch.arange(d.depth).unsqueeze(1).expand_as(d.q_ids)
    out[k_idx[valid], d.q_ids[valid]] = d.q_logp[valid]
    return out


def _laws(vocab_size: int, seed: int) -> list[Drafts]:
    """SPARSE with ragged supports, SPARSE without padding, DENSE full and short, POINT_MASS,
    the weights as a drafter ships them (fp32 log-softmax: normalized only to ~1e-7)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in sorted({1, 7, min(64, vocab_size), vocab_size // 3}):
        ids = torch.stack([torch.randperm(vocab_size, generator=g)[:s] for _ in range(K)])
        lp = torch.log_softmax(torch.randn(K, s, generator=g) * 3, -1)
        cut = torch.randint(1, s + 1, (K,), generator=g)  # valid ids per row; -1 after
        pad = torch.arange(s) >= cut.unsqueeze(1)
        lp = torch.where(pad, float("-inf"), lp)
        lp = lp - torch.logsumexp(lp, -1, keepdim=True)  # fp32 renormalized, as drawn from
        tokens = ids[torch.arange(K), torch.zeros(K, dtype=torch.int64)]
        out.append(Drafts(tokens, QKind.SPARSE, lp, ids.masked_fill(pad, -1)))
        out.append(Drafts(tokens, QKind.SPARSE, torch.log_softmax(torch.randn(K, s,
                                                                              generator=g), -1),
                          ids))
    dense = torch.log_softmax(torch.randn(K, vocab_size, generator=g) * 2, -1)
    dense[:, :5] = float("-inf")
    tokens = torch.tensor([7, 8, 9])
    out.append(Drafts(tokens, QKind.DENSE, dense, None))
    out.append(Drafts(tokens, QKind.DENSE, dense[:, : vocab_size - 3].contiguous(), None))
    out.append(Drafts(tokens, QKind.POINT_MASS, None, None))
    return out


@pytest.mark.parametrize("vocab_size", [16, 129, 4099, 129280])
def test_every_form_is_bit_identical_to_the_former_formulas(vocab_size):
    buf = torch.full((2, K, vocab_size), 7.0)  # a caller's buffer holding stale values
    for seed in range(3 if vocab_size < 10_000 else 1):  # the real V = 129280: one draw
        for d in _laws(vocab_size, seed):
            want = _former_dense_logq(d, vocab_size)
            assert torch.equal(qlaw.logq(d, vocab_size), want), d.kind
            assert torch.equal(qlaw.logq(d, vocab_size, out=buf[0]), want)
            assert torch.equal(qlaw.probs(d, vocab_size, out=buf[1]), _former_v1(d, vocab_size))
            assert torch.equal(qlaw.probs(d, vocab_size), _former_v1(d, vocab_size))
            for t in (0.3, 1.0, 1.7):
                got = qlaw.scaled_logits(d, vocab_size, t, out=buf[1])
                assert torch.equal(got, _former_v2(d, vocab_size, t))
            if d.kind == QKind.SPARSE:
                wide = qlaw.widen(d, vocab_size)
                assert torch.equal(wide, _former_sparse_widen(d, vocab_size))
                assert torch.equal(wide, _former_assemble(d, vocab_size))
                assert torch.equal(qlaw.widen(d, vocab_size, out=buf[0]), wide)


@pytest.mark.parametrize("vocab_size", [16, 4099, 129280])
def test_sparse_probs_is_the_law_of_probs_at_the_support_only(vocab_size):
    """V1's sparse q rows: scattered, equal to ``probs`` within 1 fp32 ulp (the logsumexp
    sums the support alone), 0 off the support, and the ids returned clear them back to 0."""
    for d in _laws(vocab_size, 0):
        if d.kind != QKind.SPARSE:
            continue
        buf = torch.zeros(d.depth, vocab_size)
        ids, q = qlaw.sparse_probs(d.q_logp, d.q_ids)
        buf.scatter_(1, ids, q)
        want = qlaw.probs(d, vocab_size)
        assert torch.equal(buf == 0, want == 0)
        torch.testing.assert_close(buf, want, rtol=2**-23, atol=0)
        assert torch.equal(buf.sum(1).double().round(decimals=5), torch.ones(d.depth).double())
        buf.scatter_(1, ids, 0.0)
        assert not buf.any()


def test_loopback_widening_is_unchanged():
    from wire_loopback import TrivialDrafter, trivial_hello

    from specpair.wire.frames import ProposeItem, RequestParams

    hello = trivial_hello(500, kind=QKind.DENSE)
    drafter = TrivialDrafter(hello)
    it = ProposeItem(1, torch.tensor([4, 5]), 0, 2, K, RequestParams(1.0, 0, 1.0, 3), None)
    got = drafter._item(it)
    rows = [drafter.law(1, 2 + k) for k in range(K)]
    ids, lp = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    want = torch.full((K, 500), float("-inf")).scatter_(1, ids, lp)  # the former scatter
    assert got.kind == QKind.DENSE and torch.equal(got.q_logp, want)


def test_logq_agrees_with_the_core_proposal():
    v = 16
    g = torch.Generator().manual_seed(3)
    params = SamplingParams.make(2, temperature=0.8, top_k=5, top_p=1.0, seed=11)
    logits = torch.randn(2, v, generator=g)
    prop = propose(logits, lambda d, k: torch.randn(2, v, generator=g), params,
                   torch.tensor([4, 9]), K, DraftMode.SAMPLED, 0)
    want = qlaw.proposal_logq(prop).float() if prop.kind == QKind.DENSE else None
    for b in range(2):
        ids = prop.q_ids[b] if prop.kind == QKind.SPARSE else None
        d = Drafts(prop.tokens[b], prop.kind, prop.q_logp[b], ids)
        lq = qlaw.logq(d, v + 4)  # padded to a larger target vocabulary
        assert torch.allclose(lq.exp().sum(-1), torch.ones(K))
        assert torch.isinf(lq[:, v:]).all()
        at = lq.gather(1, prop.tokens[b].view(K, 1)).squeeze(1).double()
        assert torch.allclose(at, qlaw.draft_logq(prop)[b], atol=1e-5)
        assert (torch.isfinite(lq).sum(-1) <= (5 if prop.kind == QKind.SPARSE else v)).all()
        if want is not None:
            assert torch.allclose(lq[:, :v], want[b], atol=1e-6)
    pm = Drafts(torch.tensor([3, 1, 2]), QKind.POINT_MASS, None, None)
    assert qlaw.probs(pm, v)[torch.arange(3), torch.tensor([3, 1, 2])].eq(1).all()


def test_scaled_logits_read_back_as_q_and_misshapen_drafts_are_refused():
    d = _laws(32, 0)[0]
    lq = qlaw.logq(d, 32)
    assert torch.allclose(torch.softmax(qlaw.scaled_logits(d, 32, 0.5) / 0.5, -1), lq.exp(),
                          atol=1e-6)
    with pytest.raises(AssertionError):
        qlaw.scaled_logits(d, 32, 0.0)  # greedy: V2's verifier does not read q
    with pytest.raises(InvalidProposal):
        Drafts(torch.tensor([1, 2]), QKind.SPARSE, torch.zeros(2, 3), None)
    with pytest.raises(InvalidProposal):
        Drafts(torch.tensor([1, 2]), QKind.DENSE, torch.zeros(3, 8), None)
    with pytest.raises(InvalidProposal):
        Drafts(torch.zeros(0, dtype=torch.int64), QKind.POINT_MASS, None, None)
