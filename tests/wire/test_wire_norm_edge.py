"""The decoder at the SPARSE normalization edge, |sum q - 1| = 1e-3: only wire errors.

The bug this guards against: two SPARSE checks (a sequential sum in C, a pairwise one in numpy)
landed on different sides of the tolerance for some rows, and the decoder raised
AssertionError, which no caller catches. There is one check now; these searches show
that the decoder's verdict on rows at the edge is a success or a WireError, never
another exception, and that it is the documented one (sparse_reference.py: float64
exp, summed in slot order).

The ulp search: K = 1, S = 10, V = 1000; 8 ordinary ids, a small one that brings the
mass to about 1e-10 short of 1 +- 1e-3, and a tiny one (q ~ 1e-10) stepped ulp by ulp,
121 steps, each moving the mass by about 2e-16 (one float64 ulp at 1), across the
edge; 40 rows per edge. On the code before, 7 of these 9,680 decodes raised
AssertionError. The random search: 2,000 rows of 1..10 ids, ragged, whose mass is
scaled to within 1e-6 of either edge. The client side: a drafter that answers rows around
the edge gets, per round, its drafts or Missing(INVALID) from DraftClient.propose (which
raised AssertionError before), and the next round reconnects.
"""

from __future__ import annotations

import numpy as np
import torch
from sparse_reference import first_failure
from wire_helpers import one_row_proposal

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire import errors as E
from specpair.wire.client import DraftClient
from specpair.wire.codec import _sparse, decode
from specpair.wire.codec.header import NORM_TOLERANCE, VERSION
from specpair.wire.frames import (
    DraftItem,
    Hello,
    ItemStatus,
    ProposalFrame,
    Propose,
    ProposeItem,
    RequestParams,
)
from specpair.wire.server import ServerThread
from specpair.wire.source import Missing, MissingReason

V, S = 1000, 10
HELLO = Hello(VERSION, DraftMode.SAMPLED, V, bytes(32), (QKind.SPARSE,), 1, S, None)
EDGES = (1 + NORM_TOLERANCE, 1 - NORM_TOLERANCE)


def _verdict(ids: np.ndarray, lp: np.ndarray) -> str:
    """"ok" or the WireError's class name; any other exception propagates."""
    try:
        decode(one_row_proposal(ids, lp), HELLO)
    except E.WireError as exc:
        return type(exc).__name__
    return "ok"


def _expected(ids: np.ndarray, lp: np.ndarray) -> str:
    item = (np.array([ids[0]], np.int32), ids.reshape(1, -1).astype(np.int32),
            lp.reshape(1, -1))
    bad = first_failure([item], V, NORM_TOLERANCE)
    assert bad is None or bad[1] == _sparse.UNNORMALIZED, bad  # the rows are laws otherwise
    return "ok" if bad is None else "UnnormalizedQ"


def _exp(v) -> float:
    return float(np.exp(np.float64(v)))


def _log_at_most(x: float) -> np.float32:
    """The largest fp32 v with exp(v) <= x (exp in float64)."""
    v = np.float32(np.log(x))
    while _exp(v) > x:
        v = np.nextafter(v, np.float32(-np.inf))
    while _exp(np.nextafter(v, np.float32(np.inf))) <= x:
        v = np.nextafter(v, np.float32(np.inf))
    return v


def _ulp_rows(rng: np.random.Generator, edge: float, steps: int = 60):
    """Rows [S] fp32 log q whose mass crosses ``edge`` in about float64-ulp steps."""
    w = rng.random(S - 2) + 0.1
    lp = np.empty(S, np.float32)
    lp[:S - 2] = np.log(w / w.sum() * (edge - 1e-6))
    gap = edge - float(np.exp(lp[:S - 2].astype(np.float64)).sum())  # about 1e-6
    lp[S - 2] = _log_at_most(gap - 1e-10)
    tiny = np.float32(np.log(gap - _exp(lp[S - 2])))  # q about 1e-10
    bits = int(tiny.view(np.uint32))
    for d in range(-steps, steps + 1):  # neighbouring fp32 values: d ulps from tiny
        lp[S - 1] = np.uint32(bits + d).view(np.float32)
        yield lp.copy()


