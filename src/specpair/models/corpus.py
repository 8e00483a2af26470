"""The trained pair's corpus: the running interpreter's own standard library sources.

Rule (pinned; ``manifest`` writes it, ``check`` compares against it):

- every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, walked in sorted
  relative-path order;
- except any file under a directory named in ``EXCLUDED_DIRS`` (test suites, third-party
  packages, IDLE, demos and vendored data: not the library's own code), and any file larger
  than ``MAX_FILE_BYTES`` (generated tables);
- a file is held out when the first 4 bytes of sha256(relative path, UTF-8) read as a
  big-endian integer are divisible by ``HELD_OUT_MODULUS``: about 1 file in 10, fixed by the
  path alone, so a file never moves between the splits.

Texts are decoded as UTF-8 (a file that is not UTF-8 is decoded with ``errors="replace"``:
the bytes, not the decoded text, are what the manifest pins).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specpair.errors import CannotRun

__all__ = ["EXCLUDED_DIRS", "HELD_OUT_MODULUS", "CorpusFile", "CorpusMismatch", "stdlib_root",
           "scan", "manifest", "check", "texts"]

EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "idlelib",
    "turtledemo", "lib2to3", "ensurepip", "pydoc_data",
})
MAX_FILE_BYTES = 1_000_000
HELD_OUT_MODULUS = 10


class CorpusMismatch(CannotRun):
    """This interpreter's standard library is not the pinned corpus (exit 3)."""


@dataclass(frozen=True)
class CorpusFile:
    path: str  # relative to the stdlib root, POSIX separators
    sha256: str  # of the file's bytes, hex
    split: str  # "train" or "heldout"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel: str) -> str:
    head = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:4], "big")
    return "heldout" if head % HELD_OUT_MODULUS == 0 else "train"


def scan(root: Path | None = None) -> list[CorpusFile]:
    """The corpus files under ``root`` (default: this interpreter's stdlib), by the rule."""
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]) or not path.is_file():
            continue
        data = path.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            continue
        out.append(CorpusFile(rel.as_posix(), hashlib.sha256(data).hexdigest(),
                              split_of(rel.as_posix())))
    return out


def manifest(files: list[CorpusFile]) -> dict:
    """The committed form: the rule's parameters and every file with its hash and split."""
    return {
        "python": sys.version.split()[0],
        "root": "sysconfig.get_paths()['stdlib']",
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "max_file_bytes": MAX_FILE_BYTES,
        "held_out_modulus": HELD_OUT_MODULUS,
        "files": [[f.path, f.sha256, f.split] for f in files],
    }


def check(pinned: dict, root: Path | None = None) -> list[CorpusFile]:
    """This host's corpus if it is exactly ``pinned``'s; else CorpusMismatch naming the first
    differing file."""
    root = Path(root) if root is not None else stdlib_root()
    have = {f.path: f for f in scan(root)}
    want = [CorpusFile(p, h, s) for p, h, s in pinned["files"]]
    names = {f.path for f in want}
    for f in want:
        got = have.get(f.path)
        if got is None:
            raise CorpusMismatch(f"corpus file {f.path} is missing under {root} (the pinned "
                                 f"corpus is Python {pinned['python']}'s stdlib)")
        if got.sha256 != f.sha256:
            raise CorpusMismatch(f"corpus file {f.path} under {root} has sha256 "
                                 f"{got.sha256[:16]}..., pinned {f.sha256[:16]}... (the pinned "
                                 f"corpus is Python {pinned['python']}'s stdlib)")
    extra = sorted(set(have) - names)
    if extra:
        raise CorpusMismatch(f"corpus file {extra[0]} under {root} is not in the pinned corpus "
                             f"(Python {pinned['python']}'s stdlib)")
    return want


def texts(files: list[CorpusFile], split: str, root: Path | None = None) -> list[str]:
    root = Path(root) if root is not None else stdlib_root()
    return [(root / f.path).read_bytes().decode("utf-8", errors="replace")
            for f in files if f.split == split]
