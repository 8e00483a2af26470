"""Inside a frame body: aligned blocks (bounds, zero padding, numpy views; docs/wire.md 1)
and the round header that PROPOSE and PROPOSAL bodies start with (docs/wire.md 3.3, 3.4)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np

from specpair.wire.codec.header import HEADER, Limits, check_u64
from specpair.wire.errors import NonZeroPadding, NonZeroReserved, RequestLimit, Truncated

__all__ = ["ZERO8", "block_end", "view", "append_block", "ROUND", "encode_round",
           "decode_round"]

ZERO8 = bytes(8)
ROUND = struct.Struct("<QII")  # round_id, n_items, reserved


def block_end(buf, off: int, nbytes: int, end: int, what: str) -> int:
    """Check that ``nbytes`` at ``off`` plus zero padding to 8 fit before ``end``;
    return the offset of the next 8-aligned block."""
    stop = off + nbytes
    nxt = stop + (-stop % 8)
    if nxt > end:
        raise Truncated(f"{what} needs bytes [{off}, {nxt}) but the frame ends at {end}")
    if nxt != stop and buf[stop:nxt] != ZERO8[: nxt - stop]:
        raise NonZeroPadding(f"padding after {what} at [{stop}, {nxt}) is not zero")
    return nxt


def view(buf, off: int, dtype: np.dtype, count: int, end: int, what: str,
         shape: tuple[int, ...] | None = None) -> tuple[np.ndarray, int]:
    """A read-only numpy view of ``count`` items at ``off`` (reshaped to ``shape``);
    and the next block's offset."""
    stop = off + count * dtype.itemsize
    nxt = stop + (-stop % 8)
    if nxt > end:
        raise Truncated(f"{what} needs bytes [{off}, {nxt}) but the frame ends at {end}")
    if nxt != stop and buf[stop:nxt] != ZERO8[: nxt - stop]:
        raise NonZeroPadding(f"padding after {what} at [{stop}, {nxt}) is not zero")
    a = np.frombuffer(buf, dtype, count, off)
    return (a if shape is None else a.reshape(shape)), nxt


def append_block(parts: list[bytes], data: bytes) -> None:
    """Append ``data`` and the zero padding that realigns to 8."""
    parts.append(data)
    if len(data) % 8:
        parts.append(ZERO8[: -len(data) % 8])


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
