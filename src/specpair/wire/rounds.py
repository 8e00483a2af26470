"""How the drafter's server feeds a round to its one handler: chunks, pieces, request ids.

Fairness (docs/wire.md 5.2): a round reaches the handler in chunks of at most ``max_items``
items and ``max_tokens`` new tokens (``chunks``); an item with more new tokens is fed in
pieces of ``max_tokens`` (``pieces``). ``draft_round`` awaits one handler call at a time,
so while one connection waits for its chunk the one worker thread serves the chunks other
connections queued before it (first come, first served per chunk): one target's huge round
holds the handler for one chunk, never for the whole round. Each request is drafted alone of
the others in its batch (its noise and law do not depend on its batch), so chunking changes
no draft.

Request ids: each target numbers its requests from 1, so the handler sees ids unique over
connections. ``RequestIds`` is one connection's table (target id -> handler id, least
recently asked for first) and the bound on how many it holds.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator

from specpair.wire.frames import DraftItem, ItemStatus, Propose, ProposeItem

__all__ = ["RequestIds", "to_target", "pieces", "chunks", "one_chunk", "draft_round"]

# one part of a round and its items' answers (under the target's ids, in the part's order)
Answered = tuple[Propose, tuple[DraftItem, ...]]


class RequestIds:
    """One connection's requests: the target's id -> the handler's (from ``ids``, shared by
    all connections), least recently asked for first."""

    def __init__(self, ids: Iterator[int]) -> None:
        self._ids = ids
        self._seen: OrderedDict[int, int] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._seen)

    def admit(self, items: Iterable[ProposeItem], bound: int) -> tuple[int, ...]:
        """Give the round's new requests handler ids and mark all of them most recently
        asked for; the target ids over ``bound``, least recently asked for first and never
        one of this round, that the caller releases and then ``forget``s."""
        mine = set()
        for it in items:
            if it.request_id not in self._seen:
                self._seen[it.request_id] = next(self._ids)
            self._seen.move_to_end(it.request_id)
            mine.add(it.request_id)
        over = len(self._seen) - bound
        if over <= 0:
            return ()
        return tuple(r for r in self._seen if r not in mine)[:over]

    def known(self, request_ids: Iterable[int]) -> list[int]:
        """Those of ``request_ids`` this connection holds (a RELEASE of others is ignored)."""
        return [rid for rid in request_ids if rid in self._seen]

    def handler_ids(self, request_ids: Iterable[int] | None = None) -> tuple[int, ...]:
        """The handler's ids for these target ids (all of them when None)."""
        if request_ids is None:
            return tuple(self._seen.values())
        return tuple(self._seen[rid] for rid in request_ids)

    def forget(self, request_ids: Iterable[int]) -> None:
        """Drop these ids once the handler released them (a close that interrupts a release
        then releases them again: releasing is idempotent)."""
        for rid in request_ids:
            self._seen.pop(rid, None)

    def to_handler(self, part: Propose) -> Propose:
        """``part`` with each item under the handler's request id for it."""
        return Propose(
            part.round_id,
            tuple(
                dataclasses.replace(it, request_id=self._seen[it.request_id]) for it in part.items
            ),
        )


def to_target(got: tuple[DraftItem, ...], part: Propose) -> tuple[DraftItem, ...]:
    """The handler's answers to ``part`` under the target's request ids, in its order."""
    return tuple(
        dataclasses.replace(d, request_id=it.request_id)
        for d, it in zip(got, part.items, strict=True)
    )


def pieces(it: ProposeItem, max_tokens: int) -> list[ProposeItem]:
    """An item of more than ``max_tokens`` new tokens as consecutive items of at most that
    many: the first as the item would start (its whole history's prefix, or its delta with its
    num_accepted), the next ones continuing it (num_accepted 0), each but the last asking
    depth 1 (a draft thrown away: what matters is the cache it leaves), the last the item's
    own depth. Drafted one after the other, they leave the drafter holding what the item
    would have, and the last one's answer is the item's."""
    n = int(it.new_tokens.numel())
    if n <= max_tokens:
        return [it]
    start, whole, out = it.position - n, n == it.position, []
    for a in range(0, n, max_tokens):
        b = min(a + max_tokens, n)
        lo = 0 if whole and a == 0 else a
        out.append(
            dataclasses.replace(
                it,
                new_tokens=it.new_tokens[lo:b],
                position=start + b,
                num_accepted=it.num_accepted if a == 0 else 0,
                depth=it.depth if b == n else 1,
                features=None if it.features is None else it.features[lo:b],
            )
        )
    return out


def chunks(propose: Propose, max_items: int, max_tokens: int) -> list[Propose]:
    """The round split, in order, into rounds of at most ``max_items`` items and
    ``max_tokens`` new tokens (an item larger than that alone)."""
    out, cur, tokens = [], [], 0
    for it in propose.items:
        n = int(it.new_tokens.numel())
        if cur and (len(cur) >= max_items or tokens + n > max_tokens):
            out.append(Propose(propose.round_id, tuple(cur)))
            cur, tokens = [], 0
        cur.append(it)
        tokens += n
    out.append(Propose(propose.round_id, tuple(cur)))
    return out


def one_chunk(frame: Propose, max_items: int, max_tokens: int) -> bool:
    """Whether the round is one chunk: at most max_items items and max_tokens new tokens."""
    return (
        len(frame.items) <= max_items
        and sum(int(it.new_tokens.numel()) for it in frame.items) <= max_tokens
    )


async def draft_round(
    frame: Propose,
    max_items: int,
    max_tokens: int,
    call: Callable[[Propose], Awaitable[tuple[DraftItem, ...]]],
) -> list[Answered]:
    """The round's answers, as (part, its items' answers) in the round's order: items of at
    most ``max_tokens`` new tokens in chunks, larger ones piece by piece, one ``call`` (the
    handler's answer to a part, under the target's ids) at a time."""
    small = [it for it in frame.items if it.new_tokens.numel() <= max_tokens]
    done: dict[int, Answered] = {}
    if small:
        for part in chunks(Propose(frame.round_id, tuple(small)), max_items, max_tokens):
            got = await call(part)
            for it, d in zip(part.items, got, strict=True):
                done[it.request_id] = (Propose(frame.round_id, (it,)), (d,))
    for it in frame.items:
        if it.request_id in done:
            continue
        for piece in pieces(it, max_tokens):
            (d,) = await call(Propose(frame.round_id, (piece,)))
            if d.status != ItemStatus.OK:
                break  # RESYNC or REFUSED: the item's answer, the rest not fed
        done[it.request_id] = (Propose(frame.round_id, (it,)), (d,))
    return [done[it.request_id] for it in frame.items]
