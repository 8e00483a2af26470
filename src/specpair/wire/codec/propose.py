"""PROPOSE bodies (docs/wire.md 3.3): one decode round from the target."""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire.codec.body import append_block, decode_round, encode_round, view
from specpair.wire.codec.header import DTYPE_CODES, Limits, check_u64, dtype_code
from specpair.wire.codec.qcheck import check_tokens
from specpair.wire.errors import (
    BadDtype,
    BadParams,
    BadShape,
    DepthLimit,
    DuplicateRequest,
    FeatureLimit,
    FeatureMismatch,
    TokenLimit,
    TokenOutOfRange,
    TrailingBytes,
    Truncated,
    UndeclaredEncoding,
    UnknownCode,
)
from specpair.wire.frames import Hello, Propose, ProposeItem, RequestParams

__all__ = ["encode_propose", "decode_propose", "check_params", "check_counts"]

# request_id, position, n_new, num_accepted, depth, feature_dtype, draft_mode, feature_width,
# temperature, top_p, top_k, seed
_ITEM = struct.Struct("<QQIIHBBIffqq")
_GREEDY = int(DraftMode.GREEDY)  # draft_mode: 0 = the drafter's own mode
_I32 = np.dtype("<i4")
_I64_MAX = (1 << 63) - 1
_F32_MAX = 3.4028234663852886e38


def check_params(rid: int, p: RequestParams) -> None:
    """Raise BadParams for params no law could mean (NaN, inf, negative, top_p outside (0, 1]):
    the frame's structure. The domain itself (``specpair.sampling.check_params_domain``,
    docs/core.md) is checked per request: by the target's session before sending, and by the
    drafter per item; outside it, that request is REFUSED alone while the rest of its round is
    drafted (docs/wire.md section 3.3)."""
    if not (math.isfinite(p.temperature) and 0 <= p.temperature <= _F32_MAX):
        raise BadParams(f"request {rid}: temperature {p.temperature} must be finite and >= 0")
    if not 0 < p.top_p <= 1:  # False for NaN
        raise BadParams(f"request {rid}: top_p {p.top_p} must lie in (0, 1]")
    if not 0 <= p.top_k <= _I64_MAX:
        raise BadParams(f"request {rid}: top_k {p.top_k} must be >= 0 (and < 2^63)")
    if not -_I64_MAX - 1 <= p.seed <= _I64_MAX:
        raise BadParams(f"request {rid}: seed {p.seed} must fit in a signed 64-bit integer")


def check_counts(rid: int, n_new: int, position: int, depth: int, accepted: int,
                  limits: Limits, max_depth: int) -> None:
    """Raise TokenLimit / DepthLimit unless an item's counts are in range."""
    if not 1 <= n_new <= limits.new_tokens:
        raise TokenLimit(f"request {rid}: {n_new} new tokens; an item holds 1..{limits.new_tokens}")
    if not n_new <= position <= _I64_MAX:
        raise TokenLimit(f"request {rid}: position {position} must be >= n_new ({n_new}) "
                         "and < 2^63")
    if not 1 <= depth <= max_depth:
        raise DepthLimit(f"request {rid}: depth {depth} outside 1..{max_depth}")
    if accepted > limits.depth:
        raise DepthLimit(f"request {rid}: num_accepted {accepted} exceeds {limits.depth}")


def _encode_item(it: ProposeItem, parts: list[bytes], limits: Limits) -> None:
    t = it.new_tokens
    if t.dtype != torch.int64 or t.ndim != 1:
        raise BadShape(f"request {it.request_id}: new_tokens must be [n] int64")
    n = t.shape[0]
    check_counts(it.request_id, n, it.position, it.depth, it.num_accepted, limits, limits.depth)
    if it.num_accepted < 0:
        raise DepthLimit(f"request {it.request_id}: num_accepted must be >= 0")
    check_u64(it.request_id, "request_id")
    check_params(it.request_id, it.params)
    a = t.detach().cpu().numpy()
    a32 = a.astype(_I32)
    if np.count_nonzero(a32 != a) or int(a32.min()) < 0:
        raise TokenOutOfRange(f"request {it.request_id}: new token ids must lie in [0, 2^31)")
    code, width, feats = 0, 0, None
    if it.features is not None:
        f = it.features
        code = dtype_code(f.dtype)
        if f.ndim != 2 or f.shape[0] != n or not 1 <= f.shape[1] <= limits.feature_width:
            raise BadShape(f"request {it.request_id}: features must be [{n}, 1..."
                           f"{limits.feature_width}], got {list(f.shape)}")
        width = f.shape[1]
        raw = f.detach().cpu().contiguous()
        if f.dtype == torch.bfloat16:
            raw = raw.view(torch.int16)
        feats = raw.numpy().tobytes()
    p = it.params
    parts.append(_ITEM.pack(it.request_id, it.position, n, it.num_accepted, it.depth, code,
                            _GREEDY if it.greedy else 0, width, p.temperature, p.top_p,
                            p.top_k, p.seed))
    append_block(parts, a32.tobytes())
    if feats is not None:
        append_block(parts, feats)


