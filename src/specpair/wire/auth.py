"""The pre-shared key and the HMAC challenge-response of docs/wire.md section 6."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from specpair.files import FileRefused, read_small
from specpair.wire.errors import BadKey

__all__ = [
    "MIN_KEY_BYTES", "MAX_KEY_FILE_BYTES", "load_key", "check_key", "new_nonce",
    "target_mac", "drafter_mac", "macs_equal",
]

MIN_KEY_BYTES = 16
MAX_KEY_FILE_BYTES = 4096  # a key file is a short secret; anything longer is a mistake
_TARGET = b"specpair-wire/1 target"
_DRAFTER = b"specpair-wire/1 drafter"


def load_key(path: str | Path) -> bytes:
    """Read a key file (surrounding whitespace stripped); at least 16 bytes.

    The file must be a regular file of at most MAX_KEY_FILE_BYTES that neither its group nor
    others may read or write (mode 0600 or 0400, as ssh requires of a private key): /dev/zero,
    a FIFO or a directory is refused at once, without reading it.
    """
    try:
        key = read_small(path, MAX_KEY_FILE_BYTES, "key file", private=True).strip()
    except FileRefused as exc:
        raise BadKey(str(exc)) from None
    return check_key(key, str(path))


def check_key(key: bytes, where: str = "the key") -> bytes:
    """``key`` itself, if it is long enough to be a key."""
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise BadKey(f"{where}: a pre-shared key needs at least {MIN_KEY_BYTES} bytes")
    return key


def new_nonce() -> bytes:
    """32 fresh random bytes."""
    return os.urandom(32)


def target_mac(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the target sends in AUTH."""
    return hmac.new(key, _TARGET + server_nonce + client_nonce, hashlib.sha256).digest()


def drafter_mac(key: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the drafter sends in AUTH_OK."""
    return hmac.new(key, _DRAFTER + server_nonce + client_nonce, hashlib.sha256).digest()


def macs_equal(a: bytes, b: bytes) -> bool:
    """Constant-time comparison."""
    return hmac.compare_digest(a, b)
