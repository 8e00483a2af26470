"""What the target-side session asks drafts of: the ``DraftSource`` protocol and its answers.

Two sources implement it: ``specpair.wire.client.DraftClient`` (a drafter across the
probability wire) and ``specpair.drafter.inprocess.InProcessSource`` (a drafter
engine inside the target process). ``specpair.wire.session.DraftSession`` is their
one caller. A source answers every item of a round, in order, with a verified OK
``DraftItem`` carrying exactly the drafts asked for, or a ``Missing`` that says why
there are none; it never guesses q.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol, runtime_checkable

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire.frames import DraftItem, FeatureSpec, Hello, ItemStatus, ProposeItem

__all__ = ["MissingReason", "Missing", "DraftSource", "answers"]


class MissingReason(Enum):
    """Why a request's proposal is missing this round (the session counts these)."""

    DISCONNECTED = "disconnected"  # no connection (drafter down, or reconnect backing off)
    LATE = "late"  # the answer did not arrive before the deadline
    INVALID = "invalid"  # the answer failed to decode or could not be sent (connection dropped)
    PEER_ERROR = "peer_error"  # the drafter sent ERROR (connection dropped)
    MISMATCH = "mismatch"  # no item for the request, or a depth other than asked
    RESYNC = "resync"  # the drafter lacks the history: resend it whole
    REFUSED = "refused"  # the drafter cannot serve the request (e.g. deeper than its max)
    ERROR = "error"  # an unexpected exception at the seam (a bug; logged with its traceback)


@dataclass(frozen=True)
class Missing:
    """A request without a proposal this round: its step is target-only, never point mass."""

    reason: MissingReason  # why


@runtime_checkable
class DraftSource(Protocol):
    """A drafter as the target-side session sees it (one caller thread at a time)."""

    features: FeatureSpec | None  # context features every item must carry (None: none)
    hello: Hello | None  # the drafter's HELLO on the current connection (None: none yet)

    def ensure_connected(self, timeout_s: float) -> int | None:
        """Connect if needed, within ``timeout_s``, without raising: the connection epoch,
        or None while disconnected. A changed epoch means the drafter may hold none of the
        requests it held (a new connection, perhaps a restarted drafter)."""
        ...

    def propose(self, items: Sequence[ProposeItem],
                deadline_s: float) -> list[DraftItem | Missing]:
        """One round: per item, in order, an OK DraftItem with ``item.depth`` drafts or a
        Missing; returns within ``deadline_s`` seconds."""
        ...

    def release(self, request_ids: Sequence[int]) -> None:
        """The drafter may free these requests (best effort)."""
        ...


def answers(batch: Sequence[ProposeItem], got: Sequence[DraftItem],
            hello: Hello) -> list[DraftItem | Missing]:
    """Match a PROPOSAL's items to the round's ``batch``: per item its OK DraftItem, or a
    Missing for no item / a depth or mode other than asked (MISMATCH), RESYNC, REFUSED, or
    POINT_MASS q for an item that did not ask for greedy drafts from a SAMPLED drafter
    (INVALID)."""
    by_id = {d.request_id: d for d in got}
    out: list[DraftItem | Missing] = []
    for it in batch:
        d = by_id.get(it.request_id)
        if d is None or (d.status == ItemStatus.OK and d.tokens.shape != (it.depth,)):
            out.append(Missing(MissingReason.MISMATCH))
        elif d.status == ItemStatus.RESYNC:
            out.append(Missing(MissingReason.RESYNC))
        elif d.status == ItemStatus.REFUSED:
            out.append(Missing(MissingReason.REFUSED))
        elif d.kind == QKind.POINT_MASS and not (it.greedy or hello.mode == DraftMode.GREEDY):
            # a sampled draft verified as the point mass would bias the output
            out.append(Missing(MissingReason.INVALID))
        elif it.greedy and d.kind != QKind.POINT_MASS:
            out.append(Missing(MissingReason.MISMATCH))  # not the argmax drafts asked for
        else:
            out.append(d)
    return out
