"""The wire's errors: one class per failure (docs/wire.md names where each applies).

Every class subclasses ``WireError`` (itself a ``SpecpairError``). ``code`` is the
ERROR-frame code a drafter sends back when the failure is the peer's fault.
"""

from __future__ import annotations

from specpair.errors import SpecpairError

__all__ = [
    "ErrorCode",
    "WireError",
    "DecodeError",
    "Truncated",
    "TrailingBytes",
    "FrameTooLarge",
    "Misaligned",
    "BadMagic",
    "BadVersion",
    "BadChecksum",
    "UnknownKind",
    "NonZeroReserved",
    "NonZeroPadding",
    "UnknownCode",
    "RequestLimit",
    "DepthLimit",
    "SupportLimit",
    "TokenLimit",
    "FeatureLimit",
    "MessageLimit",
    "VocabLimit",
    "TokenOutOfRange",
    "NonFiniteQ",
    "UnnormalizedQ",
    "ZeroDraftQ",
    "SupportPadding",
    "DuplicateSupportId",
    "DuplicateRequest",
    "BadShape",
    "BadDtype",
    "BadParams",
    "BadHello",
    "BadUtf8",
    "FeatureMismatch",
    "UndeclaredEncoding",
    "NoHello",
    "AuthFailed",
    "UnexpectedFrame",
    "HelloMismatch",
    "PeerError",
    "ConnectionLost",
    "DeadlineExceeded",
    "BadKey",
    "InternalError",
]


class ErrorCode:
    """ERROR-frame codes (docs/wire.md section 7). Never reuse a retired code."""

    MALFORMED = 1
    AUTH_FAILED = 2
    UNEXPECTED = 3
    VERSION = 4
    INTERNAL = 5
    SHUTTING_DOWN = 6


class WireError(SpecpairError):
    """Base of every failure of the probability wire."""

    code = ErrorCode.MALFORMED


class DecodeError(WireError, ValueError):
    """Base of the codec's refusals: the bytes (or the frame to encode) break docs/wire.md."""


class Truncated(DecodeError):
    """The buffer ends before the header, the body or a block inside it."""


class TrailingBytes(DecodeError):
    """The body is longer than its contents."""


class FrameTooLarge(DecodeError):
    """body_len exceeds the frame limit."""


class Misaligned(DecodeError):
    """body_len is not a multiple of 8."""


class BadMagic(DecodeError):
    """The first 4 bytes are not "SPWR"."""


class BadVersion(DecodeError):
    """The frame's version is not one this decoder implements."""

    code = ErrorCode.VERSION


class BadChecksum(DecodeError):
    """The CRC-32C of header[0:12] + body does not match the header's crc32c."""


class UnknownKind(DecodeError):
    """The frame kind code is not one of docs/wire.md section 3."""


class NonZeroReserved(DecodeError):
    """A reserved field or the flags byte is not zero."""


class NonZeroPadding(DecodeError):
    """Alignment padding before an 8-aligned block is not zero."""


class UnknownCode(DecodeError):
    """An enum field (mode, status, q kind, feature kind) holds an unknown code."""


class RequestLimit(DecodeError):
    """Too many (or zero) requests in one frame."""


class DepthLimit(DecodeError):
    """Depth K (or num_accepted) outside 1..max_depth."""


class SupportLimit(DecodeError):
    """SPARSE support S outside 1..max_support, or a support field where none belongs."""


class TokenLimit(DecodeError):
    """n_new outside 1..max_new_tokens, or more new tokens than the position allows."""


class FeatureLimit(DecodeError):
    """Feature width over the limit."""


class MessageLimit(DecodeError):
    """An ERROR message longer than the limit."""


class VocabLimit(DecodeError):
    """HELLO vocab_size outside 1..2^31-1."""


class TokenOutOfRange(DecodeError):
    """A token or support id is negative or >= the vocabulary size."""


class NonFiniteQ(DecodeError):
    """log q holds NaN or +inf."""


class UnnormalizedQ(DecodeError):
    """|sum(exp(log q)) - 1| exceeds the tolerance for some position."""


class ZeroDraftQ(DecodeError):
    """A drafted token has q(d) = 0 under the law it was supposedly drawn from."""


class SupportPadding(DecodeError):
    """SPARSE padding is not -1 with -inf log q after the valid ids (or a row has no valid id)."""


class DuplicateSupportId(DecodeError):
    """A SPARSE row lists the same token id twice."""


class DuplicateRequest(DecodeError):
    """A request id appears twice in one frame."""


class BadShape(DecodeError):
    """A tensor (or a frame field) has the wrong shape or inconsistent sizes."""


class BadDtype(DecodeError):
    """A tensor has the wrong dtype, or a dtype code is unknown."""


class BadParams(DecodeError):
    """Sampling params out of range (temperature, top_p, top_k)."""


class BadHello(DecodeError):
    """A HELLO breaks its own rules (mode vs encodings, feature fields, limits)."""


class BadUtf8(DecodeError):
    """An ERROR message is not valid UTF-8."""


class FeatureMismatch(DecodeError):
    """Context features are absent, present or shaped against what the HELLO asked."""


class UndeclaredEncoding(DecodeError):
    """A q encoding the HELLO did not declare (POINT_MASS from a SAMPLED drafter)."""


class NoHello(DecodeError):
    """A frame carrying token ids was decoded without the HELLO that gives the vocabulary."""


class AuthFailed(WireError):
    """The peer failed the HMAC challenge (or never answered it)."""

    code = ErrorCode.AUTH_FAILED


class UnexpectedFrame(WireError):
    """A frame kind out of its place in the protocol."""

    code = ErrorCode.UNEXPECTED


class HelloMismatch(WireError):
    """The drafter's HELLO does not match the target (vocab, tokenizer, encodings, version)."""


class PeerError(WireError):
    """The peer sent an ERROR frame."""


class ConnectionLost(WireError):
    """The connection closed or failed."""


class DeadlineExceeded(WireError):
    """A connect or read did not finish before its deadline."""


class BadKey(WireError):
    """The pre-shared key is missing, unreadable or too short."""


class InternalError(WireError):
    """The drafter failed on a frame for a reason of its own (a bug, logged with its
    traceback), not because the frame broke docs/wire.md."""

    code = ErrorCode.INTERNAL
