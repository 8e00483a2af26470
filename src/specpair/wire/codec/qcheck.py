"""Checks that a decoded q is a law the drafted tokens could have been drawn from.

docs/wire.md section 3.4. DENSE: a short vectorized fast path over the whole
item (a handful of numpy calls); only when it sees something wrong do the
``_raise_*`` checks walk the documented order to raise the one specific error.
SPARSE: the fast path is compiled (``_sparse.c``, called by proposal);
``diagnose_sparse`` names its failures.
"""

from __future__ import annotations

import numpy as np

from specpair.wire.codec.header import NORM_TOLERANCE
from specpair.wire.errors import (
    DuplicateSupportId,
    NonFiniteQ,
    SupportPadding,
    TokenOutOfRange,
    UnnormalizedQ,
    ZeroDraftQ,
)

__all__ = ["check_tokens", "diagnose_sparse", "check_dense"]

_LOG_CAP = np.float32(1.0)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def check_tokens(toks: np.ndarray, vocab: int, what: str = "drafted token") -> None:
    """toks: [n] int32. Every id lies in [0, vocab)."""
    if toks.size and int(toks.view(np.uint32).max()) >= vocab:  # negatives wrap to >= 2^31
        bad = toks[(toks < 0) | (toks >= vocab)]
        raise TokenOutOfRange(f"{what} id {int(bad[0])} is outside [0, {vocab})")


def _mass(lp: np.ndarray, dtype: np.dtype = _F32) -> np.ndarray:
    """[K] float64 sum of q per position, exp taken in ``dtype``. log q is clamped at 1
    first (a law has log q <= 0) so exp cannot overflow; NaN stays NaN, +inf becomes
    e > 1 + tolerance."""
    q = np.minimum(lp, _LOG_CAP, dtype=dtype)
    return np.add.reduce(np.exp(q, out=q), axis=-1, dtype=_F64)


def diagnose_sparse(toks: np.ndarray, ids: np.ndarray, lp: np.ndarray, vocab: int) -> None:
    """Raise the first failing check of one SPARSE item, in the documented order (None
    when it passes them all): toks [K] int32, ids [K, S] int32 (-1 pad), lp [K, S] fp32
    log q. The fast path is compiled (``_sparse.c``); this names its failures, and
    takes exp in float64 as it does, so both agree on the tolerance's edge."""
    check_tokens(toks, vocab)
    bad = (ids < -1) | (ids >= vocab)
    if bad.any():
        k, j = np.argwhere(bad)[0]
        raise TokenOutOfRange(f"support id {int(ids[k, j])} at position {k}, slot {j} "
                              f"is outside [0, {vocab}) and is not the padding -1")
    _raise_non_finite(lp)
    valid = ids >= 0
    for k in range(ids.shape[0]):
        n = int(valid[k].sum())
        if n == 0 or not valid[k, :n].all():
            raise SupportPadding(f"position {k}: padding (-1) must follow at least one valid id "
                                 "and come only after the valid ids")
        if not np.isfinite(lp[k, :n]).all() or np.isfinite(lp[k, n:]).any():
            raise SupportPadding(f"position {k}: log q must be finite at the valid ids and "
                                 "-inf at the padding")
        if np.unique(ids[k, :n]).size != n:
            raise DuplicateSupportId(f"position {k} lists a support id twice")
    _raise_unnormalized(lp, _F64)
    for k in range(ids.shape[0]):
        if not (ids[k] == toks[k]).any():
            raise ZeroDraftQ(f"position {k}: drafted token {int(toks[k])} is not in the support "
                             "(q(d) = 0)")


def check_dense(toks: np.ndarray, lp: np.ndarray, vocab: int) -> None:
    """toks [K] int32, lp [K, V] fp32 log q over the whole vocabulary."""
    check_tokens(toks, vocab)
    _raise_non_finite(lp)
    _raise_unnormalized(lp)
    qd = lp[np.arange(toks.shape[0]), toks]
    if np.count_nonzero(qd == -np.inf):
        k = int(np.argmax(qd == -np.inf))
        raise ZeroDraftQ(f"position {k}: drafted token {int(toks[k])} has q(d) = 0")


def _raise_non_finite(lp: np.ndarray) -> None:
    bad = np.isnan(lp) | (lp == np.inf)
    if np.count_nonzero(bad):
        k = int(np.argwhere(bad)[0][0])
        raise NonFiniteQ(f"position {k}: log q holds NaN or +inf")


def _raise_unnormalized(lp: np.ndarray, dtype: np.dtype = _F32) -> None:
    tot = _mass(lp, dtype)
    if (np.abs(tot - 1.0) <= NORM_TOLERANCE).all():  # NaN: not normalized
        return
    k = int(np.argmax(np.abs(tot - 1.0)))
    raise UnnormalizedQ(f"position {k}: sum of q is {tot[k]:.6g}, not 1 within "
                        f"{NORM_TOLERANCE}")
