"""Greedy drafts per item (docs/wire.md 3.3, ``draft_mode``): a PROPOSE item may ask a SAMPLED
drafter that declared POINT_MASS for argmax drafts, and the target takes POINT_MASS q only
for an item that asked for it (or from a GREEDY drafter): a sampled draft verified as a point
mass would bias the output."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from wire_helpers import make_hello, point_item, propose_item, sparse_item

from specpair.proposal import QKind
from specpair.wire.codec import decode, encode
from specpair.wire.errors import UndeclaredEncoding
from specpair.wire.frames import Propose
from specpair.wire.source import Missing, MissingReason, answers

V = 1000
BOTH = make_hello(V, kinds=(QKind.SPARSE, QKind.DENSE, QKind.POINT_MASS))


def test_a_greedy_item_round_trips_beside_a_sampled_one():
    rng = np.random.default_rng(0)
    items = (replace(propose_item(rng, 1, BOTH), greedy=True), propose_item(rng, 2, BOTH))
    got = decode(encode(Propose(3, items)), BOTH)
    assert [it.greedy for it in got.items] == [True, False]


def test_greedy_items_only_to_a_drafter_that_declared_point_mass():
    rng = np.random.default_rng(1)
    frame = encode(Propose(3, (replace(propose_item(rng, 1, BOTH), greedy=True),)))
    with pytest.raises(UndeclaredEncoding):
        decode(frame, make_hello(V))  # SPARSE and DENSE only


@pytest.mark.parametrize(("greedy_asked", "kind", "expect"), [
    (True, QKind.POINT_MASS, None),  # argmax drafts, asked for
    (False, QKind.SPARSE, None),  # sampled drafts, asked for
    (False, QKind.POINT_MASS, MissingReason.INVALID),  # never verify a sampled draft as a point
    (True, QKind.SPARSE, MissingReason.MISMATCH),  # not what was asked
])
def test_answers_take_point_mass_only_where_asked(greedy_asked, kind, expect):
    rng = np.random.default_rng(2)
    asked = replace(propose_item(rng, 7, BOTH, depth=3), greedy=greedy_asked)
    item = (point_item(rng, 7, V, 3) if kind == QKind.POINT_MASS
            else sparse_item(rng, 7, V, 3, 8))
    got = answers([asked], [item], BOTH)[0]
    if expect is None:
        assert got is item
    else:
        assert got == Missing(expect)


def test_a_greedy_drafter_answers_point_mass_to_every_item():
    rng = np.random.default_rng(3)
    greedy = make_hello(V, kinds=(QKind.POINT_MASS,))
    item = point_item(rng, 7, V, 3)
    assert answers([propose_item(rng, 7, greedy, depth=3)], [item], greedy)[0] is item
