"""The live benchmark's prompts, by workload, drawn from the trained pair's held-out corpus.

The corpus is this interpreter's standard library (``specpair.models.corpus``); its held-out
files (about 1 in 10, fixed by path) were never trained on. From them, in corpus order:

- ``code``: a function's first three lines (a ``def`` line and the two code lines after it:
  no comment, docstring or blank line among them), to continue;
- ``prose``: the opening line of a docstring or of a comment (at least 40 characters of
  text, not closed on the line), to continue in words;
- ``copy``: a function's first lines (its ``def`` line and three to five code lines), a blank
  line, then its ``def`` line again: the text to write is mostly in the prompt already (the
  case of "rewrite this with one change" or an echoed record, where a lookup in the request's
  own history drafts best);
- ``foreign`` (only when asked for, ``--workloads foreign``): ``code`` prompts from text the
  pair never saw in any form, the sources of third-party packages installed beside specpair
  (FOREIGN_PACKAGES, pure Python, their versions pinned by the venv's lock): where the
  adaptive policy once stopped drafting in 98 % of rounds (docs/performance.md, "Adaptive
  policy").

Four prompts per workload, taken at evenly spaced places in the list of candidates (so from
different files), so that concurrency 4 sends four different prompts. Prompt i of
repetition r at concurrency c is ``prompts(w)[(r * c + i) % 4]``: every configuration gets the
same prompts in the same repetition. The prompts depend only on the stdlib's bytes, which the
trained pair's manifest pins (``specpair models train-pair --check``); live.json records them.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from specpair.models import corpus

__all__ = ["FOREIGN_PACKAGES", "OPTIONAL", "PER_WORKLOAD", "WORKLOADS", "draw", "prompts",
           "prompts_for"]

WORKLOADS = ("code", "prose", "copy")  # a plan's default
OPTIONAL = ("foreign",)  # run only when named
FOREIGN_PACKAGES = ("click", "jinja2", "requests", "rich", "starlette", "urllib3")
PER_WORKLOAD = 4
MAX_PROMPT_CHARS = 240  # a few tens of tokens: prompt + 128 tokens fit max-model-len 512
MAX_COPY_CHARS = 400  # a copy prompt repeats its def line: about 130 tokens at most
COPY_LINES = (3, 5)  # code lines after the def line in a copy prompt: at least, at most

_DEF = re.compile(r"^\s*def \w+\(.*$")
_DOC = re.compile(r'^\s*(?:"""|\'\'\')(?P<text>[^"\']{40,})$')
_COMMENT = re.compile(r"^\s*# (?P<text>[A-Za-z][^#]{39,})$")


def _code_line(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith(("#", '"', "'", "@"))


def _copy(lines: list[str], i: int) -> str | None:
    """The copy prompt of the function whose ``def`` line is ``lines[i]``, or None."""
    n = 0
    while n < COPY_LINES[1] and i + n + 1 < len(lines) and _code_line(lines[i + n + 1]):
        n += 1
    if n < COPY_LINES[0]:
        return None
    prompt = "\n".join(lines[i:i + n + 1]) + "\n\n" + lines[i] + "\n"
    return prompt if len(prompt) <= MAX_COPY_CHARS else None


def _candidates(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    found: dict[str, list[str]] = {w: [] for w in WORKLOADS}
    for i, line in enumerate(lines):
        if _DEF.match(line) and i + 2 < len(lines) and all(map(_code_line, lines[i + 1:i + 3])):
            prompt = "\n".join(lines[i:i + 3]) + "\n"
            if len(prompt) <= MAX_PROMPT_CHARS:
                found["code"].append(prompt)
            copy = _copy(lines, i)
            if copy is not None:
                found["copy"].append(copy)
        elif (_DOC.match(line) or _COMMENT.match(line)) and len(line) <= MAX_PROMPT_CHARS:
            found["prose"].append(line.strip() + "\n")
    return found


def draw(texts: list[str], per_workload: int = PER_WORKLOAD) -> dict[str, tuple[str, ...]]:
    """``per_workload`` prompts of each of WORKLOADS from ``texts`` (files, in order)."""
    found: dict[str, list[str]] = {w: [] for w in WORKLOADS}
    for text in texts:
        for w, got in _candidates(text).items():
            found[w] += got
    out = {}
    for w, pool in found.items():
        if len(pool) < per_workload:
            raise ValueError(f"the held-out corpus has {len(pool)} {w} prompts, "
                             f"{per_workload} wanted")
        step = len(pool) / per_workload
        out[w] = tuple(pool[int(step * (i + 0.5))] for i in range(per_workload))
    return out


@functools.cache
def _drawn() -> dict[str, tuple[str, ...]]:
    return draw(corpus.texts(corpus.scan(), "heldout"))


@functools.cache
def _foreign() -> tuple[str, ...]:
    """``code`` prompts drawn as above from FOREIGN_PACKAGES' sources, files in path order."""
    texts = []
    for name in FOREIGN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"the foreign workload's package {name} is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
        texts += [f.read_text(encoding="utf-8", errors="replace")
                  for f in sorted(root.rglob("*.py"))]
    return draw(texts)["code"]


def prompts(workload: str) -> tuple[str, ...]:
    return _foreign() if workload == "foreign" else _drawn()[workload]


def prompts_for(workload: str, rep: int, concurrency: int) -> list[str]:
    pool = prompts(workload)
    return [pool[(rep * concurrency + i) % len(pool)] for i in range(concurrency)]
