"""Reading a small input file named on the command line, with limits.

``require_regular`` checks a path that another reader (safetensors) opens. ``read_small`` opens
without blocking (a FIFO with no writer, a device, a directory are refused
at once, never read), requires a regular file no larger than ``max_bytes`` (checked on the open
file, and again while reading, so a file that grows is cut off), and with ``private`` refuses a
file that its group or others may read or write, as ssh does for private keys. Every refusal is
a ``FileRefused`` whose message names the file and what is wrong.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from specpair.errors import SpecpairError

__all__ = ["FileRefused", "read_small", "require_regular"]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class FileRefused(SpecpairError, ValueError):
    """An input file is missing, unreadable, not a regular file, too large or too open."""


def require_regular(path: str | Path, what: str = "file") -> None:
    """Refuse ``path`` unless it is a regular file (for readers that open it themselves)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise FileRefused(f"cannot read the {what} {path}: {e.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        raise FileRefused(f"the {what} {path} is {kind}; it must be a regular file")


def read_small(path: str | Path, max_bytes: int, what: str = "file", *,
               private: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise FileRefused(f"cannot read the {what} {path}: {e.strerror}") from None
    chunks, n = [], 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
            raise FileRefused(f"the {what} {path} is {kind}; it must be a regular file")
        if private and st.st_mode & 0o077:
            raise FileRefused(f"the {what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: its "
                              f"group or others may read or write it; chmod 600 {path}")
        if st.st_size > max_bytes:
            raise FileRefused(f"the {what} {path} is {st.st_size} bytes; at most {max_bytes}")
        while n <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - n)):
            chunks.append(chunk)
            n += len(chunk)
    except OSError as e:
        raise FileRefused(f"cannot read the {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FileRefused(f"the {what} {path} holds more than {max_bytes} bytes")
    return data
