"""Round trips and the stated limits of the wire codec (docs/wire.md)."""

from __future__ import annotations

import dataclasses
import struct

import crc32c
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_helpers import (
    U64,
    hellos,
    make_hello,
    proposals,
    proposes,
    same,
    sparse_item,
    status_item,
)

from specpair.errors import SpecpairError
from specpair.proposal import QKind
from specpair.wire import errors as E
from specpair.wire.codec import decode, encode
from specpair.wire.codec.header import HEADER, LIMITS, MAGIC, PREAUTH_FRAME_BYTES, Limits
from specpair.wire.frames import (
    Auth,
    AuthOk,
    Challenge,
    ErrorFrame,
    FeatureKind,
    FeatureSpec,
    ItemStatus,
    ProposalFrame,
    Propose,
    Release,
)

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def roundtrip(frame, hello=None):
    data = encode(frame)
    assert len(data) % 8 == 0 and data[:4] == MAGIC
    back = decode(data, hello)
    assert same(back, frame), (back, frame)
    assert encode(back) == data  # one encoding per frame
    return data


@SETTINGS
@given(hellos())
def test_hello_round_trip(hello):
    assert len(roundtrip(hello)) == HEADER.size + 56


@SETTINGS
@given(st.data())
def test_propose_round_trip(data):
    hello = data.draw(hellos())
    roundtrip(data.draw(proposes(hello)), hello)


@SETTINGS
@given(st.data())
def test_proposal_round_trip(data):
    hello = data.draw(hellos())
    roundtrip(data.draw(proposals(hello)), hello)


@SETTINGS
@given(st.lists(U64, min_size=1, max_size=50, unique=True))
def test_release_round_trip(ids):
    roundtrip(Release(tuple(ids)))


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.text(max_size=200))
def test_error_round_trip(code, msg):
    roundtrip(ErrorFrame(code, msg))


@SETTINGS
@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_auth_frames_round_trip(a, b):
    roundtrip(Challenge(a))
    roundtrip(Auth(a, b))
    roundtrip(AuthOk(b))


def test_sparse_top64_request_round_fits_3kb():
    """docs/wire.md: SPARSE top-64, K=5, V=129280 is 2,632 bytes for one request."""
    hello = make_hello(129280, max_support=64)
    item = sparse_item(np.random.default_rng(0), 1, 129280, 5, 64, ragged=False)
    data = roundtrip(ProposalFrame(1, (item,)), hello)
    assert len(data) == 16 + 16 + 16 + 24 + 1280 + 1280 <= 3072


def test_tensor_blocks_are_8_aligned():
    hello = make_hello(1000)
    item = sparse_item(np.random.default_rng(1), 1, 1000, 3, 5, ragged=False)  # 12- and 60-byte
    data = encode(ProposalFrame(1, (item,)))
    ids_off = 16 + 16 + 16 + 16  # header, body header, item header, tokens (12 -> 16)
    got = np.frombuffer(data, "<i4", 15, ids_off)
    assert np.array_equal(got, item.q_ids.numpy().ravel())
    assert decode(data, hello).items[0].q_ids.equal(item.q_ids)


def test_crc_covers_header_and_body_but_not_itself():
    data = bytearray(encode(Release((5, 6))))
    want = crc32c.crc32c(bytes(data[16:]), crc32c.crc32c(bytes(data[:12])))
    assert struct.unpack_from("<I", data, 12)[0] == want
    for i in [4, 8, 16, len(data) - 1]:  # version, length and body bytes are covered
        bad = bytearray(data)
        bad[i] ^= 1
        with pytest.raises((E.BadChecksum, E.BadVersion, E.Misaligned)):
            decode(bytes(bad))


def test_errors_share_the_bases():
    for name in E.__all__:
        cls = getattr(E, name)
        if isinstance(cls, type) and issubclass(cls, Exception):
            assert issubclass(cls, E.WireError) and issubclass(cls, SpecpairError), name


def test_decode_needs_the_hello_for_token_frames():
    hello = make_hello(1000)
    data = encode(ProposalFrame(1, (status_item(1, ItemStatus.RESYNC),)))
    with pytest.raises(E.NoHello):
        decode(data)
    assert decode(data, hello).items[0].status == ItemStatus.RESYNC


