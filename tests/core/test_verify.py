"""The reference verifier: missing q, greedy exactness, determinism, exact output law."""

import pytest
import torch

from specpair.draft import DraftMode, propose
from specpair.errors import InvalidProposal, MissingDraftLaw
from specpair.proposal import Proposal, QKind
from specpair.sampling import SamplingParams
from specpair.verify import verify


def _case(b, k, v, temp=1.0, seed=0, anti=False, mode=DraftMode.SAMPLED, draft_top_k=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(1, k + 1, v, generator=g) * 2
    draft = -target[:, :k] if anti else target[:, :k] + torch.randn(1, k, v, generator=g)
    params = SamplingParams.make(b, temp, seed=list(range(100, 100 + b)))
    pos = torch.full((b,), 40)
    prop = propose(draft[:, 0].expand(b, -1), lambda d, j: draft[:, j].expand(b, -1),
                   params, pos, k, mode=mode, draft_top_k=draft_top_k)
    return target.expand(b, -1, -1), prop, params, pos


def test_missing_q_is_refused_by_default():
    target, prop, params, pos = _case(3, 2, 16)
    prop = prop.with_missing(torch.tensor([False, True, False]))
    with pytest.raises(MissingDraftLaw, match=r"\[1\]"):
        verify(target, prop, params, pos)


def test_missing_q_dropped_gives_a_target_only_step():
    n, v = 40_000, 8
    target, prop, params, pos = _case(n, 3, v, anti=True)
    prop = prop.with_missing(torch.ones(n, dtype=torch.bool))
    out = verify(target, prop, params, pos, on_missing="drop")
    assert bool(out.dropped.all()) and bool((out.num_accepted == 0).all())
    assert bool((out.tokens[:, 1:] == -1).all())
    # position 1 is exactly the target's law, not a point-mass verification
    p = torch.softmax(target[0, 0].double(), -1)
    obs = torch.bincount(out.tokens[:, 0], minlength=v).double()
    chi2 = ((obs - n * p) ** 2 / (n * p)).sum().item()
    assert chi2 < 40.5  # df = 7; chi2.isf(1e-6, 7) = 40.5


def test_greedy_requests_use_exact_argmax_matching():
    b, k, v = 6, 4, 50
    target, prop, params, pos = _case(b, k, v, temp=0.0)
    # make the second draft of every request wrong on purpose
    argmax = target.argmax(-1)
    drafts = argmax[:, :k].clone()
    drafts[:, 1] = (drafts[:, 1] + 1) % v
    ids = drafts.unsqueeze(2)
    prop = Proposal(drafts, QKind.SPARSE, torch.zeros(b, k, 1), ids, torch.ones(b, dtype=bool))
    out = verify(target, prop, params, pos)
    assert out.num_accepted.tolist() == [1] * b
    assert torch.equal(out.tokens[:, :2], argmax[:, :2])
    # no randomness: other seeds give the same result
    params2 = SamplingParams.make(b, 0.0, seed=list(range(b)))
    assert torch.equal(verify(target, prop, params2, pos).tokens, out.tokens)


def test_same_seeds_same_tokens_whatever_the_batch_order():
    target, prop, params, pos = _case(64, 3, 40, anti=True, draft_top_k=8)
    out = verify(target, prop, params, pos)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    pprop = Proposal(prop.tokens[perm], prop.kind, prop.q_logp[perm], prop.q_ids[perm],
                     prop.present[perm])
    pparams = params.select(perm)
    out_p = verify(target[perm], pprop, pparams, pos[perm])
    assert torch.equal(out_p.tokens, out.tokens[perm])
    # one request alone: the same tokens again
    one = verify(target[:1], Proposal(prop.tokens[:1], prop.kind, prop.q_logp[:1],
                                      prop.q_ids[:1], prop.present[:1]),
                 params.select(torch.tensor([0])), pos[:1])
    assert torch.equal(one.tokens[0], out.tokens[0])


def test_zero_q_for_a_drafted_token_is_invalid():
    target, prop, params, pos = _case(2, 2, 16)
    bad = prop.q_logp.clone()
    bad[0, 1, prop.tokens[0, 1]] = float("-inf")
    with pytest.raises(InvalidProposal, match="q\\(d\\) = 0"):
        verify(target, Proposal(prop.tokens, QKind.DENSE, bad, None, prop.present), params, pos)


def test_identical_p_and_q_accept_everything():
    b, k, v = 500, 4, 30
    g = torch.Generator().manual_seed(3)
    target = torch.randn(1, k + 1, v, generator=g).expand(b, -1, -1)
    params = SamplingParams.make(b, 1.0, seed=list(range(b)))
    pos = torch.zeros(b, dtype=torch.int64)
    prop = propose(target[:, 0], lambda d, j: target[:, j], params, pos, k)
    out = verify(target, prop, params, pos)
    assert bool((out.num_accepted == k).all())


@pytest.mark.parametrize("mode,draft_top_k", [(DraftMode.SAMPLED, 0), (DraftMode.SAMPLED, 3),
                                              (DraftMode.GREEDY, 0)])
def test_emitted_tokens_follow_the_target(mode, draft_top_k):
    n, k, v = 60_000, 2, 8
    target, prop, params, pos = _case(n, k, v, anti=True, mode=mode, draft_top_k=draft_top_k)
    out = verify(target, prop, params, pos)
    for j in range(k + 1):
        reached = out.num_accepted >= j
        obs = torch.bincount(out.tokens[reached, j], minlength=v).double()
        e = torch.softmax(target[0, j].double(), -1) * obs.sum()
        chi2 = ((obs - e) ** 2 / e).sum().item()
        assert chi2 < 40.5, (j, chi2)  # df = 7, alpha 1e-6


def test_shape_mismatch_is_reported():
    target, prop, params, pos = _case(2, 2, 16)
    with pytest.raises(AssertionError, match="target_logits"):
        verify(target[:, :2], prop, params, pos)
    with pytest.raises(InvalidProposal, match="16 columns, vocab is 20"):
        verify(torch.nn.functional.pad(target, (0, 4)), prop, params, pos)
    with pytest.raises(InvalidProposal, match=r"lie in \[0, 8\)"):
        verify(target[..., :8], prop, params, pos)
