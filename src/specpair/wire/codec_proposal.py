"""PROPOSAL bodies (docs/wire.md 3.4): drafted tokens and their laws q."""

from __future__ import annotations

import struct

import numpy as np
import torch

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire.blocks import append_block, block_end, view
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
from specpair.wire.format import Limits, check_u64
from specpair.wire.frames import DraftItem, Hello, ItemStatus, ProposalFrame
from specpair.wire.qcheck import check_dense, check_sparse, check_tokens, sparse_ok
from specpair.wire.rounds import decode_round, encode_round

__all__ = ["encode_proposal", "decode_proposal"]

_ITEM = struct.Struct("<QBBHI")  # request_id, status, kind, depth, support
_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_INT32_MAX = (1 << 31) - 1
_STATUS_OF = {int(s): s for s in ItemStatus}
_KIND_OF = {int(k): k for k in QKind}
_NO_TOKENS = np.zeros(0, dtype=np.int64)


def _np(t: torch.Tensor | None, dtype: torch.dtype, shape: tuple[int, ...], what: str):
    if t is None:
        raise BadShape(f"{what} is missing")
    if t.dtype != dtype:
        raise BadDtype(f"{what} must be {dtype}, got {t.dtype}")
    if t.shape != shape:
        raise BadShape(f"{what} must have shape {list(shape)}, got {list(t.shape)}")
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # requires grad, or not on the CPU
        return t.detach().cpu().numpy()


def _tokens_i32(t: torch.Tensor, k: int) -> bytes:
    if t.dtype != torch.int64:
        raise BadDtype(f"tokens must be int64, got {t.dtype}")
    tl = t.tolist()
    if min(tl) < 0 or max(tl) > _INT32_MAX:
        raise TokenOutOfRange("drafted token ids must lie in [0, 2^31)")
    return struct.pack(f"<{k}i", *tl)


def _as_i32(a: np.ndarray, lo: int, what: str) -> bytes:
    # a - lo as uint64 maps [lo, 2^31) onto [0, 2^31 - lo) and everything else above it
    if a.size and int(np.maximum.reduce((a - lo).view(np.uint64), axis=None)) > _INT32_MAX - lo:
        raise TokenOutOfRange(f"{what} must lie in [{lo}, 2^31)")
    return a.astype(_I32).tobytes()


def _encode_item(it: DraftItem, parts: list[bytes], limits: Limits) -> None:
    check_u64(it.request_id, "request_id")
    if it.status != ItemStatus.OK:
        if it.tokens.numel() or it.q_logp is not None or it.q_ids is not None:
            raise BadShape(f"request {it.request_id}: a {it.status.name} item carries "
                           "no tokens or q")
        parts.append(_ITEM.pack(it.request_id, it.status, it.kind, 0, 0))
        return
    if it.tokens.ndim != 1 or not 1 <= it.tokens.shape[0] <= limits.depth:
        raise DepthLimit(f"request {it.request_id}: tokens must be [K] with 1 <= K <= "
                         f"{limits.depth}, got {list(it.tokens.shape)}")
    k = it.tokens.shape[0]
    toks = _tokens_i32(it.tokens, k)
    if it.kind == QKind.POINT_MASS:
        if it.q_logp is not None or it.q_ids is not None:
            raise BadShape("POINT_MASS carries no q tensors")
        parts.append(_ITEM.pack(it.request_id, 0, it.kind, k, 0))
        append_block(parts, toks)
        return
    if it.q_logp is None or it.q_logp.ndim != 2:
        raise BadShape(f"request {it.request_id}: q_logp must be [K, S|V] fp32")
    width = it.q_logp.shape[1]
    lp = _np(it.q_logp, torch.float32, (k, width), "q_logp")
    if it.kind == QKind.SPARSE:
        if not 1 <= width <= limits.support:
            raise SupportLimit(f"SPARSE support {width} outside 1..{limits.support}")
        ids = _as_i32(_np(it.q_ids, torch.int64, (k, width), "q_ids"), -1, "support ids")
        parts.append(_ITEM.pack(it.request_id, 0, it.kind, k, width))
        append_block(parts, toks)
        append_block(parts, ids)
    else:
        if it.q_ids is not None:
            raise BadShape("DENSE carries no q_ids")
        parts.append(_ITEM.pack(it.request_id, 0, it.kind, k, 0))
        append_block(parts, toks)
    append_block(parts, lp.astype(_F32, copy=False).tobytes())