def encode_propose(frame: Propose, limits: Limits) -> list[bytes]:
    """The body parts of a PROPOSE (shapes, dtypes, params and limits checked)."""
    return encode_round(frame.round_id, frame.items, limits, _encode_item)


def decode_propose(buf, end: int, hello: Hello, limits: Limits) -> Propose:
    """Decode and check a PROPOSE body in ``buf[16:end]`` against ``hello``."""
    round_id, n, off = decode_round(buf, end, "PROPOSE", limits)
    items, seen = [], set()
    for _ in range(n):
        it, off = _decode_item(buf, off, end, hello, limits)
        if it.request_id in seen:
            raise DuplicateRequest(f"request {it.request_id} appears twice in one PROPOSE")
        seen.add(it.request_id)
        items.append(it)
    if off != end:
        raise TrailingBytes(f"PROPOSE has {end - off} bytes after its last item")
    return Propose(round_id=round_id, items=tuple(items))


def _decode_item(buf, off: int, end: int, hello: Hello, limits: Limits) -> tuple[ProposeItem, int]:
    if off + _ITEM.size > end:
        raise Truncated("PROPOSE item header is cut short")
    (rid, pos, n, acc, depth, code, mode, width,
     temp, top_p, top_k, seed) = _ITEM.unpack_from(buf, off)
    off += _ITEM.size
    if mode not in (0, _GREEDY):
        raise UnknownCode(f"request {rid}: unknown draft mode code {mode}")
    if mode and QKind.POINT_MASS not in hello.q_encodings:
        raise UndeclaredEncoding(f"request {rid} asks for greedy drafts; this drafter did not "
                                 "declare POINT_MASS")
    check_counts(rid, n, pos, depth, acc, limits, min(limits.depth, hello.max_depth))
    params = RequestParams(temperature=temp, top_k=top_k, top_p=top_p, seed=seed)
    check_params(rid, params)
    if (code == 0) != (width == 0):
        raise BadShape(f"request {rid}: feature dtype {code} and width {width} must both be "
                       "0 or both be set")
    if code and code not in DTYPE_CODES:
        raise BadDtype(f"request {rid}: unknown feature dtype code {code}")
    if width > limits.feature_width:
        raise FeatureLimit(f"request {rid}: feature width {width} exceeds {limits.feature_width}")
    spec = hello.features
    want = (0, 0) if spec is None else (dtype_code(spec.dtype), spec.width)
    if (code, width) != want:
        raise FeatureMismatch(f"request {rid}: features (dtype code {code}, width {width}) "
                              f"differ from the HELLO's (dtype code {want[0]}, width {want[1]})")
    toks, off = view(buf, off, _I32, n, end, "new tokens")
    check_tokens(toks, hello.vocab_size, "new token")
    feats = None
    if code:
        tdtype, ndtype = DTYPE_CODES[code]
        raw, off = view(buf, off, ndtype, n * width, end, "features")
        feats = torch.from_numpy(raw.reshape(n, width).copy())
        if tdtype == torch.bfloat16:
            feats = feats.view(torch.bfloat16)
    item = ProposeItem(request_id=rid, new_tokens=torch.from_numpy(toks.astype(np.int64)),
                       num_accepted=acc, position=pos, depth=depth, params=params,
                       features=feats, greedy=mode == _GREEDY)
    return item, off
