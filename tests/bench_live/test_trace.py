"""The pure parts of `python -m bench.live.trace` (bench/live/trace.py): the policy's gauges
read from a /metrics text, the fitted step times over the polls of a full batch, the chosen
depths between two polls, a pinned turn's measured step time, and the table. No engine is
started (the trace itself runs vLLM engines: minutes)."""

from __future__ import annotations

import math

import pytest
from bench.live.plan import K
from bench.live.trace import PINS, chosen, estimates, fitted, main, step_ms, step_table, table

METRICS = """# HELP specpair_policy_requests x
specpair_policy_requests 16.0
specpair_policy_favoured_depth 3.0
specpair_policy_step_seconds{depth="0",part="rest"} 0.0465
specpair_policy_step_seconds{depth="3",part="rest"} 0.0465
specpair_policy_step_seconds{depth="3",part="round"} 0.0317
specpair_chosen_depth_total{depth="0"} 10.0
specpair_chosen_depth_total{depth="3"} 30.0
vllm:num_requests_running 16.0
"""


def test_estimates_keep_the_policy_series_only():
    got = estimates(METRICS)
    assert got["specpair_policy_requests"] == 16.0
    assert got['specpair_chosen_depth_total{depth="3"}'] == 30.0
    assert not any(k.startswith("vllm:") for k in got)


def test_fitted_reads_the_polls_of_a_full_batch_only():
    full = estimates(METRICS)
    tail = {**full, "specpair_policy_requests": 3.0,
            'specpair_policy_step_seconds{depth="0",part="rest"}': 0.010}
    zero = {**full, "specpair_policy_favoured_depth": 0.0}
    got = fitted([full, tail, zero, full], 16, 3)
    assert got["t0_ms"] == pytest.approx(46.5)
    assert got["tk_ms"] == pytest.approx(46.5 + 31.7)
    assert got["favoured_0"] == pytest.approx(1 / 3)
    assert fitted([tail], 16, 3) == {"t0_ms": None, "tk_ms": None, "favoured_0": None}


def test_chosen_is_the_share_of_request_rounds_between_two_polls():
    before = estimates(METRICS)
    after = {**before, 'specpair_chosen_depth_total{depth="0"}': 40.0,
             'specpair_chosen_depth_total{depth="3"}': 40.0}
    assert chosen(before, after, 3) == [0.75, 0.0, 0.0, 0.25]
    assert chosen(before, before, 3) == [0.0] * 4


def test_a_pinned_turns_step_is_its_requests_tokens_a_step_over_its_rate():
    off = {"concurrency": 16, "tokens_per_s": 486.0, "counters": {}}
    k3 = {"concurrency": 16, "tokens_per_s": 357.5, "counters": {"drafts": 100.0,
                                                                 "accepted": 134.0}}
    assert step_ms(off) == pytest.approx(1e3 * 16 / 486.0)
    assert step_ms(k3) == pytest.approx(1e3 * 16 * 2.34 / 357.5)


def _turn(pin: str, rep: int, rate: float, **extra) -> dict:
    return {"law": "T=1 top-p 0.9", "concurrency": 16, "rep": rep, "pin": pin,
            "tokens_per_s": rate, "counters": {"drafts": 10.0, "accepted": 13.0},
            "chosen": [0.2, 0.0, 0.1, 0.7], **extra}


def test_the_table_gives_adaptive_over_the_pinned_rows_per_repetition():
    turns = []
    for rep, (a, z, f) in enumerate([(400.0, 500.0, 360.0), (380.0, 470.0, 500.0)]):
        turns += [_turn("adaptive", rep, a, t0_ms=46.5, tk_ms=78.2, favoured_0=0.1),
                  _turn(PINS[0], rep, z), _turn(PINS[1], rep, f)]
    text = table(turns)
    row = text.splitlines()[1]
    assert row.startswith("T=1 top-p 0.9 c=16")
    assert f"{math.sqrt(400 / 500 * 380 / 470):9.3f}" in row  # over fixed:0
    assert f"{math.sqrt(400 / 500 * 380 / 500):7.3f}" in row  # over the better pinned row
    assert "46.5 /" in row and "78.2 /" in row and "20% 0% 10% 70%" in row
    assert f"t({K})" in text.splitlines()[0]


def test_the_step_table_gives_each_kind_of_full_step_its_median_cost():
    """policy_steps.summary's rows: full batches of the traced concurrencies, 3 steps or more."""
    row = {"truncated": True, "greedy": False, "requests": 16, "pinned": False, "prev": 3,
           "depth": 3, "steps": 37, "rest_ms": 56.1, "round_ms": 31.8, "work_ms": 33.25}
    text = step_table([row, {**row, "prev": None, "depth": 0, "greedy": True, "truncated": False,
                             "pinned": True, "rest_ms": 27.3, "round_ms": 0.0, "work_ms": None},
                       {**row, "requests": 9}, {**row, "steps": 2}], (16, 4))
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[1].split() == ["top-p/k", "c=16", "no", "3->3", "37", "56.1", "31.8", "33.25"]
    assert lines[2].split() == ["T=0", "c=16", "yes", "-->0", "37", "27.3", "0.0", "-"]


def test_bad_input_is_one_line_and_exit_4(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--concurrency", "32"])
    assert e.value.code == 4
    assert "--concurrency wants 1..16" in capsys.readouterr().err
