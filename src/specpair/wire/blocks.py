"""Aligned blocks inside a frame body: bounds, zero padding, numpy views (docs/wire.md 1)."""

from __future__ import annotations

import numpy as np

from specpair.wire.errors import NonZeroPadding, Truncated

__all__ = ["ZERO8", "block_end", "view", "append_block"]

ZERO8 = bytes(8)


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
