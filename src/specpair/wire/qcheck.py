"""Checks that a decoded q is a law the drafted tokens could have been drawn from.

docs/wire.md section 3.4. Each check runs a short vectorized fast path over a
whole item (a handful of numpy calls, no per-element Python); only when the
fast path sees something wrong does ``_diagnose_*`` walk the checks in their
documented order to raise the one specific error.
"""

from __future__ import annotations

import numpy as np

from specpair.wire.errors import (
    DuplicateSupportId,
    NonFiniteQ,
    SupportPadding,
    TokenOutOfRange,
    UnnormalizedQ,
    ZeroDraftQ,
)
from specpair.wire.format import NORM_TOLERANCE

__all__ = ["check_tokens", "check_sparse", "sparse_ok", "check_dense"]

_ONE = np.uint32(1)
_LOG_CAP = np.float32(1.0)
_F64 = np.dtype(np.float64)


def check_tokens(toks: np.ndarray, vocab: int, what: str = "drafted token") -> None:
    """toks: [n] int32. Every id lies in [0, vocab)."""
    if toks.size and int(toks.view(np.uint32).max()) >= vocab:  # negatives wrap to >= 2^31
        bad = toks[(toks < 0) | (toks >= vocab)]
        raise TokenOutOfRange(f"{what} id {int(bad[0])} is outside [0, {vocab})")


def _mass(lp: np.ndarray) -> np.ndarray:
    """[K] float64 sum of q per position. log q is clamped at 1 first (a law has log q <= 0)
    so exp cannot overflow; NaN stays NaN, +inf becomes e > 1 + tolerance."""
    q = np.minimum(lp, _LOG_CAP)
    return np.add.reduce(np.exp(q, out=q), axis=-1, dtype=_F64)


def _normalized(lp: np.ndarray) -> bool:
    for t in _mass(lp).ravel().tolist():  # noqa: SIM110 - a loop: no generator on the hot path
        if not abs(t - 1.0) <= NORM_TOLERANCE:  # NaN: not normalized
            return False
    return True


def check_sparse(toks: np.ndarray, ids: np.ndarray, lp: np.ndarray, vocab: int) -> None:
    """toks [K] int32, ids [K, S] int32 (-1 pad), lp [K, S] fp32 log q."""
    if not sparse_ok(toks, ids, lp, vocab):
        _diagnose_sparse(toks, ids, lp, vocab)


def sparse_ok(toks: np.ndarray, ids: np.ndarray, lp: np.ndarray, vocab: int) -> bool:
    """The fast path of ``check_sparse``, for any leading batch dims: [..., K], [..., K, S]."""
    if int(np.maximum.reduce(ids.view(np.uint32), axis=None)) < vocab:
        # No padding (every row full, the usual top-k case) and every id in range.
        ok = (
            np.count_nonzero(np.isfinite(lp)) == lp.size  # also: no NaN reaches exp
            and _distinct(ids)
            and _normalized(lp)
            # ids are distinct per row, so K hits <=> every drafted token is in its support
            and np.count_nonzero(ids == toks[..., None]) == toks.size
        )
    else:
        u = ids.view(np.uint32) + _ONE  # padding -> 0, valid -> 1..V, anything else > V
        valid = u != 0
        s = np.sort(u, axis=-1)  # padding first, then the valid ids ascending
        ok = (
            not np.count_nonzero(u > vocab)
            and not np.count_nonzero(np.isfinite(lp) ^ valid)
            and not np.count_nonzero(np.isnan(lp))  # before exp: a signalling NaN would warn
            and not np.count_nonzero(valid[..., 1:] > valid[..., :-1])
            and not np.count_nonzero(_adjacent_equal(s) & (s[..., 1:] != 0))
            and _normalized(lp)
            and np.count_nonzero(ids == toks[..., None]) == toks.size
        )
    return ok


def _distinct(ids: np.ndarray) -> bool:
    """Every row's ids are distinct. specpair's drafter ships them ascending, which
    one comparison proves; any other order pays for a sort."""
    if not np.count_nonzero(ids[..., 1:] <= ids[..., :-1]):
        return True
    return not np.count_nonzero(_adjacent_equal(np.sort(ids, axis=-1)))


def _adjacent_equal(s: np.ndarray) -> np.ndarray:
    return s[..., 1:] == s[..., :-1]


def _diagnose_sparse(toks: np.ndarray, ids: np.ndarray, lp: np.ndarray, vocab: int) -> None:
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
    _raise_unnormalized(lp)
    for k in range(ids.shape[0]):
        if not (ids[k] == toks[k]).any():
            raise ZeroDraftQ(f"position {k}: drafted token {int(toks[k])} is not in the support "
                             "(q(d) = 0)")
    raise AssertionError("sparse fast path and diagnosis disagree")  # pragma: no cover


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


def _raise_unnormalized(lp: np.ndarray) -> None:
    if _normalized(lp):
        return
    tot = _mass(lp)
    k = int(np.argmax(np.abs(tot - 1.0)))
    raise UnnormalizedQ(f"position {k}: sum of q is {tot[k]:.6g}, not 1 within "
                        f"{NORM_TOLERANCE}")
