"""The proposal a drafter returns: drafted tokens and the exact law q of each.

A proposal covers B requests and K draft positions. q at every position is
carried in one of three encodings (the same codes travel on the wire):

- SPARSE:     support ids [B, K, S] int64 (-1 = padding, only after the valid ids;
              ids distinct) and fp32 log q [B, K, S] (-inf at padding). Used whenever
              the law is truncated.
- DENSE:      fp32 log q over the whole vocabulary [B, K, V] (-inf = excluded).
- POINT_MASS: no tensor; q is the point mass at the drafted token. Legal ONLY
              when the drafter declared greedy drafts (its draws are argmax).

``present[b]`` is False when request b's q is MISSING (late, dropped or
invalid on the way): such a request must never be verified as point mass;
the verifier refuses it or drops its drafts (target-only step).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from specpair.errors import InvalidProposal

__all__ = ["QKind", "Proposal"]


class QKind(IntEnum):
    """Encoding of q. Values are wire codes: never reuse a retired one."""

    SPARSE = 1
    DENSE = 2
    POINT_MASS = 3


@dataclass(frozen=True)
class Proposal:
    """Drafts of B requests, K positions each, with the law each was drawn from."""

    tokens: torch.Tensor  # [B, K] int64 drafted ids
    kind: QKind  # encoding of q, shared by all rows
    q_logp: torch.Tensor | None  # SPARSE [B, K, S] / DENSE [B, K, V] fp32 log q; None: POINT_MASS
    q_ids: torch.Tensor | None  # SPARSE [B, K, S] int64 support ids (-1 pad); else None
    present: torch.Tensor  # [B] bool; False = q MISSING for that request

    def __post_init__(self) -> None:
        t = self.tokens
        if t.ndim != 2 or t.dtype != torch.int64:
            raise InvalidProposal(f"tokens must be [B, K] int64, got {tuple(t.shape)} {t.dtype}")
        b, k = t.shape
        if self.present.shape != (b,) or self.present.dtype != torch.bool:
            raise InvalidProposal(f"present must be [{b}] bool")
        if self.kind == QKind.POINT_MASS:
            if self.q_logp is not None or self.q_ids is not None:
                raise InvalidProposal("POINT_MASS carries no q tensors")
            return
        if self.q_logp is None or self.q_logp.dtype != torch.float32:
            raise InvalidProposal(f"{self.kind.name} needs fp32 q_logp")
        if self.q_logp.ndim != 3 or self.q_logp.shape[:2] != (b, k):
            raise InvalidProposal(f"q_logp must be [{b}, {k}, *], got {tuple(self.q_logp.shape)}")
        if self.kind == QKind.SPARSE:
            if self.q_ids is None or self.q_ids.shape != self.q_logp.shape:
                raise InvalidProposal("SPARSE needs q_ids with the shape of q_logp")
            if self.q_ids.dtype != torch.int64:
                raise InvalidProposal("q_ids must be int64")
            if bool((self.q_ids[..., 0] < 0).any()):
                raise InvalidProposal("SPARSE rows need a valid first id (padding goes last)")
        elif self.q_ids is not None:
            raise InvalidProposal("DENSE carries no q_ids")

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def depth(self) -> int:
        return self.tokens.shape[1]

    def with_missing(self, missing: torch.Tensor) -> Proposal:
        """A copy with the requests flagged in ``missing`` [B] bool marked MISSING."""
        return Proposal(self.tokens, self.kind, self.q_logp, self.q_ids, self.present & ~missing)
