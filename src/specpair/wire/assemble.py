"""Assemble a round's DraftItems (or MISSING) into one core ``Proposal`` batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specpair.proposal import Proposal, QKind
from specpair.wire.errors import BadShape
from specpair.wire.frames import DraftItem

__all__ = ["to_proposal"]


def to_proposal(drafts: Sequence[object], depth: int, vocab_size: int) -> Proposal:
    """One Proposal over the round: ``present[b]`` is False where ``drafts[b]`` is MISSING
    (anything that is not a DraftItem). Mixed SPARSE/DENSE rows become DENSE; MISSING
    rows hold token 0 with q the point mass at 0 (never used: they are not present)."""
    b = len(drafts)
    present = torch.tensor([isinstance(d, DraftItem) for d in drafts], dtype=torch.bool)
    items = [d for d in drafts if isinstance(d, DraftItem)]
    for d in items:
        if d.tokens.shape != (depth,):
            raise BadShape(f"request {d.request_id}: {d.tokens.shape[0]} drafts, round has {depth}")
    tokens = torch.zeros(b, depth, dtype=torch.int64)
    rows = [i for i, d in enumerate(drafts) if isinstance(d, DraftItem)]
    for i, d in zip(rows, items, strict=True):
        tokens[i] = d.tokens
    kinds = {d.kind for d in items}
    if kinds == {QKind.POINT_MASS}:
        return Proposal(tokens, QKind.POINT_MASS, None, None, present)
    if QKind.POINT_MASS in kinds:
        raise BadShape("POINT_MASS rows cannot share a batch with SPARSE or DENSE rows")
    if QKind.DENSE in kinds:
        logp = torch.full((b, depth, vocab_size), float("-inf"))
        logp[:, :, 0] = 0.0  # MISSING rows: the point mass at token 0
        for i, d in zip(rows, items, strict=True):
            if d.kind == QKind.DENSE:
                logp[i] = d.q_logp
            else:
                logp[i] = float("-inf")
                valid = d.q_ids >= 0
                k_idx = torch.arange(depth).unsqueeze(1).expand_as(d.q_ids)
                logp[i, k_idx[valid], d.q_ids[valid]] = d.q_logp[valid]
        return Proposal(tokens, QKind.DENSE, logp, None, present)
    s = max((d.q_ids.shape[1] for d in items), default=1)
    ids = torch.full((b, depth, s), -1, dtype=torch.int64)
    logp = torch.full((b, depth, s), float("-inf"))
    ids[:, :, 0] = 0  # MISSING rows: the point mass at token 0
    logp[:, :, 0] = 0.0
    for i, d in zip(rows, items, strict=True):
        w = d.q_ids.shape[1]
        ids[i, :, :w] = d.q_ids
        logp[i, :, :w] = d.q_logp
    return Proposal(tokens, QKind.SPARSE, logp, ids, present)
