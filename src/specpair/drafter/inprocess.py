"""A ``DraftSource`` served by a ``DrafterEngine`` inside the target process (no wire).

For development and the gates (``SPECPAIR_DRAFTER=inproc:MODEL_DIR``): the engine
answers each round directly; its answers are matched to the round exactly as the
TCP client matches a PROPOSAL (``specpair.wire.source.answers``). It is always
connected, in one epoch: the engine never loses a request it was not told to release.
"""

from __future__ import annotations

from collections.abc import Sequence

from specpair.drafter.engine import DrafterEngine
from specpair.wire.frames import DraftItem, FeatureSpec, Hello, Propose, ProposeItem
from specpair.wire.source import Missing, answers

__all__ = ["InProcessSource"]


class InProcessSource:
    """The DraftSource of one in-process engine (one caller thread at a time)."""

    def __init__(self, engine: DrafterEngine) -> None:
        self.engine = engine  # serves the rounds
        self.hello: Hello = engine.hello()  # what the engine declares
        self.features: FeatureSpec | None = self.hello.features  # what the engine needs
        self._round = 0  # last round id

    def ensure_connected(self, timeout_s: float) -> int:
        return 1

    def propose(self, items: Sequence[ProposeItem],
                deadline_s: float) -> list[DraftItem | Missing]:
        if not items:
            return []
        self._round += 1
        frame = self.engine.handle(Propose(self._round, tuple(items)))
        return answers(items, frame.items, self.hello)

    def release(self, request_ids: Sequence[int]) -> None:
        self.engine.release(request_ids)
