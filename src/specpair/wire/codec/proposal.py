"""PROPOSAL bodies (docs/wire.md 3.4): drafted tokens and their laws q."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import torch

from specpair.proposal import QKind
from specpair.wire.codec import _sparse
from specpair.wire.codec.body import (
    ZERO8,
    append_block,
    block_end,
    decode_round,
    encode_round,
    view,
)
from specpair.wire.codec.header import NORM_TOLERANCE, Limits, check_u64
from specpair.wire.codec.qcheck import check_dense, check_tokens, sparse_error
from specpair.wire.errors import (
    BadDtype,
    BadShape,
    DecodeError,
    DepthLimit,
    DuplicateRequest,
    SupportLimit,
    TokenOutOfRange,
    TrailingBytes,
    Truncated,
    UndeclaredEncoding,
    UnknownCode,
)
from specpair.wire.frames import DraftItem, Hello, ItemStatus, ProposalFrame

__all__ = ["encode_proposal", "decode_proposal"]

_ITEM = struct.Struct("<QBBHI")  # request_id, status, kind, depth, support
_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_OK, _SPARSE = ItemStatus.OK, QKind.SPARSE
_from_numpy = torch.from_numpy
_ZERO4 = ZERO8[:4]  # the padding after an odd number of 4-byte values
_NP_DTYPE = {torch.float32: np.dtype(np.float32), torch.int64: np.dtype(np.int64)}
_TOKENS: dict[int, Callable[..., bytes]] = {}  # K -> pack of K i32 and their padding
_INT32_MAX = (1 << 31) - 1
_STATUS_OF = {int(s): s for s in ItemStatus}
_KIND_OF = {int(k): k for k in QKind}
_NO_TOKENS = np.zeros(0, dtype=np.int64)


def _np(t: torch.Tensor | None, dtype: torch.dtype, what: str) -> np.ndarray:
    """A numpy view of ``t`` (a copy when it needs grad or is not on the CPU), which must
    be a ``dtype`` tensor. One call into torch: shapes are read from the view."""
    if t is None:
        raise BadShape(f"{what} is missing")
    try:
        a = t.numpy()
    except (RuntimeError, TypeError):  # needs grad, not on the CPU, or no numpy dtype
        if t.dtype != dtype:
            raise BadDtype(f"{what} must be {dtype}, got {t.dtype}") from None
        a = t.detach().cpu().numpy()
    if a.dtype != _NP_DTYPE[dtype]:
        raise BadDtype(f"{what} must be {dtype}, got {t.dtype}")
    return a


def _tokens_i32(toks: torch.Tensor) -> bytes:
    """[K] int64 drafted ids as i32 bytes, zero-padded to 8."""
    if toks.dtype != torch.int64:
        raise BadDtype(f"tokens must be int64, got {toks.dtype}")
    tl = toks.tolist()
    if min(tl) < 0 or max(tl) > _INT32_MAX:
        raise TokenOutOfRange("drafted token ids must lie in [0, 2^31)")
    k = len(tl)
    pack = _TOKENS.get(k)
    if pack is None:
        pack = _TOKENS[k] = struct.Struct(f"<{k}i{(k & 1) * 4}x").pack
    return pack(*tl)


def _as_i32(a: np.ndarray, lo: int, what: str) -> bytes:
    """int64 ``a`` as i32 bytes; every value must lie in [lo, 2^31)."""
    blob = _sparse.i32(np.ascontiguousarray(a), lo)
    if blob is None:
        raise TokenOutOfRange(f"{what} must lie in [{lo}, 2^31)")
    return blob


def _encode_item(it: DraftItem, parts: list[bytes], limits: Limits,
                 support: list[tuple[int, np.ndarray]]) -> None:
    """Append ``it``'s bytes to ``parts``; a SPARSE item's support ids go into ``support``
    as (slot in ``parts``, int64 ids), for ``encode_proposal`` to check and cast."""
    check_u64(it.request_id, "request_id")
    kind = it.kind
    if it.status != _OK:
        if it.tokens.numel() or it.q_logp is not None or it.q_ids is not None:
            raise BadShape(f"request {it.request_id}: a {it.status.name} item carries "
                           "no tokens or q")
        parts.append(_ITEM.pack(it.request_id, it.status, kind, 0, 0))
        return
    shape = it.tokens.shape
    if len(shape) != 1 or not 1 <= shape[0] <= limits.depth:
        raise DepthLimit(f"request {it.request_id}: tokens must be [K] with 1 <= K <= "
                         f"{limits.depth}, got {list(shape)}")
    k = shape[0]
    toks = _tokens_i32(it.tokens)
    if kind == QKind.POINT_MASS:
        if it.q_logp is not None or it.q_ids is not None:
            raise BadShape("POINT_MASS carries no q tensors")
        parts += (_ITEM.pack(it.request_id, 0, kind, k, 0), toks)
        return
    lp = _np(it.q_logp, torch.float32, "q_logp")
    shape = lp.shape
    if len(shape) != 2 or shape[0] != k:
        raise BadShape(f"request {it.request_id}: q_logp must be [K={k}, S|V] fp32, "
                       f"got {list(shape)}")
    width = shape[1]
    if kind == _SPARSE:
        if not 1 <= width <= limits.support:
            raise SupportLimit(f"SPARSE support {width} outside 1..{limits.support}")
        ids = _np(it.q_ids, torch.int64, "q_ids")
        if ids.shape != shape:
            raise BadShape(f"q_ids must have shape {list(shape)}, got {list(ids.shape)}")
        pad = _ZERO4 if k * width & 1 else b""
        parts += (_ITEM.pack(it.request_id, 0, kind, k, width), toks)
        support.append((len(parts), ids))
        parts += (b"", pad, lp.astype(_F32, copy=False).tobytes(), pad)
        return
    if it.q_ids is not None:
        raise BadShape("DENSE carries no q_ids")
    parts += (_ITEM.pack(it.request_id, 0, kind, k, 0), toks)
    append_block(parts, lp.astype(_F32, copy=False).tobytes())


def encode_proposal(frame: ProposalFrame, limits: Limits) -> list[bytes]:
    """The body parts of a PROPOSAL (shapes, dtypes and limits checked). The support ids
    of all SPARSE items are range-checked and cast to i32 together, after the items."""
    support: list[tuple[int, np.ndarray]] = []
    parts = encode_round(frame.round_id, frame.items, limits,
                         lambda it, parts, lim: _encode_item(it, parts, lim, support))
    if support:
        every = support[0][1] if len(support) == 1 else np.concatenate(
            [a for _, a in support], axis=None)
        blob = _as_i32(every, -1, "support ids")
        at = 0
        for slot, a in support:
            parts[slot] = blob[at:at + 4 * a.size]
            at += 4 * a.size
    return parts


def decode_proposal(buf, end: int, hello: Hello, limits: Limits) -> ProposalFrame:
    """Decode and check a PROPOSAL body in ``buf[16:end]`` against ``hello``.

    SPARSE items are checked together: consecutive items of the same (K, S) sit at a
    fixed stride, so one compiled pass checks the whole run (``_sparse_run``).
    """
    round_id, n, off = decode_round(buf, end, "PROPOSAL", limits)
    caps = min(limits.depth, hello.max_depth), min(limits.support, hello.max_support)
    items: list[DraftItem | None] = [None] * n
    runs: list[tuple[int, int, int, list[tuple[int, int]]]] = []  # K, S, offset, [(i, rid)]
    seen: set[int] = set()
    for i in range(n):
        rid, item, nxt = _decode_item(buf, off, end, hello, caps)
        if rid in seen:
            raise DuplicateRequest(f"request {rid} appears twice in one PROPOSAL")
        seen.add(rid)
        if item.__class__ is tuple:  # SPARSE (K, S): checked below, run by run
            if runs and runs[-1][3][-1][0] == i - 1 and runs[-1][:2] == item:
                runs[-1][3].append((i, rid))
            else:
                runs.append((*item, off, [(i, rid)]))
        else:
            items[i] = item
        off = nxt
    if off != end:
        raise TrailingBytes(f"PROPOSAL has {end - off} bytes after its last item")
    for k, s, first, run in runs:
        _sparse_run(buf, run, k, s, first, hello.vocab_size, items)
    return ProposalFrame(round_id, tuple(items))


def _sparse_run(buf, run: list[tuple[int, int]], k: int, s: int, first: int, vocab: int,
                items: list) -> None:
    """Check a run of consecutive SPARSE items of one (K, S) that starts at offset
    ``first``; put them into ``items``. One compiled pass (``_sparse.c``) checks and
    widens them all, or names the first failing row and check, which
    ``qcheck.sparse_error`` turns into the wire error."""
    pt, pq = _aligned(4 * k), _aligned(4 * k * s)
    stride = _ITEM.size + pt + 2 * pq  # every item of the run has this size
    n = len(run)
    toks64, ids64 = np.empty((n, k), np.int64), np.empty((n, k, s), np.int64)
    lp32 = np.empty((n, k, s), np.float32)
    bad = _sparse.decode_run(buf, first + _ITEM.size, n, k, s, stride, vocab, NORM_TOLERANCE,
                             toks64, ids64, lp32)
    if bad is not None:
        j, r = divmod(bad[0], k)
        raise sparse_error(bad[1], run[j][1], r, int(toks64[j, r]), vocab)
    for j, (i, rid) in enumerate(run):
        items[i] = DraftItem(rid, _OK, _from_numpy(toks64[j]), _SPARSE, _from_numpy(lp32[j]),
                             _from_numpy(ids64[j]))


def _aligned(n: int) -> int:
    return n + (-n % 8)


def _sparse_end(buf, off: int, end: int, k: int, s: int) -> int:
    """The offset after a SPARSE item's tokens, ids and log q blocks at ``off`` (each
    within the frame, each zero-padded to 8; block sizes are multiples of 4)."""
    nt, nq = 4 * k, 4 * k * s
    pt, pq = _aligned(nt), _aligned(nq)
    nxt = off + pt + 2 * pq
    if nxt <= end and (pt == nt or buf[off + nt:off + pt] == _ZERO4) and (
            pq == nq or buf[off + pt + nq:off + pt + pq] == _ZERO4 == buf[nxt - 4:nxt]):
        return nxt
    off = block_end(buf, off, nt, end, "drafted tokens")  # names the failure
    off = block_end(buf, off, nq, end, "support ids")
    return block_end(buf, off, nq, end, "SPARSE log q")


def _decode_item(buf, off: int, end: int, hello: Hello,
                 caps: tuple[int, int]) -> tuple[int, DraftItem | tuple[int, int], int]:
    """(request id, the item or for a SPARSE one still to check its (K, S), next offset).
    ``caps``: the largest K and S allowed (the limits and the HELLO's, whichever is less)."""
    if off + _ITEM.size > end:
        raise Truncated("PROPOSAL item header is cut short")
    rid, status, kind, k, s = _ITEM.unpack_from(buf, off)
    off += _ITEM.size
    status, kind = _STATUS_OF.get(status), _KIND_OF.get(kind)
    if status is None or kind is None:
        raise UnknownCode(f"request {rid}: unknown status or q kind code")
    if status != ItemStatus.OK:
        if k or s:
            raise BadShape(f"request {rid}: a non-OK item must have depth 0 and support 0")
        tokens = torch.from_numpy(_NO_TOKENS.copy())
        return rid, DraftItem(rid, status, tokens, kind, None, None), off
    cap = caps[0]
    if not 1 <= k <= cap:
        raise DepthLimit(f"request {rid}: depth {k} outside 1..{cap}")
    if kind not in hello.q_encodings:  # POINT_MASS to an item that did not ask: source.answers
        raise UndeclaredEncoding(f"request {rid}: q encoding {kind.name} was not declared "
                                 f"by a {hello.mode.name} drafter")
    v = hello.vocab_size
    if kind == _SPARSE:
        cap = caps[1]
        if not 1 <= s <= cap:
            raise SupportLimit(f"request {rid}: SPARSE support {s} outside 1..{cap}")
        return rid, (k, s), _sparse_end(buf, off, end, k, s)
    toks, off = view(buf, off, _I32, k, end, "drafted tokens")
    if s:
        raise SupportLimit(f"request {rid}: {kind.name} items carry support 0, got {s}")
    tokens = torch.from_numpy(toks.astype(np.int64))
    try:
        if kind == QKind.POINT_MASS:
            check_tokens(toks, v)
            return rid, DraftItem(rid, ItemStatus.OK, tokens, kind, None, None), off
        lp, off = view(buf, off, _F32, k * v, end, "DENSE log q", (k, v))
        check_dense(toks, lp, v)
    except DecodeError as exc:
        raise type(exc)(f"request {rid}: {exc}") from None
    return rid, DraftItem(rid, ItemStatus.OK, tokens, kind, torch.from_numpy(lp.copy()), None), off
