"""The q-law: one request's drafts and the exact law q of each, from the wire to the verifiers.

A drafter ships q per draft position in one of three encodings (``specpair.proposal``):
SPARSE (support ids + log q), DENSE (log q over the vocabulary, or a prefix of it;
-inf = excluded) or POINT_MASS (declared greedy drafts only). This module is the one
place that

- widens them to log q over the whole vocabulary [k, V], -inf outside the support,
  with exactly the shipped values (``widen``);
- renormalizes a widened law in float64 (``renormalize_``: the drafter drew from the
  shipped fp32 values, which sum to 1 only within the wire's tolerance);
- writes the forms vLLM's verifiers read, into a buffer the caller may own:
  ``logq`` (normalized fp32 log q), ``probs`` (Model Runner V1: post-temperature
  probabilities q) and ``scaled_logits`` (Model Runner V2's ``draft_logits``:
  T * log q, which its verifier divides by T on load).

Every form is ``fp32(renormalize_(widen(q) in float64))`` followed by ``exp`` or ``* T``,
op for op what the overlay computed before this module existed: the bits are
unchanged (tests/core/test_qlaw.py holds the former formulas and compares).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specpair.errors import InvalidProposal
from specpair.proposal import Proposal, QKind

__all__ = ["Drafts", "widen", "widen_rows", "renormalize_", "logq", "probs", "sparse_probs",
           "scaled_logits", "proposal_logq", "draft_logq"]


@dataclass(frozen=True)
class Drafts:
    """One request's drafts and the law each was drawn from, in its wire encoding."""

    tokens: torch.Tensor  # [k] int64 drafted ids, k >= 1
    kind: QKind  # encoding of q, the same at every position
    q_logp: torch.Tensor | None  # SPARSE [k, S] / DENSE [k, W <= V] fp32 log q; None: POINT_MASS
    q_ids: torch.Tensor | None  # SPARSE [k, S] int64 support ids (-1 = padding, last); else None

    def __post_init__(self) -> None:
        t, lp, ids = self.tokens, self.q_logp, self.q_ids
        if t.ndim != 1 or t.dtype != torch.int64 or t.numel() == 0:
            raise InvalidProposal(f"tokens must be [k >= 1] int64, got {tuple(t.shape)} {t.dtype}")
        k = t.numel()
        if self.kind == QKind.POINT_MASS:
            if lp is not None or ids is not None:
                raise InvalidProposal("POINT_MASS carries no q tensors")
            return
        if lp is None or lp.dtype != torch.float32 or lp.ndim != 2 or lp.shape[0] != k:
            raise InvalidProposal(f"{self.kind.name} needs fp32 q_logp [{k}, *]")
        if self.kind == QKind.SPARSE and (ids is None or ids.shape != lp.shape
                                          or ids.dtype != torch.int64):
            raise InvalidProposal("SPARSE needs int64 q_ids with the shape of q_logp")
        if self.kind == QKind.DENSE and ids is not None:
            raise InvalidProposal("DENSE carries no q_ids")

    @property
    def depth(self) -> int:
        """k, the number of drafts."""
        return self.tokens.shape[0]

    def fits(self, vocab_size: int) -> bool:
        """Whether every id (drafts, support) lies in [0, V) and DENSE rows are <= V wide."""
        top = int(self.tokens.max())
        if self.kind == QKind.SPARSE:
            top = max(top, int(self.q_ids.max()))
        elif self.kind == QKind.DENSE and self.q_logp.shape[1] > vocab_size:
            return False
        return int(self.tokens.min()) >= 0 and top < vocab_size


