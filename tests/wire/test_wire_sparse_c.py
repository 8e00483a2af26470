"""The compiled SPARSE checks (src/specpair/wire/codec/_sparse.c) against the numpy diagnosis.

decode_run is the decoder's only SPARSE fast path; qcheck.diagnose_sparse names its
failures. Both must give the same verdict on every item, or the decoder would either
accept what the documented checks refuse or raise an internal error where it should
name a wire error. Items are laid out as in a PROPOSAL (docs/wire.md 3.4).
"""

from __future__ import annotations

import numpy as np
import pytest

from specpair.wire.codec import _sparse
from specpair.wire.codec.header import NORM_TOLERANCE
from specpair.wire.codec.qcheck import diagnose_sparse
from specpair.wire.errors import DecodeError

V = 1000


def _pad8(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def _layout(items: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[bytes, int]:
    """Items (toks [K] i32, ids [K, S] i32, lp [K, S] f32) back to back; (bytes, stride)."""
    blobs = [_pad8(t.tobytes()) + _pad8(i.tobytes()) + _pad8(q.tobytes()) for t, i, q in items]
    return b"".join(blobs), len(blobs[0])


def _run(items) -> tuple[bool, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    buf, stride = _layout(items)
    n, (k, s) = len(items), items[0][1].shape
    out = np.empty((n, k), np.int64), np.empty((n, k, s), np.int64), np.empty((n, k, s),
                                                                               np.float32)
    return _sparse.decode_run(buf, 0, n, k, s, stride, V, NORM_TOLERANCE, *out), out


def _diagnosis_passes(toks, ids, lp) -> bool:
    try:
        diagnose_sparse(toks, ids, lp, V)
    except DecodeError:
        return False
    return True


def _valid(rng: np.random.Generator, k: int, s: int) -> tuple[np.ndarray, ...]:
    """Ragged rows (padding after c valid ids), ascending or shuffled, normalized fp32."""
    toks, ids = np.zeros(k, np.int32), np.full((k, s), -1, np.int32)
    lp = np.full((k, s), -np.inf, np.float32)
    for r in range(k):
        c = int(rng.integers(1, s + 1))
        row = rng.choice(V, size=c, replace=False)
        ids[r, :c] = np.sort(row) if rng.random() < 0.5 else row
        w = rng.normal(size=c) * 2
        lp[r, :c] = (w - np.log(np.exp(w).sum())).astype(np.float32)
        toks[r] = ids[r, int(rng.integers(c))]
    return toks, ids, lp


def _mutate(rng: np.random.Generator, toks, ids, lp) -> None:
    """One defect (or none) of the kinds docs/wire.md 3.4 refuses, in place."""
    k, s = ids.shape
    r, j = int(rng.integers(k)), int(rng.integers(s))
    choice = int(rng.integers(12))  # 0-8: a defect; 9-11: the item stays valid
    if choice == 0:
        toks[r] = rng.choice([-1, -2, V, V + 7])
    elif choice == 1:
        toks[r] = rng.integers(V)  # often outside the support
    elif choice == 2:
        ids[r, j] = rng.choice([-1, -2, V, 2**31 - 1, -(2**31)])
    elif choice == 3:
        ids[r, j] = ids[r, int(rng.integers(s))]  # a duplicate (or itself)
    elif choice == 4:
        lp[r, j] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -1e-4, 3.0])
    elif choice == 5:
        lp[r] += np.float32(rng.choice([1e-4, 5e-4, 2e-3, -2e-3]))  # mass x e^delta
    elif choice == 6:
        ids[r, j], lp[r, j] = -1, -np.inf  # padding, maybe before a valid id
    elif choice == 7:
        ids[r, :] = -1  # no valid id
    elif choice == 8:
        toks[r], ids[r, j] = -1, -1  # drafts the padding (the old fast path's hole)


def test_verdict_agrees_with_the_diagnosis_on_valid_and_broken_items():
    rng = np.random.default_rng(7)
    verdicts = {True: 0, False: 0}
    for _ in range(3000):
        n, k, s = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 9))
        items = [_valid(rng, k, s) for _ in range(n)]
        _mutate(rng, *items[int(rng.integers(n))])
        ok, _ = _run(items)
        assert ok == all(_diagnosis_passes(*it) for it in items), items
        verdicts[ok] += 1
    assert min(verdicts.values()) > 500, verdicts  # both sides exercised


def test_verdict_agrees_at_the_edge_of_the_tolerance():
    """Rows whose mass sits within a few fp32 steps of 1 +- tolerance: C sums exp in
    double, and so does the diagnosis, so they agree on which side each lands."""
    sides = set()
    for edge in (1 + NORM_TOLERANCE, 1 - NORM_TOLERANCE):
        lp = np.log(np.full((1, 4), 0.25)).astype(np.float32)
        rest = np.exp(lp[0, 1:].astype(np.float64)).sum()
        x = np.float32(np.log(edge - rest))
        for step in range(-6, 7):
            lp[0, 0] = x
            for _ in range(abs(step)):
                lp[0, 0] = np.nextafter(lp[0, 0], np.float32(np.sign(step) * np.inf))
            item = np.array([5], np.int32), np.array([[5, 6, 7, 8]], np.int32), lp.copy()
            ok, _ = _run([item])
            assert ok == _diagnosis_passes(*item), (edge, step)
            sides.add(ok)
    assert sides == {True, False}


def test_widened_outputs_equal_the_inputs():
    rng = np.random.default_rng(1)
    items = [_valid(rng, 3, 5) for _ in range(4)]
    ok, (toks, ids, lp) = _run(items)
    assert ok
    for j, (t, i, q) in enumerate(items):
        assert toks[j].tolist() == t.tolist() and ids[j].tolist() == i.tolist()
        assert lp[j].tobytes() == q.tobytes()


def test_arguments_outside_the_buffers_are_refused():
    rng = np.random.default_rng(2)
    buf, stride = _layout([_valid(rng, 2, 4)])
    out = np.empty((1, 2), np.int64), np.empty((1, 2, 4), np.int64), np.empty((1, 2, 4),
                                                                              np.float32)
    for base, n, stride_ in ((8, 1, stride), (len(buf) + 8, 1, stride), (0, 2, stride),
                             (0, 1, stride - 8), (-8, 1, stride), (0, 0, stride)):
        with pytest.raises(ValueError):
            _sparse.decode_run(buf, base, n, 2, 4, stride_, V, NORM_TOLERANCE, *out)
    with pytest.raises(ValueError, match="ids_out"):
        _sparse.decode_run(buf, 0, 1, 2, 4, stride, V, NORM_TOLERANCE, out[0],
                           np.empty(7, np.int64), out[2])
    with pytest.raises(BufferError):  # a read-only output
        _sparse.decode_run(buf, 0, 1, 2, 4, stride, V, NORM_TOLERANCE, bytes(16), *out[1:])


def test_i32_casts_in_range_and_refuses_outside():
    a = np.array([-1, 0, 7, 2**31 - 1], np.int64)
    assert _sparse.i32(a, -1) == a.astype("<i4").tobytes()
    assert _sparse.i32(a, 0) is None  # -1 below lo
    assert _sparse.i32(np.array([2**31], np.int64), -1) is None
    assert _sparse.i32(np.array([-(2**40)], np.int64), -1) is None  # wraps to 0 as i32
    with pytest.raises(ValueError, match="int64"):
        _sparse.i32(b"\x00" * 12, 0)
