"""Offline replay: what sampled drafting buys over greedy drafting at a fixed depth.

Per round r and draft position k (laws built with the recording's params,
``specpair.sampling.process_logits``: p from the target, q from the drafter):

- sampled drafting (d ~ q): position k is accepted with probability
  a_k = sum_v min(p_k(v), q_k(v))  (Leviathan et al. 2023, Algorithm 1);
- greedy drafting (d = argmax q, point-mass q): a_k = p_k(argmax q_k).

Drafts are accepted in order until the first rejection, so the expected
accepted drafts of a round at depth K are sum_{k=1..K} prod_{j<=k} a_j, and
committed tokens per round are 1 + accepted (one recovered or bonus token).
Position k's law is the recorded one, i.e. conditioned on the recorded prefix.

``monte_carlo`` instead runs the core's ``propose`` and ``verify`` on the
recorded logits, as a check of the closed form. Intervals come from a seeded
bootstrap over rounds (percentile, 95%).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specpair.draft import DraftMode, propose, with_draft_top_k
from specpair.replay.format import Recording
from specpair.sampling import SamplingParams, process_logits
from specpair.verify import verify

__all__ = ["Comparison", "ReplayResult", "acceptance", "expected_accepted", "monte_carlo",
           "replay", "MAX_BOOTSTRAP", "MAX_TRIALS", "MAX_ELEMENTS"]

MAX_BOOTSTRAP = 100_000  # bootstrap resamples
MAX_BOOTSTRAP_DRAWS = 1 << 27  # resamples x rounds: the index array (int64, 1 GiB)
MAX_TRIALS = 100_000  # Monte Carlo trials per round
MAX_ELEMENTS = 1 << 24  # logits of one Monte Carlo batch; one round's trials must fit


@dataclass(frozen=True)
class Comparison:
    """Greedy vs sampled on one per-round quantity, with bootstrap intervals."""

    greedy: float  # mean over rounds, greedy drafting
    sampled: float  # mean over rounds, sampled drafting
    diff: float  # sampled - greedy
    diff_ci: tuple[float, float]  # 95% bootstrap interval of diff
    rel_pct: float  # 100 * (sampled / greedy - 1)
    rel_ci_pct: tuple[float, float]  # 95% bootstrap interval of rel_pct


@dataclass(frozen=True)
class ReplayResult:
    """The replay of one recording."""

    method: str  # "exact" or "monte-carlo" (trials per round in `trials`)
    trials: int  # Monte Carlo trials per round (0 for exact)
    rounds: int  # R
    depth: int  # K used (<= recorded depth)
    vocab: int  # V
    params: dict[str, float | int]  # temperature, top_k, top_p
    accepted: Comparison  # accepted drafts per round
    committed: Comparison  # committed tokens per round (1 + accepted)
    reach_greedy: tuple[float, ...]  # [K] mean P(draft k accepted), greedy
    reach_sampled: tuple[float, ...]  # [K] mean P(draft k accepted), sampled
    alpha_greedy: tuple[float, ...]  # [K] mean per-position acceptance a_k, greedy
    alpha_sampled: tuple[float, ...]  # [K] mean per-position acceptance a_k, sampled
    bootstrap: int  # resamples
    seed: int  # bootstrap (and Monte Carlo) seed


def _params(rec: Recording, n: int) -> SamplingParams:
    return SamplingParams.make(n, rec.temperature, rec.top_k, rec.top_p)


def acceptance(rec: Recording, depth: int, draft_top_k: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position acceptance a[r, k] ([R, depth] float64): (greedy, sampled); with
    ``draft_top_k``, q is the law of a drafter serving with ``--draft-top-k`` (its own top k,
    ``specpair.draft.with_draft_top_k``), p the request's as recorded."""
    params = _params(rec, rec.rounds)
    p = process_logits(rec.target_logits[:, :depth], params).double().exp()  # [R, K, V]
    q = process_logits(rec.draft_logits[:, :depth],
                       with_draft_top_k(params, draft_top_k)).double().exp()  # [R, K, V]
    sampled = torch.minimum(p, q).sum(dim=-1)
    greedy = p.gather(2, q.argmax(dim=-1, keepdim=True)).squeeze(2)
    return greedy, sampled


def expected_accepted(alpha: torch.Tensor) -> torch.Tensor:
    """[R] expected accepted drafts from per-position acceptance [R, K]."""
    return alpha.cumprod(dim=1).sum(dim=1)


