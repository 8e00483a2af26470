"""The live benchmark's prompts come from the trained pair's held-out corpus."""

from __future__ import annotations

import pytest
from bench.live.workloads import (
    OPTIONAL,
    PER_WORKLOAD,
    WORKLOADS,
    _candidates,
    draw,
    prompts,
    prompts_for,
)

from specpair.models import corpus

FILE = '''import os


def walk(root):
    for dirpath, names, files in os.walk(root):
        yield dirpath


def tree(root):
    seen = set()
    for dirpath, names, files in os.walk(root):
        seen.add(dirpath)
        yield dirpath, len(files)


def documented(x):
    """Return the thing that this function computes from its argument x.

    More words.
    """
    # a comment that is long enough to count as the opening of some prose here
    return x
'''


def test_candidates_are_function_openings_and_prose_openings():
    found = _candidates(FILE)
    code, prose, copy = found["code"], found["prose"], found["copy"]
    assert code == ["def walk(root):\n    for dirpath, names, files in os.walk(root):\n"
                    "        yield dirpath\n",
                    "def tree(root):\n    seen = set()\n"
                    "    for dirpath, names, files in os.walk(root):\n"]
    # a function with three code lines or more, then its def line again: the rest is a copy
    assert copy == ["def tree(root):\n    seen = set()\n"
                    "    for dirpath, names, files in os.walk(root):\n"
                    "        seen.add(dirpath)\n        yield dirpath, len(files)\n"
                    "\ndef tree(root):\n"]
    # a def line followed by a docstring is not code to continue; the docstring is prose
    assert prose == ['"""Return the thing that this function computes from its argument x.\n',
                     "# a comment that is long enough to count as the opening of some prose "
                     "here\n"]
    assert draw([FILE + FILE], per_workload=2)["prose"] == (prose[1], prose[1])  # evenly spaced


def test_draw_refuses_a_corpus_without_enough_prompts():
    with pytest.raises(ValueError, match="held-out corpus has 1 copy prompts, 2 wanted"):
        draw([FILE], per_workload=2)


def test_the_prompts_are_four_distinct_openings_from_held_out_files():
    held_out = corpus.texts(corpus.scan(), "heldout")
    for w in WORKLOADS:
        got = prompts(w)
        assert len(set(got)) == PER_WORKLOAD, got
        # (a copy prompt: a function's opening, then its def line again)
        assert all(any(p.split("\n\n")[0].strip() in t for t in held_out) for p in got)
    assert len(set(prompts_for("code", 0, 4))) == 4  # concurrency 4: four different prompts
    assert prompts_for("code", 1, 1) != prompts_for("code", 0, 1)


def test_the_foreign_workload_is_code_from_packages_the_pair_never_saw():
    """``--workloads foreign``: function openings from installed third-party packages, none
    of them anywhere in the pair's corpus (trained on or held out); not in a plan's default."""
    got = prompts("foreign")
    assert len(set(got)) == PER_WORKLOAD and all(p.lstrip().startswith("def ") for p in got)
    assert "foreign" not in WORKLOADS and "foreign" in OPTIONAL
    files = corpus.scan()
    seen = corpus.texts(files, "train") + corpus.texts(files, "heldout")
    assert not any(p in t for p in got for t in seen)
