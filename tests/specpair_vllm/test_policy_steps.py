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
