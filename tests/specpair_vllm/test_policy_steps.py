"""The depth policy's step log (specpair.vllm.policy_steps, SPECPAIR_POLICY_STEPS): every step
it could time, as it timed it, and a path it cannot use costs the engine nothing."""

from __future__ import annotations

import json
import logging

from specpair.vllm.depth_policy import DepthPolicy, sampling_law
from specpair.vllm.policy_steps import ENV, StepLog, summary


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(policy: DepthPolicy, clock: Clock, steps: list[tuple[dict, float, float | None]],
         favoured: list[int | None] | None = None) -> list[int]:
    """Each step: the requests observed (id -> pin), the seconds to the next step and the
    round's (None: none sent). Returns the depths asked for; appends to ``favoured`` what
    the adaptive estimates favoured at each step."""
    asked = []
    for reqs, gap, rnd in steps:
        policy.begin(set(reqs))
        for rid, pin in reqs.items():
            policy.observe(rid, 1, pin=pin, law=sampling_law(1.0, top_p=0.9 if rid == "p" else 1.0))
        asked.append(max(policy.depths().values()))
        if favoured is not None:
            favoured.append(policy.estimates.favoured)
        policy.round_time(rnd)
        policy.work_time(0.5 * gap)
        clock.now += gap
    policy.begin(set())
    return asked


def test_every_step_is_logged_as_the_policy_saw_it(tmp_path, monkeypatch):
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv(ENV, str(path))
    clock = Clock()
    policy = DepthPolicy.from_env(3)
    policy.clock = clock
    favoured: list[int | None] = []
    asked = _run(policy, clock, [({"a": None}, 0.030, 0.006),            # a joins
                                 ({"a": None, "p": None}, 0.050, 0.008),  # p (top-p) joins
                                 ({"a": None, "p": None}, 0.040, None),
                                 ({"a": None, "p": None, "q": "fixed:1"}, 0.060, 0.009),
                                 ({"a": None, "p": None, "q": "fixed:1"}, 0.045, 0.007),
                                 ({"q": "fixed:1"}, 0.045, 0.007)], favoured)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [s["depth"] for s in lines] == asked
    assert [s["prev"] for s in lines] == [None] + asked[:-1]
    assert [round(s["gap_s"], 6) for s in lines] == [0.030, 0.050, 0.040, 0.060, 0.045, 0.045]
    assert [s["round_s"] for s in lines] == [0.006, 0.008, None, 0.009, 0.007, 0.007]
    assert [round(s["work_s"], 6) for s in lines] == [0.015, 0.025, 0.020, 0.030, 0.0225,
                                                      0.0225]
    assert [s["requests"] for s in lines] == [1, 2, 2, 3, 3, 1]
    assert [s["joined"] for s in lines] == [True, True, False, True, False, False]
    assert [s["pinned"] for s in lines] == [False, False, False, True, True, True]
    assert [s["truncated"] for s in lines] == [False, True, True, True, True, False]
    # what the adaptive estimates favoured (the step of the pinned request alone: none)
    assert [s["favoured"] for s in lines] == favoured[:5] + [None]
    # ... and from what: the fitted times and the mean acceptance (none with no favoured)
    adaptive = [s for s in lines if s["favoured"] is not None]
    assert adaptive and all(len(s["rest_ms"]) == len(s["round_ms"]) == 4
                            and len(s["accept"]) == 3 for s in adaptive)
    assert all(s["rest_ms"] is s["round_ms"] is s["accept"] is None
               for s in lines if s["favoured"] is None)
    assert all(s["round_ms"][0] == 0 for s in adaptive)  # no round without drafts
    assert not any(s["greedy"] for s in lines)
    rows = summary(path.read_text().splitlines())  # the steps no request joined
    assert [(r["truncated"], r["pinned"], r["steps"]) for r in rows] == [
        (False, True, 1), (True, False, 1), (True, True, 1)]
    assert [round(r["rest_ms"], 6) for r in rows] == [38.0, 40.0, 38.0]
    assert [round(r["round_ms"], 6) for r in rows] == [7.0, 0.0, 7.0]
    assert [round(r["work_ms"], 6) for r in rows] == [22.5, 20.0, 22.5]


def test_without_the_variable_nothing_is_logged(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert DepthPolicy.from_env(3).steps is None


def test_a_path_it_cannot_open_is_named_once_and_the_policy_runs_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        log = StepLog(str(tmp_path / "missing" / "steps.jsonl"))
    assert len(caplog.records) == 1 and ENV in caplog.records[0].getMessage()
    clock = Clock()
    policy = DepthPolicy(3, clock=clock, steps=log)
    assert _run(policy, clock, [({"a": None}, 0.03, 0.006)] * 4)  # depths chosen as ever


def test_the_drafting_step_logs_its_own_work_beside_its_round(tmp_path):
    """``work_s``: what the drafting protocol's step took on the drafting rank (its round
    included), from ``Drafting.step`` itself: present at every logged step, at least the
    round where one was sent, and under the gap the policy's clock measured around it."""
    import time

    import torch
    from fake_source import FakeSource

    from specpair.vllm.drafting import Drafting, RequestStep

    path = tmp_path / "steps.jsonl"
    d = Drafting(3, 64, 1000, "unused")
    d.policy = DepthPolicy(3, steps=StepLog(str(path)))  # the real clock: time.monotonic
    d.source = FakeSource(["ok"] * 20)
    text = list(range(1, 9))
    for _ in range(6):
        r = RequestStep("r", len(text), 1, 1.0, 0, 1.0, None)
        d.step([r], ["r"], lambda: 0,
               lambda i, a, b: torch.tensor(text[a:b], dtype=torch.int64))
        time.sleep(0.002)
        text.append(1)
    d.policy.begin(set())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 6 and all(s["work_s"] is not None for s in lines)
    assert all(s["work_s"] >= (s["round_s"] or 0.0) for s in lines)
    assert all(0 < s["work_s"] < s["gap_s"] for s in lines)
