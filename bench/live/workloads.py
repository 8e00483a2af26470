"""The live benchmark's prompts, by workload, drawn from the trained pair's held-out corpus.

The corpus is this interpreter's standard library (``specpair.models.corpus``); its held-out
files (about 1 in 10, fixed by path) were never trained on. From them, in corpus order:

- ``code``: a function's first three lines (a ``def`` line and the two code lines after it:
  no comment, docstring or blank line among them), to continue;
- ``prose``: the opening line of a docstring or of a comment (at least 40 characters of
  text, not closed on the line), to continue in words.

Four prompts per workload, taken at evenly spaced places in the list of candidates (so from
different files), so that concurrency 4 sends four different prompts. Prompt i of
repetition r at concurrency c is ``prompts(w)[(r * c + i) % 4]``: every configuration gets the
same prompts in the same repetition. The prompts depend only on the stdlib's bytes, which the
trained pair's manifest pins (``specpair models train-pair --check``); live.json records them.
"""

from __future__ import annotations

import functools
import re

from specpair.models import corpus

__all__ = ["PER_WORKLOAD", "WORKLOADS", "draw", "prompts", "prompts_for"]

WORKLOADS = ("code", "prose")
PER_WORKLOAD = 4
MAX_PROMPT_CHARS = 240  # a few tens of tokens: prompt + 128 tokens fit max-model-len 512

_DEF = re.compile(r"^\s*def \w+\(.*$")
_DOC = re.compile(r'^\s*(?:"""|\'\'\')(?P<text>[^"\']{40,})$')
_COMMENT = re.compile(r"^\s*# (?P<text>[A-Za-z][^#]{39,})$")


def _code_line(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith(("#", '"', "'", "@"))


def _candidates(text: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    code, prose = [], []
    for i, line in enumerate(lines):
        if _DEF.match(line) and i + 2 < len(lines) and all(map(_code_line, lines[i + 1:i + 3])):
            prompt = "\n".join(lines[i:i + 3]) + "\n"
            if len(prompt) <= MAX_PROMPT_CHARS:
                code.append(prompt)
        elif (_DOC.match(line) or _COMMENT.match(line)) and len(line) <= MAX_PROMPT_CHARS:
            prose.append(line.strip() + "\n")
    return code, prose


def draw(texts: list[str], per_workload: int = PER_WORKLOAD) -> dict[str, tuple[str, ...]]:
    """``per_workload`` prompts of each workload from ``texts`` (held-out files, in order)."""
    found: dict[str, list[str]] = {w: [] for w in WORKLOADS}
    for text in texts:
        code, prose = _candidates(text)
        found["code"] += code
        found["prose"] += prose
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


def prompts(workload: str) -> tuple[str, ...]:
    return _drawn()[workload]


def prompts_for(workload: str, rep: int, concurrency: int) -> list[str]:
    pool = prompts(workload)
    return [pool[(rep * concurrency + i) % len(pool)] for i in range(concurrency)]
