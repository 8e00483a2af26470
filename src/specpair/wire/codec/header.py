"""The wire's constants (docs/wire.md sections 2, 4 and 5) and the 16-byte frame header:
kinds, limits, dtype codes, parsing, the CRC-32C and sealing a body into a frame."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import crc32c
import numpy as np
import torch

from specpair.wire.errors import (
    BadChecksum,
    BadDtype,
    BadMagic,
    BadShape,
    BadVersion,
    FrameTooLarge,
    Misaligned,
    NonZeroReserved,
    Truncated,
    UnknownKind,
)

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER",
    "PREAUTH_FRAME_BYTES",
    "Kind",
    "Limits",
    "LIMITS",
    "NORM_TOLERANCE",
    "DTYPE_CODES",
    "DTYPES",
    "Header",
    "parse_header",
    "check_crc",
    "seal",
    "check_u64",
    "dtype_code",
]

MAGIC = b"SPWR"
VERSION = 1
HEADER = struct.Struct("<4sHBBII")  # magic, version, kind, flags, body_len, crc32c
_HEAD12 = struct.Struct("<4sHBBI")  # HEADER without its crc32c: the bytes the crc covers first
_U32 = struct.Struct("<I")
PREAUTH_FRAME_BYTES = 4096  # frames before authentication, header included
NORM_TOLERANCE = 1e-3  # |sum(exp(log q)) - 1| allowed per position


class Kind(IntEnum):
    """Frame kind codes. Never reuse a retired one; keep it here as a comment."""

    CHALLENGE = 1
    AUTH = 2
    AUTH_OK = 3
    HELLO = 4
    PROPOSE = 5
    PROPOSAL = 6
    RELEASE = 7
    ERROR = 8


@dataclass(frozen=True)
class Limits:
    """The decoder's (and encoder's) limits; docs/wire.md section 5."""

    frame_bytes: int = 256 << 20  # whole frame, header included
    requests: int = 1024  # items per PROPOSE / PROPOSAL / RELEASE
    depth: int = 32  # K
    support: int = 65536  # SPARSE S
    new_tokens: int = 1 << 20  # new tokens per PROPOSE item
    feature_width: int = 65536  # width of one feature row
    message: int = 4096  # ERROR message bytes
    vocab: int = (1 << 31) - 1  # HELLO vocab_size


LIMITS = Limits()

# Feature dtype codes (section 4): code -> (torch dtype, numpy dtype of the raw bytes).
DTYPE_CODES: dict[int, tuple[torch.dtype, np.dtype]] = {
    1: (torch.float32, np.dtype("<f4")),
    2: (torch.bfloat16, np.dtype("<u2")),  # raw bits; viewed as bfloat16 after the copy
    3: (torch.float16, np.dtype("<f2")),
}
DTYPES: dict[torch.dtype, int] = {t: code for code, (t, _) in DTYPE_CODES.items()}


class Header(NamedTuple):
    """A parsed, checked frame header (a tuple: it is built once per frame, hot path)."""

    kind: Kind  # frame kind
    body_len: int  # bytes after the header
    crc: int  # the header's crc32c field


def parse_header(buf, limits: Limits = LIMITS, *, authenticated: bool = True) -> Header:
    """Check the first 16 bytes of ``buf`` (magic, version, kind, flags, length limit)."""
    if len(buf) < HEADER.size:
        raise Truncated(f"frame header needs {HEADER.size} bytes, got {len(buf)}")
    magic, version, kind, flags, body_len, crc = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise BadMagic(f"magic {bytes(magic)!r} is not {MAGIC!r}")
    if version != VERSION:
        raise BadVersion(f"wire version {version} is not supported (this decoder speaks {VERSION})")
    known = _KINDS.get(kind)
    if known is None:
        raise UnknownKind(f"unknown frame kind {kind}")
    if flags:
        raise NonZeroReserved(f"header flags must be 0, got {flags:#x}")
    cap = limits.frame_bytes if authenticated else PREAUTH_FRAME_BYTES
    if body_len + HEADER.size > cap:
        raise FrameTooLarge(f"frame of {body_len + HEADER.size} bytes exceeds the limit {cap}")
    if body_len % 8:
        raise Misaligned(f"body_len {body_len} is not a multiple of 8")
    return Header(known, body_len, crc)


def check_crc(buf, body_len: int, crc: int) -> None:
    """Check the CRC-32C of header bytes [0, 12) followed by the body."""
    mv = memoryview(buf)
    got = crc32c.crc32c(mv[HEADER.size:HEADER.size + body_len], crc32c.crc32c(mv[:12]))
    if got != crc:
        raise BadChecksum(f"crc32c {got:#010x} does not match the header's {crc:#010x}")


def seal(kind: Kind, body: bytes) -> bytes:
    """Prefix ``body`` (a multiple of 8 bytes) with its header and checksum."""
    head = _HEAD12.pack(MAGIC, VERSION, kind, 0, len(body))
    return b"".join((head, _U32.pack(crc32c.crc32c(body, crc32c.crc32c(head))), body))


def check_u64(value: int, what: str) -> None:
    """An id that travels as u64."""
    if not 0 <= value < 1 << 64:
        raise BadShape(f"{what} {value} does not fit in an unsigned 64-bit integer")


def dtype_code(dtype: torch.dtype) -> int:
    """The wire code of a feature dtype."""
    try:
        return DTYPES[dtype]
    except KeyError:
        raise BadDtype(f"feature dtype {dtype} has no wire code (f32, bf16, f16)") from None


_KINDS = {int(k): k for k in Kind}
