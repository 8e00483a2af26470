"""The compiled SPARSE checks (src/specpair/wire/codec/_sparse.c): the wire's only SPARSE
check, against the plain reference in sparse_reference.py beside this file.

decode_run returns the first failing row and the check it fails; the codec names the
wire error from that code alone, so the compiled verdict must equal the reference's
(row and code) on every run of items. Items are laid out as in a PROPOSAL
(docs/wire.md 3.4).

Each of these edits to _sparse.c makes this file fail (checked by applying each one
and rebuilding): dropping the drafted token's range check; letting negative support
ids through their range check; `>= vocab` made `> vocab`; NaN at the padding reported as
PADDING_LOG_Q; dropping the padding-order (`in_padding`) check; dropping `n == 0`;
accepting -inf at a valid id; dropping the duplicate check; the mass summed in float;
dropping the normalization check; reporting the last failing check of a row instead of
the first; carrying on past the first failing row instead of stopping there; not
writing the widened log q.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from sparse_reference import first_failure

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire import errors as E
from specpair.wire.codec import _sparse, decode, encode
from specpair.wire.codec.header import NORM_TOLERANCE, VERSION
from specpair.wire.frames import DraftItem, Hello, ItemStatus, ProposalFrame

V = 1000


def _pad8(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def _layout(items: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[bytes, int]:
    """Items (toks [K] i32, ids [K, S] i32, lp [K, S] f32) back to back; (bytes, stride)."""
    blobs = [_pad8(t.tobytes()) + _pad8(i.tobytes()) + _pad8(q.tobytes()) for t, i, q in items]
    return b"".join(blobs), len(blobs[0])


def _run(items) -> tuple[tuple[int, int] | None, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    buf, stride = _layout(items)
    n, (k, s) = len(items), items[0][1].shape
    out = np.empty((n, k), np.int64), np.empty((n, k, s), np.int64), np.empty((n, k, s),
                                                                               np.float32)
    return _sparse.decode_run(buf, 0, n, k, s, stride, V, NORM_TOLERANCE, *out), out


def _reference(items) -> tuple[int, int] | None:
    return first_failure(items, V, NORM_TOLERANCE)


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


def test_verdict_equals_the_reference_on_valid_and_broken_items():
    """3000 runs of 1-3 items, one or two defects each (so the first failing row and the
    first failing check of a row both matter): the compiled (row, code) or None must
    equal the reference's."""
    rng = np.random.default_rng(7)
    codes: dict[int, int] = {}
    for _ in range(3000):
        n, k, s = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 9))
        items = [_valid(rng, k, s) for _ in range(n)]
        for _ in range(int(rng.integers(1, 3))):
            _mutate(rng, *items[int(rng.integers(n))])
        got, _ = _run(items)
        assert got == _reference(items), items
        code = 0 if got is None else got[1]
        codes[code] = codes.get(code, 0) + 1
    assert codes.get(0, 0) > 500, codes  # valid runs exercised
    every = {getattr(_sparse, name) for name in dir(_sparse) if name.isupper()}
    assert set(codes) == every | {0}, codes  # and every check refused something


def test_verdict_equals_the_reference_at_the_edge_of_the_tolerance():
    """Rows whose mass sits within a few fp32 steps of 1 +- tolerance: both sum exp in
    double in slot order, so they agree on which side each lands."""
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
            got, _ = _run([item])
            assert got == _reference([item]), (edge, step)
            sides.add(got)
    assert sides == {None, (0, _sparse.UNNORMALIZED)}


def test_widened_outputs_equal_the_inputs():
    rng = np.random.default_rng(1)
    items = [_valid(rng, 3, 5) for _ in range(4)]
    bad, (toks, ids, lp) = _run(items)
    assert bad is None
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