def monte_carlo(rec: Recording, depth: int, mode: DraftMode, trials: int, seed: int,
                max_elements: int = MAX_ELEMENTS) -> torch.Tensor:
    """[R] mean accepted drafts per round over ``trials`` runs of propose + verify.

    Trial t of round r uses seed ``seed * 1_000_003 + r * trials + t``; rounds
    are batched so that one batch holds at most ``max_elements`` logits.
    """
    v = rec.vocab
    chunk = max(1, max_elements // (trials * (depth + 1) * v))
    out = []
    for start in range(0, rec.rounds, chunk):
        rs = range(start, min(rec.rounds, start + chunk))
        n = len(rs) * trials
        params = SamplingParams.make(n, rec.temperature, rec.top_k, rec.top_p,
                                     seed=[seed * 1_000_003 + r * trials + t
                                           for r in rs for t in range(trials)])
        draft = rec.draft_logits[rs.start:rs.stop, :depth].repeat_interleave(trials, dim=0)
        target = rec.target_logits[rs.start:rs.stop, :depth + 1].repeat_interleave(trials, dim=0)
        position = torch.zeros(n, dtype=torch.int64)
        prop = propose(draft[:, 0], lambda d, k, draft=draft: draft[:, k], params, position,
                       depth, mode)
        acc = verify(target, prop, params, position).num_accepted.double()
        out.append(acc.reshape(len(rs), trials).mean(dim=1))
    return torch.cat(out)


def _compare(g: np.ndarray, s: np.ndarray, idx: np.ndarray, offset: float) -> Comparison:
    gm, sm = g.mean() + offset, s.mean() + offset
    gb, sb = g[idx].mean(axis=1) + offset, s[idx].mean(axis=1) + offset
    diff = np.percentile(sb - gb, [2.5, 97.5])
    rel = np.percentile(100 * (sb / gb - 1), [2.5, 97.5])
    return Comparison(float(gm), float(sm), float(sm - gm), (float(diff[0]), float(diff[1])),
                      float(100 * (sm / gm - 1)), (float(rel[0]), float(rel[1])))


def replay(rec: Recording, depth: int | None = None, bootstrap: int = 10_000, seed: int = 0,
           trials: int = 0) -> ReplayResult:
    """Greedy vs sampled drafting on a recording (exact, or Monte Carlo with ``trials``)."""
    depth = rec.depth if depth is None else depth
    if not 1 <= depth <= rec.depth:
        raise ValueError(f"depth must be in 1..{rec.depth} (the recorded depth), got {depth}")
    if not 100 <= bootstrap <= MAX_BOOTSTRAP:
        raise ValueError(f"bootstrap needs 100..{MAX_BOOTSTRAP} resamples, got {bootstrap}")
    if bootstrap * rec.rounds > MAX_BOOTSTRAP_DRAWS:
        raise ValueError(f"{bootstrap} resamples of {rec.rounds} rounds exceed "
                         f"{MAX_BOOTSTRAP_DRAWS} draws; ask for fewer resamples")
    if not 0 <= trials <= MAX_TRIALS:
        raise ValueError(f"Monte Carlo trials must lie in 0..{MAX_TRIALS}, got {trials}")
    if trials * (depth + 1) * rec.vocab > MAX_ELEMENTS:
        raise ValueError(f"{trials} Monte Carlo trials x (K + 1 = {depth + 1}) x V = {rec.vocab} "
                         f"exceed {MAX_ELEMENTS} logits per round; ask for fewer trials")
    ag, as_ = acceptance(rec, depth)
    if trials > 0:
        g = monte_carlo(rec, depth, DraftMode.GREEDY, trials, seed).numpy()
        s = monte_carlo(rec, depth, DraftMode.SAMPLED, trials, seed).numpy()
    else:
        g, s = expected_accepted(ag).numpy(), expected_accepted(as_).numpy()
    idx = np.random.default_rng(seed).integers(0, rec.rounds, size=(bootstrap, rec.rounds))
    return ReplayResult(
        method="monte-carlo" if trials > 0 else "exact", trials=trials, rounds=rec.rounds,
        depth=depth, vocab=rec.vocab,
        params={"temperature": rec.temperature, "top_k": rec.top_k, "top_p": rec.top_p},
        accepted=_compare(g, s, idx, 0.0), committed=_compare(g, s, idx, 1.0),
        reach_greedy=tuple(ag.cumprod(dim=1).mean(dim=0).tolist()),
        reach_sampled=tuple(as_.cumprod(dim=1).mean(dim=0).tolist()),
        alpha_greedy=tuple(ag.mean(dim=0).tolist()), alpha_sampled=tuple(as_.mean(dim=0).tolist()),
        bootstrap=bootstrap, seed=seed)
