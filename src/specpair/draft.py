"""The sampled speculator: K autoregressive draft steps, each drawing d ~ q.

At every step the speculator

1. turns the draft model's logits into the exact law q with the request's
   sampling params (``specpair.sampling.process_logits``), optionally
   truncated further by the drafter's own ``draft_top_k``;
2. encodes q as it will be shipped (fp32 log q: SPARSE when every row is
   truncated, DENSE otherwise; POINT_MASS only in declared GREEDY mode);
3. draws d from exactly those shipped values, by inverse CDF on the DRAFT
   stream's uniform at the draft's absolute position;
4. feeds d back to the model for the next step (step k+1 conditions on d_k).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from enum import IntEnum

import torch

from specpair.proposal import Proposal, QKind
from specpair.rng import Stream, uniform
from specpair.sampling import SamplingParams, process_logits, sample_from_logp, truncated_law

__all__ = ["DraftMode", "draft_step", "propose", "with_draft_top_k"]

# next_logits(d_k [B] int64, k) -> logits [B, V] of step k+1 given d_k (k = 1..K-1)
NextLogits = Callable[[torch.Tensor, int], torch.Tensor]


class DraftMode(IntEnum):
    """What the drafter declares in its HELLO. Values are wire codes."""

    SAMPLED = 1  # drafts are draws d ~ q; q travels with them
    GREEDY = 2  # drafts are argmax; q is the point mass (POINT_MASS)


def with_draft_top_k(params: SamplingParams, draft_top_k: int) -> SamplingParams:
    """The params of the law a drafter with ``--draft-top-k`` draws from: each row's top_k
    made min(top_k, draft_top_k), 0 (no top-k) counting as unbounded; ``draft_top_k`` 0:
    ``params`` unchanged."""
    if draft_top_k <= 0:
        return params
    k = params.top_k
    k = torch.where((k == 0) | (k > draft_top_k), torch.full_like(k, draft_top_k), k)
    return replace(params, top_k=k)


def draft_step(
    logits: torch.Tensor,  # [B, V] draft logits at this step
    params: SamplingParams,
    position: torch.Tensor,  # [B] int64 absolute position of the token being drafted
    mode: DraftMode = DraftMode.SAMPLED,
    draft_top_k: int = 0,
) -> tuple[torch.Tensor, QKind, torch.Tensor | None, torch.Tensor | None]:
    """One draft step: (tokens [B], kind, q_logp [B, S|V] fp32 | None, q_ids [B, S] | None)."""
    assert logits.ndim == 2 and logits.shape[0] == params.batch, tuple(logits.shape)
    if mode == DraftMode.GREEDY:
        return _step(logits, params, None, mode, False)
    eff = with_draft_top_k(params, draft_top_k)
    return _step(logits, eff, uniform(params.seed, position, Stream.DRAFT), mode, _sparse(eff))


def _sparse(eff: SamplingParams) -> bool:
    """Whether every row's law is truncated or greedy: q then travels SPARSE."""
    return bool((eff.truncated() | eff.greedy).all())


def _argmax_law(eff: SamplingParams) -> bool:
    """Whether every row is greedy without top-p: ``truncated_law`` is then the support
    {argmax} with log q 0 ([B, 1]), and every draw from it is the argmax, whatever its
    uniform."""
    return bool(eff.greedy.all()) and not bool((eff.top_p < 1).any())


def _step(logits: torch.Tensor, eff: SamplingParams, u: torch.Tensor | None, mode: DraftMode,
          sparse: bool) -> tuple[torch.Tensor, QKind, torch.Tensor | None, torch.Tensor | None]:
    """``draft_step`` with what depends only on the params (``eff``: draft_top_k applied,
    ``sparse``) and the DRAFT uniforms ``u`` [B] computed by the caller, once per round
    (None where no draw needs them: GREEDY mode, or ``_argmax_law``)."""
    if mode == DraftMode.GREEDY:
        return logits.argmax(dim=-1), QKind.POINT_MASS, None, None
    if u is None:  # _argmax_law: the same tensors as truncated_law's and the draw's
        d = logits.argmax(dim=-1)
        return d, QKind.SPARSE, torch.zeros((d.shape[0], 1), dtype=torch.float32), d.unsqueeze(1)
    if sparse:
        vals, ids = truncated_law(logits, eff)  # [B, S] fp32 log q, int64 ids (-1 pad)
        col = sample_from_logp(vals, u)
        return ids.gather(1, col.unsqueeze(1)).squeeze(1), QKind.SPARSE, vals, ids
    logq = process_logits(logits, eff)  # [B, V] fp32, -inf outside the support
    return sample_from_logp(logq, u), QKind.DENSE, logq, None


def _stack_padded(rows: list[torch.Tensor], fill: float | int) -> torch.Tensor:
    width = max(r.shape[-1] for r in rows)
    padded = [torch.nn.functional.pad(r, (0, width - r.shape[-1]), value=fill) for r in rows]
    return torch.stack(padded, dim=1)


def propose(
    first_logits: torch.Tensor,  # [B, V] draft logits for the first draft position
    next_logits: NextLogits,
    params: SamplingParams,
    position: torch.Tensor,  # [B] int64 absolute position of the first draft token
    depth: int,
    mode: DraftMode = DraftMode.SAMPLED,
    draft_top_k: int = 0,
) -> Proposal:
    """Draft ``depth`` tokens autoregressively and return them with their laws."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    tokens, kinds, logps, idss = [], [], [], []  # per step
    logits = first_logits
    # What does not change from step to step is derived once per round: the effective params,
    # the encoding, and every step's DRAFT uniforms (one Philox pass over [B, depth]; each
    # value is the pure function of (seed, position) that draft_step would compute).
    eff = with_draft_top_k(params, draft_top_k)
    sparse = mode != DraftMode.GREEDY and _sparse(eff)
    u = None if mode == DraftMode.GREEDY or _argmax_law(eff) else uniform(
        params.seed.unsqueeze(1), position.unsqueeze(1) + torch.arange(depth), Stream.DRAFT)
    for k in range(depth):
        assert logits.ndim == 2 and logits.shape[0] == params.batch, tuple(logits.shape)
        d, kind, q_logp, q_ids = _step(logits, eff, None if u is None else u[:, k], mode, sparse)
        tokens.append(d)
        kinds.append(kind)
        logps.append(q_logp)
        idss.append(q_ids)
        if k + 1 < depth:
            logits = next_logits(d, k + 1)
    present = torch.ones(params.batch, dtype=torch.bool)
    toks = torch.stack(tokens, dim=1)
    # The encoding depends only on the params, so every step has the same kind.
    if kinds[0] == QKind.POINT_MASS:
        return Proposal(toks, QKind.POINT_MASS, None, None, present)
    if kinds[0] == QKind.SPARSE:
        return Proposal(toks, QKind.SPARSE, _stack_padded(logps, float("-inf")),
                        _stack_padded(idss, -1), present)
    return Proposal(toks, QKind.DENSE, torch.stack(logps, dim=1), None, present)