def encode_proposal(frame: ProposalFrame, limits: Limits) -> list[bytes]:
    """The body parts of a PROPOSAL (shapes, dtypes and limits checked)."""
    return encode_round(frame.round_id, frame.items, limits, _encode_item)


def decode_proposal(buf, end: int, hello: Hello, limits: Limits) -> ProposalFrame:
    """Decode and check a PROPOSAL body in ``buf[16:end]`` against ``hello``.

    SPARSE items are checked together: consecutive items of the same (K, S) sit at a
    fixed stride, so one strided numpy view covers them all and one pass of checks
    serves the whole run (the per-item checks run only to name a failing item).
    """
    round_id, n, off = decode_round(buf, end, "PROPOSAL", limits)
    items: list[DraftItem | None] = []
    runs: list[list[tuple[int, int, int, int, int]]] = []  # [(index, rid, k, s, offset)]
    seen: set[int] = set()
    for i in range(n):
        rid, item, nxt = _decode_item(buf, off, end, hello, limits)
        if rid in seen:
            raise DuplicateRequest(f"request {rid} appears twice in one PROPOSAL")
        seen.add(rid)
        if isinstance(item, tuple):  # SPARSE (K, S): checked below, run by run
            k, s = item
            item = None
            last = runs[-1][-1] if runs else None
            if last is not None and last[0] == i - 1 and last[2:4] == (k, s):
                runs[-1].append((i, rid, k, s, off))
            else:
                runs.append([(i, rid, k, s, off)])
        items.append(item)
        off = nxt
    if off != end:
        raise TrailingBytes(f"PROPOSAL has {end - off} bytes after its last item")
    for run in runs:
        _sparse_run(buf, run, hello.vocab_size, items)
    return ProposalFrame(round_id=round_id, items=tuple(items))


def _sparse_run(buf, run, vocab: int, items: list) -> None:
    """Check a run of consecutive SPARSE items of one (K, S); put them into ``items``."""
    _, _, k, s, first = run[0]
    pt, pq = _aligned(4 * k), _aligned(4 * k * s)
    stride = _ITEM.size + pt + 2 * pq  # every item of the run has this size
    n = len(run)
    base = first + _ITEM.size
    toks = np.ndarray((n, k), _I32, buf, base, (stride, 4))
    ids = np.ndarray((n, k, s), _I32, buf, base + pt, (stride, 4 * s, 4))
    lp = np.ndarray((n, k, s), _F32, buf, base + pt + pq, (stride, 4 * s, 4))
    if not sparse_ok(toks, ids, lp, vocab):
        for j, (_, rid, *_) in enumerate(run):
            try:
                check_sparse(toks[j], ids[j], lp[j], vocab)
            except DecodeError as exc:
                raise type(exc)(f"request {rid}: {exc}") from None
    toks64, ids64, lp32 = toks.astype(np.int64), ids.astype(np.int64), lp.copy()
    for j, (i, rid, *_) in enumerate(run):
        items[i] = DraftItem(rid, ItemStatus.OK, torch.from_numpy(toks64[j]), QKind.SPARSE,
                             torch.from_numpy(lp32[j]), torch.from_numpy(ids64[j]))


def _aligned(n: int) -> int:
    return n + (-n % 8)


def _decode_item(buf, off: int, end: int, hello: Hello,
                 limits: Limits) -> tuple[int, DraftItem | tuple[int, int], int]:
    """(request id, the item or for a SPARSE one still to check its (K, S), next offset)."""
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
    cap = min(limits.depth, hello.max_depth)
    if not 1 <= k <= cap:
        raise DepthLimit(f"request {rid}: depth {k} outside 1..{cap}")
    if kind not in hello.q_encodings or (kind == QKind.POINT_MASS
                                         and hello.mode != DraftMode.GREEDY):
        raise UndeclaredEncoding(f"request {rid}: q encoding {kind.name} was not declared "
                                 f"by a {hello.mode.name} drafter")
    v = hello.vocab_size
    if kind == QKind.SPARSE:
        cap = min(limits.support, hello.max_support)
        if not 1 <= s <= cap:
            raise SupportLimit(f"request {rid}: SPARSE support {s} outside 1..{cap}")
        off = block_end(buf, off, 4 * k, end, "drafted tokens")
        off = block_end(buf, off, 4 * k * s, end, "support ids")
        return rid, (k, s), block_end(buf, off, 4 * k * s, end, "SPARSE log q")
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
