"""The body header shared by PROPOSE and PROPOSAL: round id, item count (docs/wire.md 3)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from specpair.wire.errors import NonZeroReserved, RequestLimit, Truncated
from specpair.wire.format import HEADER, Limits, check_u64

__all__ = ["ROUND", "encode_round", "decode_round"]

ROUND = struct.Struct("<QII")  # round_id, n_items, reserved


def encode_round(round_id: int, items: Sequence, limits: Limits,
                 encode_item: Callable[[object, list[bytes], Limits], None]) -> list[bytes]:
    """The body parts of a round frame: its header, then ``encode_item`` for each item."""
    if not 1 <= len(items) <= limits.requests:
        raise RequestLimit(f"{len(items)} items; a frame holds 1..{limits.requests}")
    check_u64(round_id, "round_id")
    parts = [ROUND.pack(round_id, len(items), 0)]
    for it in items:
        encode_item(it, parts, limits)
    return parts


def decode_round(buf, end: int, kind: str, limits: Limits) -> tuple[int, int, int]:
    """(round id, item count, offset of the first item) of the ``kind`` frame in ``buf``."""
    off = HEADER.size
    if off + ROUND.size > end:
        raise Truncated(f"{kind} body header is cut short")
    round_id, n, reserved = ROUND.unpack_from(buf, off)
    if reserved:
        raise NonZeroReserved(f"{kind} reserved field is not zero")
    if not 1 <= n <= limits.requests:
        raise RequestLimit(f"{n} items; a frame holds 1..{limits.requests}")
    return round_id, n, off + ROUND.size
