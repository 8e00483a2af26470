"""Parse and apply unified diffs in memory, exactly (no fuzz).

Every context and removed line of a hunk must match; like GNU patch without
fuzz, a hunk may sit at an offset from the line it names (one patch serves
the CUDA and CPU builds, whose files differ elsewhere), the nearest match
after the previous hunk winning. Anything else is a conflict and fails hard
(``PatchConflict``); we work on copies, so the input is untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specpair.overlay.errors import PatchConflict, PatchFormatError

__all__ = ["Hunk", "FilePatch", "PatchSeries", "parse_patch", "apply_file_patch", "reverse"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    """One @@ block."""

    old_start: int  # 1-based first line in the old file (0 when old_len == 0)
    old_lines: tuple[str, ...]  # context + removed lines, with line endings
    new_lines: tuple[str, ...]  # context + added lines, with line endings


@dataclass(frozen=True)
class FilePatch:
    """The hunks of one file."""

    path: str  # path relative to site-packages (a/ and b/ prefixes stripped)
    hunks: tuple[Hunk, ...]  # in file order


@dataclass(frozen=True)
class PatchSeries:
    """One numbered patch file."""

    patch_id: str  # the leading number, e.g. "0001"
    name: str  # the file name
    header: str  # text before the first '--- ' line: what and why
    files: tuple[FilePatch, ...]  # files it touches, in order


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse_patch(path: Path) -> PatchSeries:
    """Parse a numbered unified diff ``NNNN-name.patch``."""
    m = re.match(r"^(\d{4})-[\w.-]+\.patch$", path.name)
    if not m:
        raise PatchFormatError(f"{path.name}: patch names look like NNNN-what.patch")
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines) and not lines[i].startswith("--- "):
        i += 1
    header = "".join(lines[:i])
    if not header.strip():
        raise PatchFormatError(f"{path.name}: missing header (what the patch does and why)")
    files: list[FilePatch] = []
    while i < len(lines):
        if not lines[i].startswith("--- ") or i + 1 >= len(lines) or not lines[i + 1].startswith(
            "+++ "
        ):
            raise PatchFormatError(f"{path.name}:{i + 1}: expected '--- a/FILE' then '+++ b/FILE'")
        old, new = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
        if old != new:
            raise PatchFormatError(
                f"{path.name}:{i + 1}: renames are not supported ({old} -> {new})"
            )
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            hm = _HUNK.match(lines[i])
            if not hm:
                raise PatchFormatError(f"{path.name}:{i + 1}: bad hunk header {lines[i]!r}")
            old_len = int(hm.group(2) or 1)
            new_len = int(hm.group(4) or 1)
            i += 1
            old_lines: list[str] = []
            new_lines: list[str] = []
            while len(old_lines) < old_len or len(new_lines) < new_len:
                if i >= len(lines):
                    raise PatchFormatError(f"{path.name}: hunk ends early")
                line = lines[i]
                tag, body = line[:1], line[1:]
                if line == "\n":  # an empty context line whose space an editor trimmed
                    tag, body = " ", "\n"
                if tag == " ":
                    old_lines.append(body)
                    new_lines.append(body)
                elif tag == "-":
                    old_lines.append(body)
                elif tag == "+":
                    new_lines.append(body)
                else:
                    raise PatchFormatError(f"{path.name}:{i + 1}: bad hunk line {line!r}")
                i += 1
                if i < len(lines) and lines[i].startswith("\\ No newline"):
                    if tag in (" ", "-"):
                        old_lines[-1] = old_lines[-1].rstrip("\n")
                    if tag in (" ", "+"):
                        new_lines[-1] = new_lines[-1].rstrip("\n")
                    i += 1
            hunks.append(Hunk(int(hm.group(1)), tuple(old_lines), tuple(new_lines)))
        if not hunks:
            raise PatchFormatError(f"{path.name}: no hunks for {old}")
        files.append(FilePatch(old, tuple(hunks)))
    if not files:
        raise PatchFormatError(f"{path.name}: no file diffs")
    return PatchSeries(m.group(1), path.name, header, tuple(files))


def apply_file_patch(text: str, fp: FilePatch, where: str) -> str:
    """Apply ``fp`` to ``text`` exactly; raise PatchConflict naming the hunk otherwise."""
    src = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0  # index into src of the next unconsumed line
    for n, h in enumerate(fp.hunks, 1):
        want = h.old_start - 1 if h.old_lines else h.old_start
        start = _locate(src, h.old_lines, want, cursor)
        if start is None:
            got = src[want : want + 1]
            raise PatchConflict(
                f"{where}: {fp.path} hunk {n} does not match at line {h.old_start} or any "
                f"offset (expected {h.old_lines[:1]!r}, found {tuple(got)!r})"
            )
        out.extend(src[cursor:start])
        out.extend(h.new_lines)
        cursor = start + len(h.old_lines)
    out.extend(src[cursor:])
    return "".join(out)


def _locate(src: list[str], old: tuple[str, ...], want: int, cursor: int) -> int | None:
    """Nearest index >= cursor where ``old`` matches ``src``, preferring ``want``."""
    span = len(old)
    last = len(src) - span
    for delta in range(0, max(want - cursor, last - want) + 1):
        for at in (want - delta, want + delta) if delta else (want,):
            if cursor <= at <= last and tuple(src[at : at + span]) == old:
                return at
    return None


def reverse(fp: FilePatch) -> FilePatch:
    """The inverse diff (applying it to a patched file gives the base back)."""
    return FilePatch(fp.path, tuple(Hunk(h.old_start, h.new_lines, h.old_lines) for h in fp.hunks))
