"""Encode and decode whole frames (docs/wire.md). No pickle, no eval: only struct, numpy and
the compiled SPARSE checks.

``encode(frame)`` checks shapes, dtypes and limits and returns the frame's bytes.
``decode(buf, hello)`` checks everything docs/wire.md states and returns the frame;
it raises one ``WireError`` subclass per failure. Frames that carry token ids
(PROPOSE, PROPOSAL) need the drafter's ``Hello`` for the vocabulary and limits.

Modules, by what a reader looks for:

- ``header``: constants, kinds, limits, dtype codes, the 16-byte header and its CRC-32C.
- ``body``: aligned blocks and the round header of PROPOSE and PROPOSAL bodies.
- ``control``: CHALLENGE, AUTH, AUTH_OK, HELLO, RELEASE and ERROR bodies.
- ``propose``, ``proposal``: the PROPOSE and PROPOSAL bodies.
- ``qcheck``: is q a law the drafts could come from; ``_sparse.c``: its SPARSE checks, compiled.

``_CODECS`` below is the one table both directions dispatch on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

try:  # first, so that a tree without the compiled checks fails here, saying why
    from specpair.wire.codec import _sparse  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "specpair.wire.codec._sparse (the compiled SPARSE checks, _sparse.c) is not built: "
        "install specpair with a C compiler and Python's headers (`pip install -e .`; "
        "scripts/bootstrap.sh installs gcc and python3-dev where they are missing)") from exc

from specpair.wire.codec import control  # noqa: E402
from specpair.wire.codec.header import HEADER, LIMITS, Kind, Limits, check_crc, parse_header, seal
from specpair.wire.codec.proposal import decode_proposal, encode_proposal
from specpair.wire.codec.propose import decode_propose, encode_propose
from specpair.wire.errors import BadShape, FrameTooLarge, NoHello, TrailingBytes, Truncated
from specpair.wire.frames import (
    Auth,
    AuthOk,
    Challenge,
    ErrorFrame,
    Hello,
    ProposalFrame,
    Propose,
    Release,
)

__all__ = ["Frame", "encode", "decode", "kind_of"]

Frame = Challenge | Auth | AuthOk | Hello | Propose | ProposalFrame | Release | ErrorFrame


class _Codec(NamedTuple):
    """How one frame kind travels."""

    frame: type  # the in-memory frame class
    encode: Callable[[Any, Limits], list[bytes]]  # (frame, limits) -> body parts
    decode: Callable[[Any, int, Hello | None, Limits], Any]  # (buf, end, hello, limits) -> frame
    needs_hello: bool  # the body carries token ids: decoding needs the drafter's HELLO


_CODECS: dict[Kind, _Codec] = {
    Kind.CHALLENGE: _Codec(Challenge, control.encode_challenge, control.decode_challenge, False),
    Kind.AUTH: _Codec(Auth, control.encode_auth, control.decode_auth, False),
    Kind.AUTH_OK: _Codec(AuthOk, control.encode_auth_ok, control.decode_auth_ok, False),
    Kind.HELLO: _Codec(Hello, control.encode_hello, control.decode_hello, False),
    Kind.PROPOSE: _Codec(Propose, encode_propose, decode_propose, True),
    Kind.PROPOSAL: _Codec(ProposalFrame, encode_proposal, decode_proposal, True),
    Kind.RELEASE: _Codec(Release, control.encode_release, control.decode_release, False),
    Kind.ERROR: _Codec(ErrorFrame, control.encode_error, control.decode_error, False),
}
# Lookups derived from the table: by frame class, and by kind code (a tuple index: no enum
# hashing on the hot path).
_BY_FRAME = {c.frame: (kind, c.encode) for kind, c in _CODECS.items()}
_BY_CODE = tuple(_CODECS.get(code) for code in range(max(Kind) + 1))


def _encoder(frame: Frame) -> tuple[Kind, Callable[[Any, Limits], list[bytes]]]:
    try:
        return _BY_FRAME[type(frame)]
    except KeyError:
        raise BadShape(f"{type(frame).__name__} is not a wire frame") from None


def kind_of(frame: Frame) -> Kind:
    """The wire kind of an in-memory frame."""
    return _encoder(frame)[0]


def encode(frame: Frame, limits: Limits = LIMITS) -> bytes:
    """The bytes of ``frame`` (header, body, CRC-32C)."""
    kind, enc = _encoder(frame)
    body = b"".join(enc(frame, limits))
    if len(body) + HEADER.size > limits.frame_bytes:
        raise FrameTooLarge(f"{kind.name} frame of {len(body) + HEADER.size} bytes exceeds "
                            f"the limit {limits.frame_bytes}")
    return seal(kind, body)


def decode(buf, hello: Hello | None = None, limits: Limits = LIMITS, *,
           authenticated: bool = True) -> Frame:
    """Decode one whole frame from ``buf`` (bytes-like, exactly one frame long)."""
    h = parse_header(buf, limits, authenticated=authenticated)
    end, size = HEADER.size + h.body_len, len(buf)
    if size < end:
        raise Truncated(f"{h.kind.name} frame needs {end} bytes, got {size}")
    if size > end:
        raise TrailingBytes(f"{size - end} bytes follow the {h.kind.name} frame")
    check_crc(buf, h.body_len, h.crc)
    codec = _BY_CODE[h.kind]
    if codec.needs_hello and hello is None:
        raise NoHello(f"a {h.kind.name} frame carries token ids: decode it with the HELLO")
    return codec.decode(buf, end, hello, limits)
