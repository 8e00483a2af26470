"""CHALLENGE, AUTH, AUTH_OK, HELLO, RELEASE and ERROR bodies (docs/wire.md 3.1, 3.2, 3.5).

Each frame has an ``encode_*`` (frame, limits) -> body parts and a ``decode_*``
(buf, end, hello, limits) -> frame; these bodies carry no token ids, so their
decoders ignore the HELLO.
"""

from __future__ import annotations

import struct

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.wire.codec.body import append_block, block_end
from specpair.wire.codec.header import DTYPE_CODES, HEADER, Limits, check_u64, dtype_code
from specpair.wire.errors import (
    BadHello,
    BadShape,
    BadUtf8,
    DepthLimit,
    DuplicateRequest,
    FeatureLimit,
    MessageLimit,
    NonZeroReserved,
    RequestLimit,
    SupportLimit,
    TrailingBytes,
    Truncated,
    UnknownCode,
    VocabLimit,
)
from specpair.wire.frames import (
    Auth,
    AuthOk,
    Challenge,
    ErrorFrame,
    FeatureKind,
    FeatureSpec,
    Hello,
    Release,
)

__all__ = [
    "encode_challenge", "decode_challenge", "encode_auth", "decode_auth", "encode_auth_ok",
    "decode_auth_ok", "encode_hello", "decode_hello", "encode_release", "decode_release",
    "encode_error", "decode_error",
]

_HELLO = struct.Struct("<HBBI32sHBBIII")  # 56 bytes, docs/wire.md 3.2
_RELEASE = struct.Struct("<II")  # n, reserved
_ERROR = struct.Struct("<II")  # code, msg_len
_NONCE = 32
_MODES = frozenset(int(m) for m in DraftMode)
_FEATURE_KINDS = frozenset(int(k) for k in FeatureKind)



