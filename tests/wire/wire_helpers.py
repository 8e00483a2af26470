"""Shared by the wire tests: frame builders, hypothesis strategies, frame equality."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import strategies as st

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire.codec import encode
from specpair.wire.codec.header import VERSION
from specpair.wire.frames import (
    DraftItem,
    FeatureKind,
    FeatureSpec,
    Hello,
    ItemStatus,
    ProposalFrame,
    Propose,
    ProposeItem,
    RequestParams,
)

U64 = st.integers(0, (1 << 64) - 1)
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
FEATURE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def make_hello(vocab: int = 1000, *, kinds=(QKind.SPARSE, QKind.DENSE), max_depth: int = 8,
               max_support: int = 64, features: FeatureSpec | None = None) -> Hello:
    mode = DraftMode.GREEDY if kinds == (QKind.POINT_MASS,) else DraftMode.SAMPLED
    return Hello(VERSION, mode, vocab, bytes(range(32)), tuple(kinds), max_depth,
                 min(max_support, vocab), features)


def sparse_item(rng: np.random.Generator, rid: int, vocab: int, depth: int, support: int,
                ragged: bool = True) -> DraftItem:
    """A valid SPARSE item: per row c <= S distinct ids, normalized fp32 log q, d in support."""
    ids = np.full((depth, support), -1, dtype=np.int64)
    lp = np.full((depth, support), -np.inf, dtype=np.float32)
    toks = np.zeros(depth, dtype=np.int64)
    for k in range(depth):
        c = int(rng.integers(1, support + 1)) if ragged else support
        ids[k, :c] = rng.choice(vocab, size=c, replace=False)
        lp[k, :c] = torch.log_softmax(torch.from_numpy(rng.normal(size=c) * 2).float(), 0)
        toks[k] = ids[k, int(rng.integers(0, c))]
    return DraftItem(rid, ItemStatus.OK, torch.from_numpy(toks), QKind.SPARSE,
                     torch.from_numpy(lp), torch.from_numpy(ids))


def one_row_proposal(ids: np.ndarray, lp: np.ndarray) -> bytes:
    """A PROPOSAL of request 1 with one SPARSE item, K = 1: support ``ids`` [S], log q
    ``lp`` [S] fp32, drafting ids[0]. Not checked beyond what the encoder checks."""
    item = DraftItem(1, ItemStatus.OK, torch.tensor([int(ids[0])]), QKind.SPARSE,
                     torch.from_numpy(np.asarray(lp, np.float32).reshape(1, -1).copy()),
                     torch.from_numpy(np.asarray(ids, np.int64).reshape(1, -1)))
    return encode(ProposalFrame(1, (item,)))


def dense_item(rng: np.random.Generator, rid: int, vocab: int, depth: int) -> DraftItem:
    w = torch.from_numpy(rng.normal(size=(depth, vocab)) * 2).float()
    w[torch.from_numpy(rng.random((depth, vocab)) < 0.3)] = float("-inf")
    w[:, 0] = 0.0  # at least one finite entry per row
    lp = torch.log_softmax(w, dim=1)
    toks = torch.tensor([int(rng.choice(np.flatnonzero(np.isfinite(r)))) for r in lp.numpy()])
    return DraftItem(rid, ItemStatus.OK, toks, QKind.DENSE, lp, None)


def point_item(rng: np.random.Generator, rid: int, vocab: int, depth: int) -> DraftItem:
    toks = torch.from_numpy(rng.integers(0, vocab, size=depth))
    return DraftItem(rid, ItemStatus.OK, toks, QKind.POINT_MASS, None, None)


def status_item(rid: int, status: ItemStatus) -> DraftItem:
    return DraftItem(rid, status, torch.zeros(0, dtype=torch.int64), QKind.SPARSE, None, None)


def propose_item(rng: np.random.Generator, rid: int, hello: Hello, n_new: int = 3,
                 depth: int = 4, seed: int = 7) -> ProposeItem:
    v = hello.vocab_size
    feats = None
    if hello.features is not None:
        feats = torch.from_numpy(rng.normal(size=(n_new, hello.features.width))).to(
            hello.features.dtype)
    return ProposeItem(rid, torch.from_numpy(rng.integers(0, v, size=n_new)),
                       int(rng.integers(0, 3)), n_new + int(rng.integers(0, 50)), depth,
                       RequestParams(1.0, 0, 1.0, seed), feats)


# ---- hypothesis strategies -----------------------------------------------------------

@st.composite
def hellos(draw) -> Hello:
    vocab = draw(st.integers(2, 3000))
    kinds = draw(st.sampled_from([(QKind.SPARSE,), (QKind.DENSE,), (QKind.SPARSE, QKind.DENSE),
                                  (QKind.POINT_MASS,)]))
    spec = draw(st.none() | st.builds(FeatureSpec, st.sampled_from(list(FeatureKind)),
                                      st.sampled_from(FEATURE_DTYPES), st.integers(1, 16)))
    h = make_hello(vocab, kinds=kinds, max_depth=draw(st.integers(1, 32)),
                   max_support=draw(st.integers(1, 64)), features=spec)
    return dataclasses.replace(h, tokenizer_fingerprint=draw(st.binary(min_size=32, max_size=32)))


F32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def proposes(draw, hello: Hello) -> Propose:
    n = draw(st.integers(1, 4))
    rids = draw(st.lists(U64, min_size=n, max_size=n, unique=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    items = []
    for rid in rids:
        it = propose_item(rng, rid, hello, n_new=draw(st.integers(1, 12)),
                          depth=draw(st.integers(1, hello.max_depth)))
        params = RequestParams(draw(F32.filter(lambda x: x >= 0)), draw(st.integers(0, 2**63 - 1)),
                               draw(st.floats(0, 1, width=32, exclude_min=True)), draw(I64))
        items.append(dataclasses.replace(it, params=params,
                                         position=it.new_tokens.shape[0] + draw(
                                             st.integers(0, 2**63 - 1 - 12)),
                                         num_accepted=draw(st.integers(0, 32))))
    return Propose(draw(U64), tuple(items))


@st.composite
def proposals(draw, hello: Hello) -> ProposalFrame:
    n = draw(st.integers(1, 4))
    rids = draw(st.lists(U64, min_size=n, max_size=n, unique=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    items = []
    for rid in rids:
        status = draw(st.sampled_from([ItemStatus.OK] * 3 + [ItemStatus.RESYNC,
                                                              ItemStatus.REFUSED]))
        if status != ItemStatus.OK:
            items.append(status_item(rid, status))
            continue
        kind = draw(st.sampled_from(hello.q_encodings))
        depth = draw(st.integers(1, hello.max_depth))
        if kind == QKind.SPARSE:
            s = draw(st.integers(1, hello.max_support))
            items.append(sparse_item(rng, rid, hello.vocab_size, depth, s))
        elif kind == QKind.DENSE:
            items.append(dense_item(rng, rid, hello.vocab_size, depth))
        else:
            items.append(point_item(rng, rid, hello.vocab_size, depth))
    return ProposalFrame(draw(U64), tuple(items))


def same(a, b) -> bool:
    """Deep equality of frames: tensors equal in dtype, shape and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(
            same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b
