"""Checks that a decoded q is a law the drafted tokens could have been drawn from.

docs/wire.md section 3.4. DENSE: a short vectorized fast path over the whole
item (a handful of numpy calls); only when it sees something wrong do the
``_raise_*`` checks walk the documented order to raise the one specific error.
SPARSE: checked only by the compiled ``_sparse.decode_run`` (called by ``proposal``),
which returns the first failing row and the check it fails; ``sparse_error`` names
the wire error from that code.
"""

from __future__ import annotations

import numpy as np

from specpair.wire.codec import _sparse
from specpair.wire.codec.header import NORM_TOLERANCE
from specpair.wire.errors import (
    DecodeError,
    DuplicateSupportId,
    NonFiniteQ,
    SupportPadding,
    TokenOutOfRange,
    UnnormalizedQ,
    ZeroDraftQ,
)

__all__ = ["check_tokens", "check_dense", "sparse_error"]

_LOG_CAP = np.float32(1.0)
# The compiled check's failure codes -> (error class, what is wrong), in its check order.
_SPARSE_ERRORS: dict[int, tuple[type[DecodeError], str]] = {
    _sparse.DRAFT_RANGE: (TokenOutOfRange, "drafted token {tok} is outside [0, {vocab})"),
    _sparse.SUPPORT_RANGE: (TokenOutOfRange, "a support id is outside [0, {vocab}) and is "
                                             "not the padding -1"),
    _sparse.NON_FINITE: (NonFiniteQ, "log q holds NaN or +inf"),
    _sparse.PADDING_ORDER: (SupportPadding, "padding (-1) must follow at least one valid id "
                                            "and come only after the valid ids"),
    _sparse.PADDING_LOG_Q: (SupportPadding, "log q must be finite at the valid ids and -inf "
                                            "at the padding"),
    _sparse.DUPLICATE_ID: (DuplicateSupportId, "a support id is listed twice"),
    _sparse.UNNORMALIZED: (UnnormalizedQ, f"sum of q is not 1 within {NORM_TOLERANCE}"),
    _sparse.DRAFT_NOT_IN_SUPPORT: (ZeroDraftQ, "drafted token {tok} is not in the support "
                                               "(q(d) = 0)"),
}
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def check_tokens(toks: np.ndarray, vocab: int, what: str = "drafted token") -> None:
    """toks: [n] int32. Every id lies in [0, vocab)."""
    if toks.size and int(toks.view(np.uint32).max()) >= vocab:  # negatives wrap to >= 2^31
        bad = toks[(toks < 0) | (toks >= vocab)]
        raise TokenOutOfRange(f"{what} id {int(bad[0])} is outside [0, {vocab})")


def _mass(lp: np.ndarray) -> np.ndarray:
    """[K] float64 sum of q per position, exp taken in fp32. log q is clamped at 1 first
    (a law has log q <= 0) so exp cannot overflow; NaN stays NaN, +inf becomes
    e > 1 + tolerance."""
    q = np.minimum(lp, _LOG_CAP, dtype=_F32)
    return np.add.reduce(np.exp(q, out=q), axis=-1, dtype=_F64)


def sparse_error(code: int, request_id: int, position: int, tok: int,
                 vocab: int) -> DecodeError:
    """The wire error for a SPARSE row that ``_sparse.decode_run`` refused with ``code``:
    ``position`` is the row's draft position in its item, ``tok`` its drafted token."""
    cls, what = _SPARSE_ERRORS[code]
    return cls(f"request {request_id}: position {position}: "
               f"{what.format(tok=tok, vocab=vocab)}")


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
    tot = _mass(lp)
    if (np.abs(tot - 1.0) <= NORM_TOLERANCE).all():  # NaN: not normalized
        return
    k = int(np.argmax(np.abs(tot - 1.0)))
    raise UnnormalizedQ(f"position {k}: sum of q is {tot[k]:.6g}, not 1 within "
                        f"{NORM_TOLERANCE}")