def widen(d: Drafts, vocab_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[k, V] log q over the whole vocabulary, -inf outside the support, as shipped.

    Written into ``out`` ([k, V], fp32 or float64) when given, else into a new fp32
    tensor."""
    k = d.depth
    if out is None:
        out = torch.empty((k, vocab_size), dtype=torch.float32)
    assert out.shape == (k, vocab_size) and out.dtype in (torch.float32, torch.float64)
    if d.kind == QKind.POINT_MASS:
        return out.fill_(float("-inf")).scatter_(1, d.tokens.view(k, 1), 0.0)
    return widen_rows(d.q_logp, d.q_ids, out)


def widen_rows(q_logp: torch.Tensor, q_ids: torch.Tensor | None,
               out: torch.Tensor) -> torch.Tensor:
    """Rows of shipped log q widened into ``out`` [N, V] (fp32 or float64), -inf elsewhere.

    q_logp: [N, S] SPARSE with ``q_ids`` [N, S] int64 (-1 = padding, after at least one
    valid id), or [N, W <= V] DENSE (a prefix of the vocabulary) with ``q_ids`` None. A
    SPARSE row's padding rewrites its column 0's value at column 0's id, so one scatter
    serves every row whatever its support size."""
    n, v = out.shape
    assert q_logp.ndim == 2 and q_logp.shape[0] == n, (tuple(q_logp.shape), tuple(out.shape))
    if q_ids is None:
        if q_logp.shape[1] == v:
            return out.copy_(q_logp)
        assert q_logp.shape[1] < v, "DENSE q wider than the vocabulary"
        out.fill_(float("-inf"))
        out[:, : q_logp.shape[1]] = q_logp
        return out
    out.fill_(float("-inf"))
    valid = q_ids >= 0
    ids = torch.where(valid, q_ids, q_ids[:, :1])
    vals = torch.where(valid, q_logp, q_logp[:, :1])
    return out.scatter_(1, ids, vals.to(out.dtype))


def renormalize_(lq: torch.Tensor) -> torch.Tensor:
    """Shift each row of a float64 [..., V] log q in place so that its logsumexp is 0."""
    assert lq.dtype == torch.float64
    return lq.sub_(torch.logsumexp(lq, dim=-1, keepdim=True))


def logq(d: Drafts, vocab_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[k, V] fp32 normalized log q, -inf outside the support (into ``out`` when given)."""
    wide = renormalize_(widen(d, vocab_size, torch.empty((d.depth, vocab_size),
                                                         dtype=torch.float64)))
    if out is None:
        return wide.float()
    assert out.shape == wide.shape and out.dtype == torch.float32
    return out.copy_(wide)


def probs(d: Drafts, vocab_size: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[k, V] fp32 q = exp(log q): Model Runner V1's post-temperature draft probabilities."""
    lq = logq(d, vocab_size, out)
    return torch.exp(lq, out=lq)


def sparse_probs(q_logp: torch.Tensor, q_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SPARSE rows [N, S] (shipped log q, int64 ids, -1 = padding) to (ids, q) [N, S]: q =
    exp(log q) of each support id, for Model Runner V1's q rows written at the support only
    (the caller keeps them 0 elsewhere); padding repeats column 0's id and value.

    The law of ``probs``: log q renormalized in float64, cast to fp32, exponentiated. Only the
    logsumexp runs over the S support values instead of the widened row (whose other columns
    add exp(-inf) = 0), so a value may differ from ``probs``' in the last fp32 bit (another
    summation order; tests/core/test_qlaw.py bounds it)."""
    assert q_logp.shape == q_ids.shape and q_logp.ndim == 2 and q_ids.dtype == torch.int64
    valid = q_ids >= 0
    q = renormalize_(q_logp.to(torch.float64).masked_fill_(~valid, float("-inf"))).float().exp_()
    return torch.where(valid, q_ids, q_ids[:, :1]), torch.where(valid, q, q[:, :1])


def scaled_logits(d: Drafts, vocab_size: int, temperature: float,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """[k, V] fp32 T * log q, -inf outside the support: Model Runner V2's draft_logits rows.

    Its verifier divides them by the request's temperature T on load and so reads
    exactly log q. T must be > 0 (at T = 0 the verifier does not read q at all)."""
    assert temperature > 0.0 and math.isfinite(temperature)
    return logq(d, vocab_size, out).mul_(temperature)


def proposal_logq(p: Proposal) -> torch.Tensor:
    """A batch proposal's q_logp [B, K, S|V] in float64, each row renormalized (logsumexp 0):
    what the drafter's sampler drew from. A copy: the proposal is never changed."""
    assert p.q_logp is not None, "POINT_MASS carries no q"
    return renormalize_(p.q_logp.to(torch.float64, copy=True))


def draft_logq(p: Proposal) -> torch.Tensor:
    """[B, K] float64 log q(d) of each drafted token under its row's renormalized law;
    0 for POINT_MASS (the law is the point mass at d)."""
    if p.kind == QKind.POINT_MASS:
        return torch.zeros(p.tokens.shape, dtype=torch.float64)
    lq = proposal_logq(p)
    if p.kind == QKind.DENSE:
        return lq.gather(2, p.tokens.unsqueeze(2)).squeeze(2)
    hit = p.q_ids == p.tokens.unsqueeze(2)
    return torch.where(hit, lq, float("-inf")).amax(dim=2)
