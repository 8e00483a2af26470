"""Key files: `load_key` refuses, at once and with one clear line, a file
that is not regular (/dev/zero used to be read forever), too large, or that its group or
others may read or write (as ssh refuses a private key); a 0600 or 0400 key loads. The drafter's
--key-file and the target's SPECPAIR_DRAFTER_KEY_FILE both go through it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from specpair.wire.auth import MAX_KEY_FILE_BYTES, load_key
from specpair.wire.errors import BadKey

KEY = b"0123456789abcdef0123456789abcdef"


def _key(tmp_path: Path, mode: int, data: bytes = KEY + b"\n") -> Path:
    path = tmp_path / "wire.key"
    path.write_bytes(data)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_key_file_loads(tmp_path: Path, mode: int) -> None:
    assert load_key(_key(tmp_path, mode)) == KEY


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_key_file_others_may_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _key(tmp_path, mode)
    with pytest.raises(BadKey, match=rf"has mode {mode:04o}: its group or others may read or "
                                     rf"write it; chmod 600 {path}"):
        load_key(path)


def _refused_fast(path: str | Path, match: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(BadKey, match=match) as e:
        load_key(path)
    assert time.monotonic() - t0 < 1.0
    assert "\n" not in str(e.value)


def test_dev_zero_is_refused_at_once() -> None:
    _refused_fast("/dev/zero", "/dev/zero is a character device; it must be a regular file")


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo, 0o600)  # no writer: a blocking open would hang
    _refused_fast(fifo, "is a FIFO; it must be a regular file")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    d.mkdir(mode=0o700)
    _refused_fast(d, "is a directory; it must be a regular file")


def test_an_oversized_key_file_is_refused(tmp_path: Path) -> None:
    path = _key(tmp_path, 0o600, b"k" * (MAX_KEY_FILE_BYTES + 1))
    _refused_fast(path, rf"is {MAX_KEY_FILE_BYTES + 1} bytes; at most {MAX_KEY_FILE_BYTES}")


def test_a_missing_or_short_key_file_is_refused(tmp_path: Path) -> None:
    _refused_fast(tmp_path / "nope", "cannot read the key file .*No such file or directory")
    _refused_fast(_key(tmp_path, 0o600, b"short\n"), "at least 16 bytes")


def test_the_target_reads_its_key_file_through_load_key(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from specpair.vllm.drafter_source import make_source

    monkeypatch.setenv("SPECPAIR_DRAFTER", "127.0.0.1:1")
    monkeypatch.setenv("SPECPAIR_DRAFTER_KEY_FILE", str(_key(tmp_path, 0o644)))
    with pytest.raises(BadKey, match="has mode 0644"):
        make_source(8, str(tmp_path))
