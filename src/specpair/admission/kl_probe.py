"""KL probe: is the q a drafter ships the q its own logits and params define?

The probe recomputes q from the same draft logits and sampling params with
``specpair.sampling.process_logits`` (the drafter's ``draft_top_k`` applied by
``specpair.draft.with_draft_top_k``: top_k = min(top_k, draft_top_k), 0 = unset)
and compares it with the shipped q, both renormalized in float64:

- KL(q_recomputed || q_shipped) <= ``KL_MAX`` (1e-8 nats) per row, and
- max |log q_recomputed - log q_shipped| <= ``LOG_RATIO_MAX`` (1e-4) over the
  union of both supports (a support mismatch is an infinite ratio).

Why these numbers: recomputing fp32 log-softmax with another reduction order
moves log q by a few FP32 ulps (about 2e-6 at |log q| = 20), far below 1e-4;
q rounded to BF16 after sampling moves it by up to 2^-9 relative (log ratio
~4e-3, KL ~1e-6), and a wrong temperature or truncation moves it by orders of
magnitude more. Both bounds must hold: KL alone under-weights rare tokens, the
ratio alone ignores mass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specpair import qlaw
from specpair.draft import with_draft_top_k
from specpair.sampling import SamplingParams, process_logits

__all__ = ["KL_MAX", "LOG_RATIO_MAX", "KlRow", "KlVerdict", "kl_probe"]

KL_MAX = 1e-8  # nats, per row
LOG_RATIO_MAX = 1e-4  # per token, over the union of supports


@dataclass(frozen=True)
class KlRow:
    """The comparison on one draft position."""

    row: int  # row of the input
    kl: float  # KL(q_recomputed || q_shipped) in nats (inf: shipped misses support)
    max_abs_log_ratio: float  # over the union of supports (inf: supports differ)
    support_mismatch: int  # tokens in exactly one of the two supports
    ok: bool  # both thresholds hold


@dataclass(frozen=True)
class KlVerdict:
    """The probe's verdict over all rows."""

    passed: bool  # every row ok
    kl_max: float  # threshold used (KL_MAX)
    log_ratio_max: float  # threshold used (LOG_RATIO_MAX)
    worst_kl: float  # largest row KL
    worst_log_ratio: float  # largest row max |log ratio|
    rows: tuple[KlRow, ...]  # per row
    reasons: tuple[str, ...]  # one per failing row (empty when passed)


def _dense(q_logp: torch.Tensor, q_ids: torch.Tensor | None, v: int) -> torch.Tensor:
    """[N, V] float64 normalized shipped log q (the q-law's widening and renormalization)."""
    if q_ids is None:
        assert q_logp.shape[-1] == v, f"dense q has width {q_logp.shape[-1]}, vocabulary {v}"
    else:
        if q_ids.shape != q_logp.shape or q_ids.dtype != torch.int64:
            raise ValueError(f"q_ids must be int64 with the shape of q_logp "
                             f"{tuple(q_logp.shape)}; got {q_ids.dtype} {tuple(q_ids.shape)}")
        if bool((q_ids >= v).any() | (q_ids < -1).any()):
            raise ValueError(f"q_ids outside the vocabulary [0, {v})")
        if bool((q_ids[:, 0] < 0).any()):
            raise ValueError("a sparse row of q has no support id (padding -1 comes last)")
    out = torch.empty((q_logp.shape[0], v), dtype=torch.float64)
    return qlaw.renormalize_(qlaw.widen_rows(q_logp.double(), q_ids, out))


def kl_probe(
    logits: torch.Tensor,  # [N, V] the draft logits the drafter sampled from
    params: SamplingParams,  # [N] the request params of each row
    q_logp: torch.Tensor,  # [N, V] dense or [N, S] sparse shipped log q (-inf = excluded)
    q_ids: torch.Tensor | None = None,  # [N, S] int64 support ids (-1 pad) when sparse
    draft_top_k: int = 0,  # the drafter's own truncation (0: none)
) -> KlVerdict:
    """Compare shipped q with q recomputed from ``logits`` and ``params``."""
    assert logits.ndim == 2 and logits.shape[0] == params.batch, tuple(logits.shape)
    assert q_logp.ndim == 2 and q_logp.shape[0] == logits.shape[0], tuple(q_logp.shape)
    params = with_draft_top_k(params, draft_top_k)
    ref = qlaw.renormalize_(process_logits(logits, params).double())
    ship = _dense(q_logp, q_ids, logits.shape[1])
    in_ref, in_ship = torch.isfinite(ref), torch.isfinite(ship)
    mismatch = (in_ref ^ in_ship).sum(dim=-1)
    both = in_ref & in_ship
    diff = torch.where(both, ref - ship, 0.0)
    kl = (torch.where(both, ref.exp() * diff, 0.0)).sum(dim=-1)
    kl = torch.where((in_ref & ~in_ship).any(dim=-1), float("inf"), kl)
    ratio = torch.where(mismatch > 0, float("inf"), diff.abs().amax(dim=-1))
    rows, reasons = [], []
    for i in range(logits.shape[0]):
        ok = float(kl[i]) <= KL_MAX and float(ratio[i]) <= LOG_RATIO_MAX
        rows.append(KlRow(i, float(kl[i]), float(ratio[i]), int(mismatch[i]), ok))
        if not ok:
            reasons.append(f"row {i}: KL {float(kl[i]):.3g} (max {KL_MAX:g}), max |log ratio| "
                           f"{float(ratio[i]):.3g} (max {LOG_RATIO_MAX:g}), "
                           f"{int(mismatch[i])} tokens in only one support")
    return KlVerdict(not reasons, KL_MAX, LOG_RATIO_MAX, float(kl.max()), float(ratio.max()),
                     tuple(rows), tuple(reasons))
