"""Assemble one round's drafts into a core ``Proposal`` for the reference verifier."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specpair.proposal import Proposal, QKind
from specpair.qlaw import Drafts, widen
from specpair.wire.errors import BadShape

__all__ = ["to_proposal"]


def to_proposal(drafts: Sequence[Drafts | None], depth: int, vocab_size: int) -> Proposal:
    """One Proposal over the round: ``present[b]`` is False where ``drafts[b]`` is None (its
    q is missing). Rows are widened to DENSE (``specpair.qlaw.widen``; a POINT_MASS row beside
    sampled ones to its one-hot law) unless every row is POINT_MASS; missing rows hold token 0
    with q the point mass at 0 (never used: they are not present)."""
    b = len(drafts)
    present = torch.tensor([d is not None for d in drafts], dtype=torch.bool)
    rows = [(i, d) for i, d in enumerate(drafts) if d is not None]
    tokens = torch.zeros(b, depth, dtype=torch.int64)
    for i, d in rows:
        if d.depth != depth:
            raise BadShape(f"row {i}: {d.depth} drafts, the round has {depth}")
        tokens[i] = d.tokens
    kinds = {d.kind for _, d in rows}
    if kinds == {QKind.POINT_MASS}:
        return Proposal(tokens, QKind.POINT_MASS, None, None, present)
    logp = torch.full((b, depth, vocab_size), float("-inf"))
    logp[:, :, 0] = 0.0  # missing rows: the point mass at token 0
    for i, d in rows:
        widen(d, vocab_size, logp[i])
    return Proposal(tokens, QKind.DENSE, logp, None, present)
