"""Everything the project cites lives in the repository.

Over every git-tracked text file (``git ls-files``; the suffixes and names in ``TEXT_*``),
this file itself excepted:

- every ``docs/...`` path named resolves to a file or directory (trailing punctuation and
  ``#anchor`` stripped), and "docs/x.md section N" (or "§ N", or "docs/x.md N") names a
  heading numbered N in docs/x.md ("## N. Title" or "### N.M Title");
- every relative Markdown link in docs/*.md resolves;
- every "patch NNNN" names a patch file ``overlays/vllm/*/NNNN-*.patch``;
- every repository path in backticks in the "Where things live" table of docs/architecture.md
  exists (a path counts as a repository path when its first component is a top-level entry of
  the repository, so `vllm/...` paths inside a vLLM wheel are not checked);
- ``git grep "shared/"`` finds nothing, and nothing cites "FACTS.md" or "ARCHITECTURE.md"
  (the design briefing those names belong to is not part of a clone).

Deterministic, no network, well under a second.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

TEXT_SUFFIXES = {".py", ".md", ".sh", ".yml", ".yaml", ".j2", ".toml", ".cfg", ".c", ".patch",
                 ".json", ".lock"}
TEXT_NAMES = {"Containerfile", "Makefile"}

# A docs/ path not glued to a longer path (so "foo/docs/x" is not one), up to the first
# character that cannot be part of a path.
DOCS_PATH = re.compile(r"(?<![\w./-])docs/[\w./#-]*")
# "docs/x.md section 3.4", "docs/x.md §5", "docs/x.md 3.3", "`docs/x.md` section 9".
DOCS_SECTION = re.compile(
    r"(?<![\w./-])(docs/[\w./-]+?\.md)[`'\"]?(?:,?\s*(?:section|§)\s*|\s+)(\d+(?:\.\d+)*)\b")
PATCH_NUMBER = re.compile(r"\bpatch\s+(\d{4})\b", re.IGNORECASE)
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
BACKTICKED = re.compile(r"`([^`\s]+)`")


@functools.cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode()
    return tuple(p for p in out.split("\0") if p)


@functools.cache
def text_files() -> tuple[str, ...]:
    keep = []
    for p in tracked():
        path = Path(p)
        if p == SELF or not (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES):
            continue
        if (ROOT / p).is_file():  # a tracked file deleted in the work tree is not cited
            keep.append(p)
    return tuple(keep)


@functools.cache
def read(p: str) -> str:
    return (ROOT / p).read_text(encoding="utf-8", errors="replace")


def lines(pattern: re.Pattern):
    """(file, line number, match) for every match of ``pattern`` in the text files."""
    for p in text_files():
        for n, line in enumerate(read(p).splitlines(), 1):
            for m in pattern.finditer(line):
                yield p, n, m


def exists(rel: str) -> bool:
    """A file or directory of the work tree, ``*`` globs and one ``{a,b}`` group allowed."""
    brace = re.search(r"\{([^{}]*)\}", rel)
    if brace:
        return all(exists(rel[: brace.start()] + alt + rel[brace.end():])
                   for alt in brace.group(1).split(","))
    rel = rel.rstrip("/")
    if "*" in rel:
        return any(ROOT.glob(rel))
    return (ROOT / rel).exists()


def clean(path: str) -> str:
    return path.split("#", 1)[0].rstrip(".,;:)'\"`")


@functools.cache
def headings(doc: str) -> tuple[str, ...]:
    return tuple(line for line in read(doc).splitlines() if line.startswith("#"))


def has_section(doc: str, number: str) -> bool:
    heading = re.compile(r"^#{1,6}\s+" + re.escape(number) + r"(?:[.\s]|$)")
    return any(heading.match(h) for h in headings(doc))


def where(hits) -> str:
    return "\n".join(f"  {p}:{n}: {what}" for p, n, what in hits)


def test_every_docs_path_resolves():
    bad = [(p, n, m.group(0)) for p, n, m in lines(DOCS_PATH)
           if not exists(clean(m.group(0)))]
    assert not bad, f"docs/ paths that do not exist:\n{where(bad)}"


def test_every_cited_docs_section_exists():
    bad = []
    for p, n, m in lines(DOCS_SECTION):
        doc, number = m.group(1), m.group(2)
        if not (ROOT / doc).is_file():
            continue  # reported by test_every_docs_path_resolves
        if not has_section(doc, number):
            bad.append((p, n, f"{m.group(0)!r}: {doc} has no heading numbered {number}"))
    assert not bad, f"sections cited that do not exist:\n{where(bad)}"


def test_every_markdown_link_in_docs_resolves():
    bad = []
    for p in text_files():
        if not (p.startswith("docs/") and p.endswith(".md")):
            continue
        for n, line in enumerate(read(p).splitlines(), 1):
            for m in MD_LINK.finditer(line):
                target = m.group(1).split("#", 1)[0]
                if not target or re.match(r"^[a-z]+:", target):
                    continue  # an anchor in the same page, or a URL
                if not (ROOT / p).parent.joinpath(target).exists():
                    bad.append((p, n, m.group(1)))
    assert not bad, f"Markdown links in docs/ that do not resolve:\n{where(bad)}"


def test_every_patch_number_names_a_patch():
    have = {Path(p).name[:4] for p in tracked()
            if re.fullmatch(r"overlays/vllm/[^/]+/\d{4}-[^/]+\.patch", p)}
    assert have, "no overlays/vllm/*/NNNN-*.patch found"
    bad = [(p, n, m.group(0)) for p, n, m in lines(PATCH_NUMBER) if m.group(1) not in have]
    assert not bad, f"'patch NNNN' naming no patch (have {sorted(have)}):\n{where(bad)}"


def where_things_live() -> list[tuple[int, str]]:
    """(line number, path) for each repository path in backticks in the table."""
    doc = "docs/architecture.md"
    if not (ROOT / doc).is_file():
        pytest.fail(f"{doc} does not exist")
    text = read(doc).splitlines()
    start = next((i for i, line in enumerate(text)
                  if re.match(r"^#+\s+where things live\s*$", line, re.IGNORECASE)), None)
    if start is None:
        pytest.fail(f"{doc} has no 'Where things live' heading")
    top = {p.split("/", 1)[0] for p in tracked()}
    out = []
    for i in range(start + 1, len(text)):
        line = text[i]
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            continue
        for m in BACKTICKED.finditer(line):
            token = m.group(1)
            if token.split("/", 1)[0] in top:
                out.append((i + 1, token))
    return out


def test_where_things_live_paths_exist():
    paths = where_things_live()
    assert len(paths) >= 20, f"the table names only {len(paths)} repository paths"
    bad = [("docs/architecture.md", n, path) for n, path in paths if not exists(clean(path))]
    assert not bad, f"paths in the 'Where things live' table that do not exist:\n{where(bad)}"


def git_grep(*args: str) -> list[str]:
    r = subprocess.run(["git", "grep", "-n", *args, "--", ".", f":!{SELF}"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    return r.stdout.splitlines()


def test_nothing_points_outside_the_repository():
    hits = git_grep("-F", "-e", "shared/")
    assert not hits, "`git grep shared/` finds:\n" + "\n".join(hits)


def test_nothing_cites_the_design_briefing():
    hits = git_grep("-F", "-e", "FACTS.md", "-e", "ARCHITECTURE.md")
    assert not hits, ("cites FACTS.md / ARCHITECTURE.md (use docs/facts.md, "
                      "docs/architecture.md):\n" + "\n".join(hits))
