"""The depth policy's per-request memo of its estimates (``_Req.memo``): choices made with it
are the choices made computing every estimate afresh, step by step, over a mixed batch (T = 0,
T = 1 and top-p requests, n-gram lookups that match or not, drafted and undrafted steps, a
pinned and a seeded request, requests leaving and joining)."""

from __future__ import annotations

import random

import pytest

from specpair.vllm.depth_policy import DepthPolicy, sampling_law
from specpair.vllm.policy_setting import PolicySetting

K = 3
LAWS = [sampling_law(0.0), sampling_law(1.0), sampling_law(1.0, 0, 0.9)]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(seed: int, fresh: bool, steps: int = 1500) -> list[tuple]:
    """Every step's depths, drafting modes, sources and estimates; ``fresh``: every memo
    emptied before each choice."""
    clock, rng = _Clock(), random.Random(seed)
    p = DepthPolicy(K, PolicySetting("adaptive"), clock=clock, ngram_adaptive=True)
    reqs = [f"r{i}" for i in range(12)]
    handed: dict[str, int] = {}
    out = []
    for s in range(steps):
        clock.now += 0.02 + 0.002 * rng.random() + (0.012 if any(handed.values()) else 0.0)
        p.begin(reqs)
        for j, rid in enumerate(reqs):
            law = LAWS[j % len(LAWS)]
            accepted = 0
            while accepted < handed.get(rid, 0) and rng.random() < (0.85 if law[0] else 0.4):
                accepted += 1
            p.observe(rid, 1 + accepted, "fixed:2" if j == 4 else None, law, j == 7)
            if p.looks_up(rid):
                if rng.random() < 0.3:
                    p.ngram_seen(rid, 2, rng.randrange(3))
                p.lookup(rid, rng.choice([0, 0, 1, 3]))
        if fresh:
            for r in p._reqs.values():
                r.memo.clear()
        depths = p.depths(greedy_items=True)
        out.append((tuple(sorted(depths.items())), tuple(p.greedy(r) for r in reqs),
                    tuple(p.ngram(r) for r in reqs), p.estimates))
        handed = dict(depths)
        for rid, k in depths.items():
            p.handed(rid, k)
        p.round_time(0.01 if any(depths.values()) else None)
        if s % 200 == 199:
            reqs[rng.randrange(len(reqs))] = f"n{s}"
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_the_memo_changes_no_choice(seed):
    memo, fresh = _run(seed, False), _run(seed, True)
    first = next((i for i, (a, b) in enumerate(zip(memo, fresh, strict=True)) if a != b), None)
    assert first is None, f"step {first}: {memo[first]} against {fresh[first]}"
    # the drive exercised what the memo keys on: drafting and no drafts, n-gram drafts
    depths = [k for step in memo for _, k in step[0]]
    assert 0 in depths and any(depths)
    assert any(any(step[2]) for step in memo)