def test_limits_are_enforced_on_both_sides():
    small = Limits(frame_bytes=4096, requests=2, depth=4, support=8)
    hello = make_hello(1000, max_depth=4, max_support=8)
    rng = np.random.default_rng(2)
    three = ProposalFrame(1, tuple(status_item(i, ItemStatus.REFUSED) for i in range(3)))
    with pytest.raises(E.RequestLimit):
        encode(three, small)
    with pytest.raises(E.RequestLimit):
        decode(encode(three), hello, small)
    deep = ProposalFrame(1, (sparse_item(rng, 1, 1000, 5, 4),))
    with pytest.raises(E.DepthLimit):
        encode(deep, small)
    with pytest.raises(E.DepthLimit):
        decode(encode(deep), hello)  # the HELLO's max_depth 4 applies too
    wide = ProposalFrame(1, (sparse_item(rng, 1, 1000, 2, 9),))
    with pytest.raises(E.SupportLimit):
        decode(encode(wide), hello)
    big = ProposalFrame(1, (sparse_item(rng, 1, 1000, 4, 8),) * 1)
    data = encode(big)
    with pytest.raises(E.FrameTooLarge):
        decode(data, hello, Limits(frame_bytes=len(data) - 8))
    with pytest.raises(E.FrameTooLarge):
        encode(big, Limits(frame_bytes=len(data) - 8))
    with pytest.raises(E.FrameTooLarge):  # before authentication only small frames pass
        decode(encode(ErrorFrame(1, "x" * PREAUTH_FRAME_BYTES)), authenticated=False)
    with pytest.raises(E.MessageLimit):
        encode(ErrorFrame(1, "x" * (LIMITS.message + 1)))


def test_features_must_match_the_hello():
    spec = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.bfloat16, 6)
    hello = make_hello(1000, features=spec)
    from wire_helpers import propose_item
    it = propose_item(np.random.default_rng(3), 9, hello, n_new=4)
    frame = Propose(1, (it,))
    back = decode(encode(frame), hello)
    assert back.items[0].features.dtype == torch.bfloat16
    assert torch.equal(back.items[0].features, it.features)  # aligned row per new token
    with pytest.raises(E.FeatureMismatch):
        decode(encode(frame), make_hello(1000))
    with pytest.raises(E.FeatureMismatch):
        decode(encode(Propose(1, (dataclasses.replace(it, features=None),))), hello)
    with pytest.raises(E.BadShape):
        encode(Propose(1, (dataclasses.replace(it, features=it.features[:2]),)))


def test_encoder_refuses_bad_shapes_dtypes_and_wrapping_ids():
    rng = np.random.default_rng(4)
    it = sparse_item(rng, 1, 1000, 2, 4)
    with pytest.raises(E.BadDtype):
        encode(ProposalFrame(1, (dataclasses.replace(it, q_logp=it.q_logp.double()),)))
    with pytest.raises(E.BadShape):
        encode(ProposalFrame(1, (dataclasses.replace(it, q_ids=it.q_ids[:, :2]),)))
    wrap = it.q_ids.clone()
    wrap[0, 0] = (1 << 32) + 5  # would alias id 5 if cast blindly to int32
    with pytest.raises(E.TokenOutOfRange):
        encode(ProposalFrame(1, (dataclasses.replace(it, q_ids=wrap),)))
    with pytest.raises(E.BadShape):
        encode(ProposalFrame(1, (dataclasses.replace(it, kind=QKind.DENSE),)))
    with pytest.raises(E.BadShape):
        encode(ProposalFrame(1 << 64, (it,)))


def test_encoder_checks_the_support_ids_of_every_sparse_item_of_a_frame():
    """The encoder range-checks all SPARSE items' ids in one pass: a bad id in any item is
    refused, padding (-1) is not, and each item's bytes land in its own place."""
    rng = np.random.default_rng(5)
    items = [sparse_item(rng, r, 1000, 3, 8, ragged=r != 1) for r in range(3)]
    full = [sparse_item(rng, 10 + r, 1000, 3, 8, ragged=False) for r in range(2)]
    hello = make_hello(1000, max_depth=3, max_support=8)
    data = roundtrip(ProposalFrame(1, (*items, *full)), hello)
    alone = [encode(ProposalFrame(1, (it,)))[32:] for it in (*items, *full)]
    assert data[32:] == b"".join(alone)
    for bad in ((1 << 32) + 5, -2, 1 << 31):
        ids = items[2].q_ids.clone()
        ids[1, 0] = bad
        with pytest.raises(E.TokenOutOfRange):
            encode(ProposalFrame(1, (*items[:2], dataclasses.replace(items[2], q_ids=ids))))