def test_rows_stepped_ulp_by_ulp_across_both_edges_decode_or_raise_wire_errors():
    rng = np.random.default_rng(12)
    seen = {}
    for edge in EDGES:
        for _ in range(40):
            ids = rng.choice(V, S, replace=False).astype(np.int32)
            for lp in _ulp_rows(rng, edge):
                got = _verdict(ids, lp)
                assert got == _expected(ids, lp), (edge, ids.tolist(), lp.view(np.uint32).tolist())
                seen[(edge, got)] = seen.get((edge, got), 0) + 1
    assert set(seen) == {(e, v) for e in EDGES for v in ("ok", "UnnormalizedQ")}, seen


def test_random_rows_near_both_edges_decode_or_raise_wire_errors():
    rng = np.random.default_rng(13)
    seen = set()
    for i in range(2000):
        n = int(rng.integers(1, S + 1))
        ids = np.full(S, -1, np.int32)
        ids[:n] = rng.choice(V, n, replace=False)
        q = rng.random(n) + 1e-3
        mass = EDGES[i % 2] + rng.uniform(-1e-6, 1e-6)
        lp = np.full(S, -np.inf, np.float32)
        lp[:n] = np.log(q / q.sum() * mass)
        got = _verdict(ids, lp)
        assert got == _expected(ids, lp), (ids.tolist(), lp.view(np.uint32).tolist())
        seen.add(got)
    assert seen == {"ok", "UnnormalizedQ"}


class _EdgeDrafter:
    """A hostile drafter: answers round i with ``rows[i]`` as the q of its one draft (the
    encoder does not check normalization, so the rows reach the target as they are)."""

    def __init__(self, rows: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.rows = iter(rows)

    def handle(self, propose: Propose) -> ProposalFrame:
        ids, lp = next(self.rows)
        (it,) = propose.items
        return ProposalFrame(propose.round_id, (DraftItem(
            it.request_id, ItemStatus.OK, torch.tensor([int(ids[0])]), QKind.SPARSE,
            torch.from_numpy(lp.reshape(1, -1).copy()),
            torch.from_numpy(ids.astype(np.int64).reshape(1, -1))),))

    def release(self, request_ids: tuple[int, ...]) -> None:
        pass


def test_a_drafter_answering_at_the_edge_gets_missing_invalid_from_the_client():
    rng = np.random.default_rng(14)
    rows = []
    for edge in EDGES:  # the rows on both sides of the verdict's switch, 3 ulps each way
        ids = rng.choice(V, S, replace=False).astype(np.int32)
        run = list(_ulp_rows(rng, edge))
        verdicts = [_expected(ids, lp) for lp in run]
        switch = next(i for i in range(1, len(run)) if verdicts[i] != verdicts[i - 1])
        rows += [(ids, lp) for lp in run[switch - 3:switch + 3]]
    key = b"edge-key-0123456789abcdef"
    item = ProposeItem(1, torch.tensor([5]), 0, 1, 1, RequestParams(1.0, 0, 1.0, 3), None)
    seen = set()
    with ServerThread(_EdgeDrafter(rows), HELLO, key) as srv, DraftClient(
            "127.0.0.1", srv.port, key, vocab_size=V, tokenizer_fingerprint=bytes(32)) as c:
        for ids, lp in rows:
            want = _expected(ids, lp)
            got = c.propose([item], 5.0)
            seen.add(want)
            if want == "ok":
                assert isinstance(got[0], DraftItem) and int(got[0].tokens[0]) == ids[0]
            else:
                assert got == [Missing(MissingReason.INVALID)]
        assert c.connects == 1 + sum(_expected(i, lp) != "ok" for i, lp in rows[:-1])
    assert seen == {"ok", "UnnormalizedQ"}