def _bytes32(value: bytes, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != _NONCE:
        raise BadShape(f"{what} must be {_NONCE} bytes")
    return value


def _fixed(buf, end: int, size: int, what: str) -> bytes:
    if end - HEADER.size != size:
        raise (Truncated if end - HEADER.size < size else TrailingBytes)(
            f"{what} body must be {size} bytes, got {end - HEADER.size}")
    return bytes(buf[HEADER.size:end])


def encode_challenge(f: Challenge, _: Limits) -> list[bytes]:
    return [_bytes32(f.nonce, "CHALLENGE nonce")]


def decode_challenge(buf, end: int, _hello: Hello | None, _: Limits) -> Challenge:
    return Challenge(_fixed(buf, end, _NONCE, "CHALLENGE"))


def encode_auth(f: Auth, _: Limits) -> list[bytes]:
    return [_bytes32(f.nonce, "AUTH nonce"), _bytes32(f.mac, "AUTH mac")]


def decode_auth(buf, end: int, _hello: Hello | None, _: Limits) -> Auth:
    b = _fixed(buf, end, 2 * _NONCE, "AUTH")
    return Auth(b[:_NONCE], b[_NONCE:])


def encode_auth_ok(f: AuthOk, _: Limits) -> list[bytes]:
    return [_bytes32(f.mac, "AUTH_OK mac")]


def decode_auth_ok(buf, end: int, _hello: Hello | None, _: Limits) -> AuthOk:
    return AuthOk(_fixed(buf, end, _NONCE, "AUTH_OK"))


def _check_hello(h: Hello, limits: Limits) -> None:
    if not 1 <= h.vocab_size <= limits.vocab:
        raise VocabLimit(f"vocab_size {h.vocab_size} outside 1..{limits.vocab}")
    if not 1 <= h.max_depth <= limits.depth:
        raise DepthLimit(f"HELLO max_depth {h.max_depth} outside 1..{limits.depth}")
    cap = min(limits.support, h.vocab_size)
    if not 1 <= h.max_support <= cap:
        raise SupportLimit(f"HELLO max_support {h.max_support} outside 1..{cap}")
    enc = set(h.q_encodings)
    if len(enc) != len(h.q_encodings):
        raise BadHello("HELLO lists a q encoding twice")
    if h.mode == DraftMode.GREEDY and enc != {QKind.POINT_MASS}:
        raise BadHello("a GREEDY drafter declares exactly {POINT_MASS}")
    if h.mode == DraftMode.SAMPLED and not enc - {QKind.POINT_MASS}:
        raise BadHello("a SAMPLED drafter declares SPARSE and/or DENSE (and POINT_MASS when "
                       "it drafts greedily for the items that ask)")
    if h.features is not None and not 1 <= h.features.width <= limits.feature_width:
        raise FeatureLimit(f"HELLO feature width {h.features.width} outside "
                           f"1..{limits.feature_width}")


def encode_hello(h: Hello, limits: Limits) -> list[bytes]:
    _check_hello(h, limits)
    if not 0 <= h.version < 1 << 16:
        raise BadShape(f"HELLO version {h.version} does not fit in u16")
    mask = sum(1 << (int(k) - 1) for k in h.q_encodings)
    f = h.features
    fk, fd, fw = (0, 0, 0) if f is None else (int(f.kind), dtype_code(f.dtype), f.width)
    fp = _bytes32(h.tokenizer_fingerprint, "tokenizer fingerprint")
    return [_HELLO.pack(h.version, h.mode, mask, h.vocab_size, fp, h.max_depth, fk, fd,
                        h.max_support, fw, 0)]


def decode_hello(buf, end: int, _hello: Hello | None, limits: Limits) -> Hello:
    b = _fixed(buf, end, _HELLO.size, "HELLO")
    (version, mode, mask, vocab, fp, max_depth, fk, fd, max_support, fw,
     reserved) = _HELLO.unpack(b)
    if reserved:
        raise NonZeroReserved("HELLO reserved field is not zero")
    if mode not in _MODES or mask & ~0b111 or (fk and fk not in _FEATURE_KINDS):
        raise UnknownCode(f"HELLO mode {mode}, q encodings {mask:#x} or feature kind {fk} "
                          "holds an unknown code")
    if (fk == 0) != (fd == 0) or (fk == 0) != (fw == 0):
        raise BadHello("HELLO feature kind, dtype and width must all be 0 or all be set")
    if fd and fd not in DTYPE_CODES:
        raise UnknownCode(f"HELLO feature dtype code {fd} is unknown")
    spec = FeatureSpec(FeatureKind(fk), DTYPE_CODES[fd][0], fw) if fk else None
    hello = Hello(version=version, mode=DraftMode(mode), vocab_size=vocab,
                  tokenizer_fingerprint=fp,
                  q_encodings=tuple(k for k in QKind if mask >> (int(k) - 1) & 1),
                  max_depth=max_depth, max_support=max_support, features=spec)
    _check_hello(hello, limits)
    return hello


def encode_release(r: Release, limits: Limits) -> list[bytes]:
    ids = r.request_ids
    if not 1 <= len(ids) <= limits.requests:
        raise RequestLimit(f"RELEASE of {len(ids)} requests; a frame holds 1..{limits.requests}")
    if len(set(ids)) != len(ids):
        raise DuplicateRequest("RELEASE lists a request twice")
    for rid in ids:
        check_u64(rid, "request_id")
    return [_RELEASE.pack(len(ids), 0), struct.pack(f"<{len(ids)}Q", *ids)]


def decode_release(buf, end: int, _hello: Hello | None, limits: Limits) -> Release:
    off = HEADER.size
    if off + _RELEASE.size > end:
        raise Truncated("RELEASE body is cut short")
    n, reserved = _RELEASE.unpack_from(buf, off)
    if reserved:
        raise NonZeroReserved("RELEASE reserved field is not zero")
    if not 1 <= n <= limits.requests:
        raise RequestLimit(f"RELEASE of {n} requests; a frame holds 1..{limits.requests}")
    off += _RELEASE.size
    nxt = block_end(buf, off, 8 * n, end, "RELEASE ids")
    if nxt != end:
        raise TrailingBytes(f"RELEASE has {end - nxt} bytes after its ids")
    ids = struct.unpack_from(f"<{n}Q", buf, off)
    if len(set(ids)) != n:
        raise DuplicateRequest("RELEASE lists a request twice")
    return Release(ids)


def encode_error(e: ErrorFrame, limits: Limits) -> list[bytes]:
    msg = e.message.encode("utf-8", errors="replace")
    if len(msg) > limits.message:
        raise MessageLimit(f"ERROR message of {len(msg)} bytes exceeds {limits.message}")
    if not 0 <= e.code < 1 << 32:
        raise BadShape(f"ERROR code {e.code} does not fit in u32")
    parts = [_ERROR.pack(e.code, len(msg))]
    append_block(parts, msg)
    return parts


def decode_error(buf, end: int, _hello: Hello | None, limits: Limits) -> ErrorFrame:
    off = HEADER.size
    if off + _ERROR.size > end:
        raise Truncated("ERROR body is cut short")
    code, n = _ERROR.unpack_from(buf, off)
    if n > limits.message:
        raise MessageLimit(f"ERROR message of {n} bytes exceeds {limits.message}")
    off += _ERROR.size
    nxt = block_end(buf, off, n, end, "ERROR message")
    if nxt != end:
        raise TrailingBytes(f"ERROR has {end - nxt} bytes after its message")
    try:
        msg = bytes(buf[off:off + n]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadUtf8(f"ERROR message is not UTF-8: {exc}") from None
    return ErrorFrame(code, msg)