def _frame_with_row_1(tok: int, ids: list[int], lp: list[float]) -> bytes:
    """A PROPOSAL of request 7, K = 2, S = 4: row 0 valid, row 1 as given."""
    ids_ = torch.tensor([[3, 4, -1, -1], ids])
    lp_ = torch.tensor([[-math.log(2)] * 2 + [-math.inf] * 2, lp])
    item = DraftItem(7, ItemStatus.OK, torch.tensor([3, tok]), QKind.SPARSE, lp_, ids_)
    return encode(ProposalFrame(1, (item,)))


HALF, QUARTER, NINF = -math.log(2), -math.log(4), -math.inf
DEFECTS = {  # code -> (wire error, row 1: drafted token, ids, log q)
    "DRAFT_RANGE": (E.TokenOutOfRange, V, [5, 6, -1, -1], [HALF, HALF, NINF, NINF]),
    "SUPPORT_RANGE": (E.TokenOutOfRange, 5, [5, V, -1, -1], [HALF, HALF, NINF, NINF]),
    "NON_FINITE": (E.NonFiniteQ, 5, [5, 6, -1, -1], [HALF, HALF, math.nan, NINF]),
    "PADDING_ORDER": (E.SupportPadding, 5, [5, -1, 6, -1], [HALF, NINF, HALF, NINF]),
    "PADDING_LOG_Q": (E.SupportPadding, 5, [5, 6, -1, -1], [HALF, HALF, -9.0, NINF]),
    "DUPLICATE_ID": (E.DuplicateSupportId, 5, [5, 6, 5, 7], [QUARTER] * 4),
    "UNNORMALIZED": (E.UnnormalizedQ, 5, [5, 6, 7, -1], [HALF, HALF, HALF, NINF]),
    "DRAFT_NOT_IN_SUPPORT": (E.ZeroDraftQ, 9, [5, 6, -1, -1], [HALF, HALF, NINF, NINF]),
}


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_each_code_names_its_wire_error(name):
    cls, tok, ids, lp = DEFECTS[name]
    hello = Hello(VERSION, DraftMode.SAMPLED, V, bytes(32), (QKind.SPARSE,), 2, 4, None)
    data = _frame_with_row_1(tok, ids, lp)
    assert _row_1_code(data) == getattr(_sparse, name)
    with pytest.raises(E.WireError) as info:
        decode(data, hello)
    assert type(info.value) is cls and str(info.value).startswith("request 7: position 1: ")


def _row_1_code(data: bytes) -> int:
    k, s = 2, 4
    out = np.empty((1, k), np.int64), np.empty((1, k, s), np.int64), np.empty((1, k, s),
                                                                              np.float32)
    base = 48  # frame header 16 + round header 16 + item header 16
    row, code = _sparse.decode_run(data, base, 1, k, s, len(data) - base, V, NORM_TOLERANCE,
                                   *out)
    assert row == 1
    return code


def test_there_is_no_fallback_without_the_compiled_module():
    """Where no C compiler (or no Python.h) exists, `pip install` of specpair fails: the
    extension is not optional. scripts/bootstrap.sh installs gcc and python3-dev first.
    A tree whose module was never built does not decode with something else: importing
    the codec fails, naming the fix."""
    root = Path(__file__).resolve().parents[2]
    (ext,) = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "ext-modules"]
    assert ext["name"] == _sparse.__name__ and not ext.get("optional", False)
    assert [root / p for p in ext["sources"]] == [root / "src/specpair/wire/codec/_sparse.c"]
    assert "apt_need \"a C compiler or Python.h\" gcc python3-dev" in (
        root / "scripts/bootstrap.sh").read_text()
    code = "import sys; sys.modules['specpair.wire.codec._sparse'] = None; import specpair.wire"
    r = subprocess.run([sys.executable, "-c", code + ".codec"], capture_output=True, text=True)
    assert r.returncode == 1 and "_sparse (the compiled SPARSE checks" in r.stderr, r.stderr
    assert "is not built" in r.stderr and "bootstrap.sh" in r.stderr
