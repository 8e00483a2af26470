"""How the overlay writes into a site-packages: atomically, inside it, and only where it may.

- ``write_atomic``: data goes to a fresh temporary beside the target (``.NAME.specpair-tmp``,
  created exclusively and never through a symlink), is fsynced, renamed onto the target
  (replacing a symlink there, never writing through it) and the directory is fsynced. A
  kill leaves the target whole (old or new) plus, at worst, a stray temporary.
- ``check_tree``: every directory apply writes into must resolve inside --site-packages
  (a symlinked ``vllm/utils`` pointing elsewhere is refused) and be writable; checked
  before the first write.
- ``write_bytecode``: a patched module's stale ``__pycache__`` entries are dropped and
  its code object is written as a checked-hash .pyc (PEP 552), through ``write_atomic``.
- ``strays``: the leftovers a kill can leave (our temporaries); apply removes them,
  status lists them.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
from pathlib import Path
from types import CodeType

from specpair.overlay.errors import CannotWrite, OutsideSite

__all__ = ["TEMP_SUFFIX", "write_atomic", "rename_atomic", "check_tree", "drop_bytecode",
           "write_bytecode", "strays"]

TEMP_SUFFIX = ".specpair-tmp"


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}{TEMP_SUFFIX}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp + fsync + rename + directory fsync."""
    tmp = _temp(path)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    rename_atomic(tmp, path)


def rename_atomic(src: Path, dst: Path) -> None:
    """Rename ``src`` onto ``dst`` (same directory) and fsync the directory."""
    os.replace(src, dst)
    _fsync_dir(dst.parent)


def check_tree(site: Path, dirs: list[str]) -> None:
    """Refuse (nothing written yet) unless every directory of ``dirs`` (relative to ``site``)
    and its ``__pycache__`` resolve inside ``site`` and are writable."""
    root = site.resolve()
    todo: set[Path] = set()
    for d in dirs:
        todo.add(site / d)
        if os.path.lexists(site / d / "__pycache__"):
            todo.add(site / d / "__pycache__")
    for d in sorted(todo):
        real = d.resolve()
        if not real.is_relative_to(root):
            raise OutsideSite(
                f"{d.relative_to(site)} resolves to {real}, outside --site-packages {root}: "
                "refusing to write through a symlink; nothing was changed")
        if not os.access(real, os.W_OK | os.X_OK):
            raise CannotWrite(
                f"cannot write {d} (read-only or not this user's): nothing was changed; "
                "run as the owner of --site-packages")


def drop_bytecode(path: Path) -> None:
    """Remove ``path``'s cached bytecode: stale (or, in a symlinked tree, foreign)."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def _pyc(path: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(path)))


def write_bytecode(path: Path, source: bytes, code: CodeType) -> None:
    """Drop ``path``'s stale bytecode; write ``code`` (compiled from ``source``) as its
    checked-hash .pyc: magic, flags 0b11 (hash-based, checked), the source hash, marshal."""
    drop_bytecode(path)
    pyc = _pyc(path)
    pyc.parent.mkdir(exist_ok=True)
    write_atomic(pyc, importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little")
                 + importlib.util.source_hash(source) + marshal.dumps(code))


def strays(site: Path, paths: list[str], modules: list[str]) -> list[Path]:
    """Leftovers of an interrupted write of ``paths`` and of ``modules``' bytecode."""
    targets = [site / p for p in paths] + [_pyc(site / m) for m in modules]
    return [_temp(t) for t in targets if os.path.lexists(_temp(t))]
