"""A plain reference of the SPARSE checks of docs/wire.md 3.4, for testing the compiled one.

Written for reading, not speed: a row at a time, each check its own line, in the
order the compiled ``decode_run`` reports them (its codes are its interface).
The mass is summed in float64 in slot order, as docs/wire.md states, with libm's
exp (``math.exp``), so at the tolerance's edge both land on the same side.
"""

from __future__ import annotations

import math

import numpy as np

from specpair.wire.codec import _sparse


def row_failure(tok: int, ids: np.ndarray, lp: np.ndarray, vocab: int, tol: float) -> int:
    """0 when the row passes, else the code of the first check it fails.
    tok: the drafted token; ids [S] int32 (-1 = padding); lp [S] fp32 log q."""
    pad = ids == -1
    n = int((~pad).sum())
    if not 0 <= tok < vocab:
        return _sparse.DRAFT_RANGE
    if ((ids < -1) | (ids >= vocab)).any():
        return _sparse.SUPPORT_RANGE
    if (np.isnan(lp) | (lp == np.inf)).any():
        return _sparse.NON_FINITE
    if n == 0 or pad[:n].any():
        return _sparse.PADDING_ORDER
    if (lp[~pad] == -np.inf).any() or (lp[pad] != -np.inf).any():
        return _sparse.PADDING_LOG_Q
    valid = ids[~pad].tolist()
    if len(set(valid)) != n:
        return _sparse.DUPLICATE_ID
    mass = 0.0
    for x in lp[~pad].tolist():
        mass += math.exp(min(x, 1.0))
    if not abs(mass - 1.0) <= tol:
        return _sparse.UNNORMALIZED
    if tok not in valid:
        return _sparse.DRAFT_NOT_IN_SUPPORT
    return 0


def first_failure(items: list[tuple[np.ndarray, np.ndarray, np.ndarray]], vocab: int,
                  tol: float) -> tuple[int, int] | None:
    """(row, code) of the first failing row of items (toks [K], ids [K, S], lp [K, S]),
    row i * K + r for position r of item i; None when all pass."""
    row = 0
    for toks, ids, lp in items:
        for r in range(ids.shape[0]):
            code = row_failure(int(toks[r]), ids[r], lp[r], vocab, tol)
            if code:
                return row, code
            row += 1
    return None
