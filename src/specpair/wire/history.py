"""Per-request committed history kept by the target-side client, for whole resends."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from specpair.wire.errors import TokenLimit
from specpair.wire.frames import ProposeItem

__all__ = ["History"]


@dataclass
class _Request:
    tokens: list[torch.Tensor] = field(default_factory=list)  # [n_i] int64 chunks, in order
    features: list[torch.Tensor] | None = field(default_factory=list)  # [n_i, W] chunks
    length: int = 0  # committed tokens so far
    stale: bool = True  # the drafter may lack this history: send it whole next time


class History:
    """Committed tokens (and features) of every live request."""

    def __init__(self) -> None:
        self._reqs: dict[int, _Request] = {}

    def check(self, it: ProposeItem) -> None:
        """Raise unless ``it.position`` is the committed length after ``it.new_tokens``
        (``position == len(new_tokens)`` restarts the request's history)."""
        n = it.new_tokens.shape[0]
        r = self._reqs.get(it.request_id)
        if it.position != n and (r is None or it.position != r.length + n):
            have = "no history" if r is None else f"committed length {r.length}"
            raise TokenLimit(f"request {it.request_id}: position {it.position} does not follow "
                             f"from {have} and {n} new tokens")

    def commit(self, it: ProposeItem) -> None:
        """Append ``it.new_tokens`` (``check`` it first)."""
        n = it.new_tokens.shape[0]
        r = self._reqs.get(it.request_id)
        if r is None or it.position == n:
            r = self._reqs[it.request_id] = _Request()
        r.tokens.append(it.new_tokens)
        if it.features is None or r.features is None:
            r.features = None
        else:
            r.features.append(it.features)
        r.length += n

    def stale(self, request_id: int) -> bool:
        return self._reqs[request_id].stale

    def whole(self, request_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The whole history: tokens [L] int64 and features [L, W] (None if any chunk lacked)."""
        r = self._reqs[request_id]
        if len(r.tokens) > 1:
            r.tokens = [torch.cat(r.tokens)]
        if r.features is not None and len(r.features) > 1:
            r.features = [torch.cat(r.features)]
        return r.tokens[0], (r.features[0] if r.features else None)

    def sent(self, request_ids: Iterable[int]) -> None:
        """The drafter received these histories."""
        for rid in request_ids:
            self._reqs[rid].stale = False

    def mark_stale(self, request_id: int) -> None:
        if request_id in self._reqs:
            self._reqs[request_id].stale = True

    def mark_all_stale(self) -> None:
        for r in self._reqs.values():
            r.stale = True

    def forget(self, request_ids: Iterable[int]) -> None:
        for rid in request_ids:
            self._reqs.pop(rid, None)

    def __len__(self) -> int:
        return len(self._reqs)
