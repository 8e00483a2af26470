"""The pure parts of `make bench-live` (bench/live/): counter deltas, row assembly, ratios
against target-only per repetition, median/min/max, live.json's schema, the speed model's
arithmetic, the table, and the plan's interleaving and estimate. No engine is started (the
live run is tests/bench_live/test_bench_live_quick.py, opt-in)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench.live.__main__ import main as live_main
from bench.live.client import Stream, in_flight, round_quantile, spec_counters, steady_lengths
from bench.live.model import FLAG, predict, verify_s
from bench.live.paired import (
    BEST,
    BEST_ROW,
    paired_cells,
    paired_summaries,
    paired_summary,
    paired_table,
    twin_pairs,
)
from bench.live.plan import (
    ACCEPTANCE,
    FLOOR,
    OFF_TWIN,
    PAIRED_REPS,
    TWIN,
    VERSUS,
    K,
    floor_plan,
    full_plan,
    paired_plan,
    quick_plan,
    versus_plan,
)
from bench.live.report import document, round_split, table
from bench.live.rows import assemble, check_rows, counter_delta, summary

from specpair.vllm.metrics import ROUND_BUCKETS
from specpair.vllm.policy_setting import PIN_ARG, parse_setting

ROOT = Path(__file__).resolve().parents[2]


def _m(config, rep, tps, *, conc=1, temp=1.0, counters=None, decoded=31):
    return {"config": config, "workload": "code", "temperature": temp,
            "top_p": 1.0, "concurrency": conc, "rep": rep, "tokens_per_s": tps,
            "decode_tokens": decoded, "counters": counters or {}}


def test_summary_and_counter_delta():
    assert summary([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0}
    with pytest.raises(ValueError):
        summary([])
    before = {"drafts": 10.0, "per_pos": [5.0, 2.0]}
    after = {"drafts": 14.0, "accepted": 3.0, "per_pos": [7.0, 3.0, 1.0]}
    assert counter_delta(before, after) == {"drafts": 4.0, "accepted": 3.0,
                                            "per_pos": [2.0, 1.0, 1.0]}


def test_ratios_pair_each_repetition_with_target_only_in_the_same_repetition():
    ms = [_m("target_only", 0, 110.0), _m("target_only", 1, 50.0),
          _m("x", 0, 55.0, counters={"drafts": 10.0, "accepted": 6.0, "draft_tokens": 30.0,
                                     "per_pos": [4.0, 2.0, 0.0]}),
          _m("x", 1, 100.0, counters={"drafts": 10.0, "accepted": 4.0, "draft_tokens": 30.0,
                                      "per_pos": [3.0, 1.0, 0.0]})]
    rows = {r["config"]: r for r in assemble(ms)}
    t, x = rows["target_only"], rows["x"]
    assert t["ratio_vs_target_only"] is None and t["reps"] == 2
    assert t["tokens_per_s"] == {"median": 80.0, "min": 50.0, "max": 110.0}
    # rep 0: 55 / 110 = 0.5; rep 1: 100 / 50 = 2.0
    assert x["ratio_vs_target_only"] == {"median": 1.25, "min": 0.5, "max": 2.0}
    assert x["accepted_per_round"] == pytest.approx(10 / 20)
    assert x["accepted_per_position"] == pytest.approx([7 / 20, 3 / 20, 0.0])
    assert x["draft_tokens_per_round"] == pytest.approx(3.0)
    assert x["steps"] == 62 - 10  # decoded minus accepted
    check_rows(list(rows.values()))


def test_a_twin_is_its_own_row_and_its_engine_mate_is_paired_with_it_per_repetition():
    ms = [_m("target_only", r, 50.0) for r in (0, 1)]
    ms += [_m("a", 0, 90.0), _m("a", 1, 60.0)]
    ms += [{**_m("t", 0, 100.0), "twin_of": "a"}, {**_m("t", 1, 50.0), "twin_of": "a"}]
    rows = {r["config"]: r for r in assemble(ms)}
    assert rows["a"]["ratio_vs_twin"] == {"median": pytest.approx(1.05), "min": 0.9,
                                          "max": 1.2}
    assert rows["t"]["twin_of"] == "a" and rows["t"]["ratio_vs_twin"] is None
    assert rows["t"]["ratio_vs_target_only"] == {"median": 1.5, "min": 1.0, "max": 2.0}
    assert rows["target_only"]["ratio_vs_twin"] is None
    check_rows(list(rows.values()))
    doc = document(ms, set(), {"title": "t"}, {"greedy": 0.0, "sampled": 0.0})
    text = table(doc)
    assert "a over t (its requests pinned to fixed:K) in the same engine" in text
    # geometric mean of 0.9 and 1.2, then the median [min-max] of the two ratios
    assert f"code     T=1        c=1: {(0.9 * 1.2) ** 0.5:.3f} [" in text
    assert "]  1.050 [0.900-1.200]  n=2" in text
    # the floor plan's twin is pinned off, and its table says so
    off = [{**m, "config": OFF_TWIN} if m["config"] == "t" else m for m in ms]
    text = table(document(off, set(), {"title": "t"}, {"greedy": 0.0, "sampled": 0.0}, FLOOR))
    assert f"a over {OFF_TWIN} (its requests pinned to off) in the same engine" in text
    assert f"{OFF_TWIN} over target_only (another engine" in text


def test_the_round_split_sums_a_configs_cells_per_concurrency():
    """Mean ms a round over every cell of (config, c): the round as the target timed it, the
    drafter's own share, the rest; rows without both histograms (target-only, vLLM's own
    speculators) are left out."""
    rounds = {"round_s_sum": 0.6, "round_s_count": 60.0, "drafter_s_sum": 0.3,
              "drafter_s_count": 60.0}
    ms = [_m("target_only", 0, 50.0), _m("s", 0, 90.0, counters=rounds),
          {**_m("s", 0, 80.0, counters={**rounds, "round_s_sum": 1.8}), "workload": "prose"},
          _m("vllm_ngram", 0, 70.0, counters={"drafts": 1.0, "draft_tokens": 3.0,
                                               "accepted": 1.0})]
    lines = round_split(assemble(ms))
    assert len(lines) == 3, lines  # the head, its rule, one row
    # (0.6 + 1.8) / 120 = 20 ms a round; the drafter 0.6 / 120 = 5 ms; the rest 15
    assert lines[2].split() == ["s", "1", "120", "20.00", "5.00", "15.00"]
    assert round_split(assemble(ms[:1])) == []


def test_paired_ratios_get_geometric_means_and_bootstrap_intervals_per_cell_and_overall():
    ms = []
    for rep, (a, t) in enumerate([(90.0, 100.0), (110.0, 100.0), (80.0, 100.0), (100.0, 100.0)]):
        for conc in (1, 4):
            chosen = {"chosen": [1.0, 0.0, 0.0, 3.0], "drafted_sampled": 6.0,
                      "drafted_ngram": 2.0}
            ms += [_m("a", rep, a * conc, conc=conc, counters=chosen),
                   {**_m("t", rep, t * conc, conc=conc, counters={"chosen": [0, 0, 0, 9.0]}),
                    "twin_of": "a"}]
    ms.append(_m("a", 9, 50.0))  # a repetition without its twin pairs with nothing
    assert twin_pairs(ms) == [("a", "t")]
    cells = paired_cells(ms, twin_pairs(ms))
    assert all(c["baseline"] == "t" and c["twin"] for c in cells)
    assert [c["concurrency"] for c in cells] == [1, 4]
    assert cells[0]["ratios"] == pytest.approx([0.9, 1.1, 0.8, 1.0])
    assert cells[0]["chosen"] == [4.0, 0.0, 0.0, 12.0]  # the adaptive turns only
    assert cells[0]["drafted"] == {"sampled": 24.0, "ngram": 8.0}  # by mode, summed
    s = paired_summary(cells, resamples=2000)
    gm = (0.9 * 1.1 * 0.8 * 1.0) ** 0.25
    for c in s["cells"]:
        assert c["reps"] == 4 and c["geomean"] == pytest.approx(gm)
        assert c["median"] == pytest.approx(0.95)
        assert 0.8 <= c["low"] < gm < c["high"] <= 1.1  # inside the ratios' own range
    assert s["all"]["geomean"] == pytest.approx(gm) and s["all"]["cells"] == 2
    # two cells' resamples average: the overall interval is narrower than one cell's
    one = s["cells"][0]
    assert s["all"]["high"] - s["all"]["low"] < one["high"] - one["low"]
    assert paired_summary(cells, resamples=2000) == s  # seeded: reproducible
    text = paired_table(s)
    assert "k 0:25% 1:0% 2:0% 3:75%  ngram 25%" in text  # of its draft tokens
    assert f"all 2 cells: {gm:.3f} [" in text
    assert paired_summary([]) == {"cells": [], "all": None} and paired_table(
        {"cells": [], "all": None}) == ""


def test_a_row_over_another_engines_row_pairs_by_cell_and_repetition_and_says_so():
    """Plan.versus: specpair's row over draft_model's in the same cell and repetition; a
    cell only one of them ran pairs with nothing; each pair is its own summary."""
    ms = []
    for rep, (s, d) in enumerate([(95.0, 100.0), (102.0, 100.0), (90.0, 100.0)]):
        ms += [_m("target_only", rep, 50.0, temp=0.0), _m("vllm_draft_model", rep, d, temp=0.0),
               _m("specpair_sampled", rep, s, temp=0.0),
               _m("specpair_greedy", rep, s / 2, temp=0.0)]
    ms += [_m("target_only", 0, 40.0, conc=4, temp=0.0),
           _m("specpair_sampled", 0, 80.0, conc=4, temp=0.0)]  # no draft_model turn
    cells = paired_cells(ms, list(VERSUS))
    assert [(c["config"], c["baseline"], c["twin"], c["concurrency"]) for c in cells] == [
        ("specpair_sampled", "vllm_draft_model", False, 1),
        ("specpair_greedy", "vllm_draft_model", False, 1)]
    assert cells[0]["ratios"] == pytest.approx([0.95, 1.02, 0.90])
    assert cells[1]["ratios"] == pytest.approx([0.475, 0.51, 0.45])
    sums = paired_summaries(cells)
    assert [s["cells"][0]["config"] for s in sums] == ["specpair_sampled", "specpair_greedy"]
    doc = document(ms, set(), {"title": "t"}, {"greedy": 0.0, "sampled": 0.0}, VERSUS)
    text = table(doc)
    gm = (0.95 * 1.02 * 0.90) ** (1 / 3)
    assert ("specpair_sampled over vllm_draft_model (another engine, the same cell and "
            "repetition, seconds apart)") in text
    assert f"code     T=0        c=1: {gm:.3f} [" in text and f"all 1 cells: {gm:.3f}" in text
    assert "specpair_greedy over vllm_draft_model" in text


def test_the_adaptive_row_over_the_best_other_row_marks_the_cells_it_loses():
    """Per cell and repetition, specpair_adaptive over the fastest other result row (its
    twin and vLLM's rows included, the draft-alone calibration not): which row was best is
    kept, and a cell whose median ratio is below 0.95 is marked LOSES in the table, beside
    the row's own speed over target-only in the same repetitions."""
    ms = []
    for rep, (ng, ad) in enumerate([(120.0, 100.0), (90.0, 100.0), (130.0, 104.0)]):
        ms += [_m("target_only", rep, 50.0), _m("vllm_ngram", rep, ng),
               _m("specpair_adaptive", rep, ad), _m(TWIN, rep, 95.0),
               _m("draft_alone", rep, 500.0),  # a calibration: never the best
               # c = 4: the adaptive row is the fastest
               _m("target_only", rep, 40.0, conc=4), _m("specpair_adaptive", rep, 80.0, conc=4),
               _m("vllm_ngram", rep, 60.0, conc=4)]
    for m in ms:
        if m["config"] == TWIN:
            m["twin_of"] = "specpair_adaptive"
    cells = paired_cells(ms, [("specpair_adaptive", BEST)], exclude=frozenset({"draft_alone"}))
    assert [(c["baseline"], c["concurrency"]) for c in cells] == [(BEST, 1), (BEST, 4)]
    assert cells[0]["ratios"] == pytest.approx([100 / 120, 100 / 95, 104 / 130])
    assert cells[0]["best"] == ["vllm_ngram", TWIN, "vllm_ngram"]
    assert cells[1]["ratios"] == pytest.approx([80 / 60] * 3)
    assert cells[0]["over_target"] == pytest.approx([2.0, 2.0, 2.08])
    doc = document(ms, {"draft_alone"}, {"title": "t"}, {"greedy": 0.0, "sampled": 0.0})
    text = table(doc)
    assert "specpair_adaptive over the best other row of the cell" in text
    lost = [ln for ln in text.splitlines() if ln.endswith("LOSES")]
    # per repetition, and against the cell's best row (n-gram's, 112 tok/s at the geomean)
    assert len(lost) == 2 and all("c=1" in ln and "best vllm_ngram" in ln for ln in lost), text
    assert "x target-only 2.00 [2.00-2.08]  best vllm_ngram" in lost[0]
    assert any("c=4" in ln and ln.endswith("best vllm_ngram") for ln in text.splitlines())


def test_against_the_cells_best_row_two_equal_noisy_rows_do_not_make_a_loss():
    """Two rows as fast as each other over the repetitions, each faster in turn: per
    repetition the faster of them (BEST) puts an equally fast adaptive row at 100 / 110 every
    time, a loss; the cell's best row (BEST_ROW: the other row with the highest geometric
    mean, one row for every repetition) reads it 1.0 at the median. The table prints both,
    each marking its own losses."""
    ms = []
    for rep, (a, b) in enumerate([(110.0, 90.0), (90.0, 110.0), (110.0, 90.0), (91.0, 110.0)]):
        ms += [_m("target_only", rep, 50.0), _m("vllm_ngram", rep, a),
               _m("specpair_sampled", rep, b), _m("specpair_adaptive", rep, 100.0),
               _m("draft_alone", rep, 500.0)]  # a calibration: never the best
    pairs = [("specpair_adaptive", BEST), ("specpair_adaptive", BEST_ROW)]
    per_rep, row = paired_cells(ms, pairs, exclude=frozenset({"draft_alone"}))
    assert per_rep["ratios"] == pytest.approx([100 / 110] * 4)
    assert row["baseline"] == BEST_ROW and row["best"] == ["vllm_ngram"] * 4  # 0.3 % ahead
    assert row["ratios"] == pytest.approx([100 / 110, 100 / 90, 100 / 110, 100 / 91])
    assert row["over_target"] == pytest.approx([2.0] * 4)
    text = table(document(ms, {"draft_alone"}, {"title": "t"}, {"greedy": 0.0, "sampled": 0.0}))
    assert "specpair_adaptive over the cell's best other row (best: the row fastest" in text
    lost = [ln for ln in text.splitlines() if ln.endswith("LOSES")]
    assert len(lost) == 1 and "0.909 [0.909-0.909]  n=4" in lost[0], text  # BEST's line only
    assert "1.004 [0.909-1.111]  n=4" in text


def test_sampled_over_greedy_drafts_pairs_accepted_drafts_per_round_at_t_above_0():
    """ACCEPTANCE: specpair_sampled's accepted drafts per round over specpair_greedy's, per
    cell and repetition; the T = 0 cells (both draft the argmax) and a turn that drafted
    nothing are left out; the report says what the ratio is of."""
    def acc(config, rep, accepted, drafts, temp):
        return _m(config, rep, 40.0, temp=temp,
                  counters={"accepted": accepted, "drafts": drafts, "draft_tokens": 3 * drafts})

    ms = []
    for rep, (sa, ga) in enumerate([(60.0, 12.0), (66.0, 10.0), (55.0, 11.0)]):
        ms += [_m("target_only", rep, 30.0), acc("specpair_sampled", rep, sa, 50.0, 1.0),
               acc("specpair_greedy", rep, ga, 50.0, 1.0),
               _m("target_only", rep, 30.0, temp=0.0),
               acc("specpair_sampled", rep, 58.0, 50.0, 0.0),
               acc("specpair_greedy", rep, 58.0, 50.0, 0.0)]
    ms.append(acc("specpair_greedy", 3, 0.0, 0.0, 1.0))  # drafted nothing: no ratio
    cells = paired_cells(ms, list(ACCEPTANCE), "accepted_per_round")
    assert [(c["temperature"], c["measure"]) for c in cells] == [
        (1.0, "accepted_per_round"), (0.0, "accepted_per_round")]
    assert cells[0]["ratios"] == pytest.approx([5.0, 6.6, 5.0])
    with pytest.raises(ValueError, match="measure"):
        paired_cells(ms, list(ACCEPTANCE), "tokens")
    doc = document(ms, set(), {"title": "t"}, {"greedy": 0.0, "sampled": 0.0})
    got = [s for s in doc["paired"] if s["cells"][0]["measure"] == "accepted_per_round"]
    assert len(got) == 1 and [c["temperature"] for c in got[0]["cells"]] == [1.0]
    gm = (5.0 * 6.6 * 5.0) ** (1 / 3)
    assert got[0]["all"]["geomean"] == pytest.approx(gm)
    text = table(doc)
    assert "specpair_sampled over specpair_greedy" in text
    assert "accepted drafts per round per repetition" in text and f"{gm:.3f} [" in text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tokens_per_s", {"median": 5.0, "min": 6.0, "max": 7.0}, "median/min/max"),
    ("ratio_vs_target_only", None, "null exactly"),
    ("top_p", 0.0, "out of range"),
    ("accepted_per_round", 4.0, "accepted_per_round"),
])
def test_check_rows_refuses_a_broken_row(field, value, message):
    ms = [_m("target_only", 0, 10.0),
          _m("x", 0, 10.0, counters={"drafts": 2.0, "accepted": 1.0, "draft_tokens": 6.0})]
    rows = assemble(ms)
    rows[1][field] = value
    with pytest.raises(ValueError, match=message):
        check_rows(rows)
    del rows[1]["steps"]
    with pytest.raises(ValueError, match="lacks steps"):
        check_rows(rows)


def test_verify_time_is_linear_through_the_target_only_steps():
    # 1 token: 1/200 s; 4 tokens (4 streams at 400 tok/s in all): 4/400 s
    assert verify_s(1, 200.0, 400.0) == pytest.approx(0.005)
    assert verify_s(4, 200.0, 400.0) == pytest.approx(0.010)
    assert verify_s(7, 200.0, 400.0) == pytest.approx(0.015)
    # four streams' step measured cheaper than one stream's (2-core noise): between the two
    # points the line, beyond four tokens no cheaper than the four-token step
    assert verify_s(2.5, 25.0, 124.0) == pytest.approx(0.5 * (0.04 + 4 / 124))
    assert verify_s(16, 25.0, 124.0) == pytest.approx(4 / 124)


def _row(config, conc, tps, counters, steps, per_pos):
    return {"config": config, "concurrency": conc, "tokens_per_s": {"median": tps},
            "counters": counters, "steps": steps, "accepted_per_position": per_pos}


def test_speed_model_arithmetic_for_each_kind_of_configuration():
    target = {1: 200.0, 4: 400.0}  # verify(1) = 5 ms, verify(4) = 10 ms, +5/3 ms a token
    q = {"greedy": 0.0001, "sampled": 0.0002}
    cal = predict(_row("target_only", 4, 400.0, {}, 0, None), target, None, q)
    assert cal["predicted_tokens_per_s"] == pytest.approx(400.0) and not cal["flagged"]
    # specpair sampled, c = 1: every step drafts K = 3; 100 rounds, per position 0.6, 0.3, 0.1
    counters = {"drafts": 100.0, "draft_tokens": 300.0, "round_s_count": 100.0,
                "round_s_sum": 0.6, "drafter_s_count": 100.0, "drafter_s_sum": 0.4}
    got = predict(_row("specpair_sampled", 1, 100.0, counters, 100, [0.6, 0.3, 0.1]),
                  target, None, q)
    tokens = 1 + 0.6 + 0.3 + 0.1
    step = 0.010 + 0.004 + 0.002 + 0.0002  # verify(4) + drafter + wire + q
    assert got["tokens_per_step"] == pytest.approx(tokens)
    assert got["step_ms"] == pytest.approx({"verify": 10.0, "draft": 4.0, "wire": 2.0,
                                            "q": 0.2})
    assert got["predicted_tokens_per_s"] == pytest.approx(tokens / step)
    assert got["gap"] == pytest.approx(tokens / step / 100.0 - 1)
    assert got["flagged"] == (abs(got["gap"]) > FLAG)
    # ngram, c = 4: drafts in half the steps, 2 draft tokens per drafting round
    ng = predict(_row("vllm_ngram", 4, 300.0, {"drafts": 50.0, "draft_tokens": 100.0}, 100,
                      [0.5, 0.2]), target, None, q)
    assert ng["tokens_per_step"] == pytest.approx(1 + 0.5 * 0.7)
    assert ng["step_ms"]["verify"] == pytest.approx(1e3 * verify_s(4 * 2.0, 200.0, 400.0))
    # draft_model needs the draft-alone calibration: K steps of the draft at c
    dm = _row("vllm_draft_model", 1, 80.0, {"drafts": 10.0, "draft_tokens": 30.0}, 10,
              [0.5, 0.25, 0.125])
    assert predict(dm, target, None, q) is None
    got = predict(dm, target, {1: 1000.0}, q)
    assert got["step_ms"] == pytest.approx({"verify": 10.0, "draft": 1e3 * K / 1000.0})
    assert predict(dm, {1: 200.0}, {1: 1000.0}, q) is None  # no c = 4 target-only row


def test_document_and_table_flag_a_prediction_far_off():
    ms = [_m("target_only", 0, 200.0, conc=1), _m("target_only", 0, 400.0, conc=4, decoded=124)]
    # draft_model measured far below what its parts predict
    ms += [_m("vllm_draft_model", 0, 20.0, counters={"drafts": 10.0, "draft_tokens": 30.0,
                                                    "accepted": 10.0,
                                                    "per_pos": [6.0, 3.0, 1.0]}, decoded=20),
           _m("draft_alone", 0, 1000.0), _m("draft_alone", 0, 2000.0, conc=4, decoded=124)]
    doc = document(ms, {"draft_alone"}, {"title": "t"}, {"greedy": 0.0, "sampled": 0.0})
    json.dumps(doc)  # serializable as it stands
    assert [r["config"] for r in doc["calibration"]] == ["draft_alone", "draft_alone"]
    dm = next(r for r in doc["rows"] if r["config"] == "vllm_draft_model")
    assert dm["model"]["flagged"] and dm["model"]["gap"] > FLAG
    text = table(doc)
    line = next(x for x in text.splitlines() if x.startswith("vllm_draft_model"))
    gap, p99 = line.split()[-2:]
    assert gap.endswith("!") and p99 == "-" and "0.10 [0.10-0.10]" in line


def test_spec_counters_read_vllm_and_drafter_texts():
    vllm_text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="specpair-trained"} 7.0\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 2.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 5.0\n')
    drafter_text = ("# TYPE specpair_drafter_round_seconds histogram\n"
                    'specpair_drafter_round_seconds_bucket{le="+Inf"} 3\n'
                    "specpair_drafter_round_seconds_sum 0.25\n"
                    "specpair_drafter_round_seconds_count 3\n")
    target_text = ("# TYPE specpair_chosen_depth counter\n"
                   'specpair_chosen_depth_total{depth="0"} 4.0\n'
                   'specpair_chosen_depth_total{depth="3"} 9.0\n'
                   "# TYPE specpair_draft_tokens counter\n"
                   'specpair_draft_tokens_total{mode="sampled",position="1"} 6.0\n'
                   'specpair_draft_tokens_total{mode="sampled",position="2"} 5.0\n'
                   'specpair_draft_tokens_total{mode="ngram",position="1"} 2.0\n')
    assert spec_counters(vllm_text, drafter_text, target_text) == {
        "drafts": 7.0, "per_pos": [5.0, 2.0], "drafter_s_sum": 0.25, "drafter_s_count": 3.0,
        "chosen": [4.0, 0.0, 0.0, 9.0], "drafted_sampled": 11.0, "drafted_ngram": 2.0}


def test_a_stream_in_one_chunk_has_no_client_side_rate():
    assert Stream(33, 1.0, 1.5, 0.9).decode_tokens_per_s == 64.0
    assert Stream(33, 1.0, 1.0, 0.9).decode_tokens_per_s is None  # merged by a late API server


def test_steady_streams_spread_the_measured_requests_and_cover_them_to_the_last_one():
    assert steady_lengths(1, 128) == [(0, 0)]  # one stream: its measured request alone
    got = steady_lengths(4, 128)
    assert [lead for lead, _ in got] == [0, 32, 64, 96]  # starts spread over one request
    # every stream is busy until the last measured request has ended, 16 tokens to spare
    assert [lead + 128 + cover for lead, cover in got[:-1]] == [96 + 128 + 16] * 3
    assert got[-1][1] == 0
    got = steady_lengths(16, 32)  # short requests: no request under 2 tokens
    assert min(n for pair in got for n in pair if n) >= 2


def test_in_flight_is_the_time_mean_share_of_c_while_the_measured_requests_decode():
    measured = [Stream(11, 1.0, 3.0, 0.5), Stream(11, 2.0, 4.0, 1.5)]
    # stream 0's cover from 3.0, stream 1's lead-in until 1.5: both busy in both windows
    assert in_flight(measured + [Stream(5, 3.2, 4.5, 3.0), Stream(5, 0.2, 1.5, 0.0)],
                     measured, 2) == pytest.approx(1.0)
    # nothing beside them: [1, 3] has the other from 1.5 (75 %), [2, 4] from nothing past 3
    assert in_flight(measured, measured, 2) == pytest.approx((1.5 + 2 + 2 + 1) / (2 * 4))


def test_round_histogram_gives_an_upper_bound_of_the_p99():
    # 100 rounds: 90 within 5 ms, 9 more within 10 ms, the last within 25 ms
    def cumulative(bound):
        return 0 if bound < 0.005 else 90 if bound < 0.01 else 99 if bound < 0.025 else 100

    text = "# TYPE specpair_round_seconds histogram\n" + "".join(
        f'specpair_round_seconds_bucket{{le="{b}"}} {cumulative(b)}\n' for b in ROUND_BUCKETS
    ) + 'specpair_round_seconds_bucket{le="+Inf"} 100\n'
    le = spec_counters(text)["round_le"]
    assert le[-1] == 100 and le[ROUND_BUCKETS.index(0.005)] == 90
    assert round_quantile(le, 0.99) == 0.01
    assert round_quantile(le, 0.5) == 0.005
    assert round_quantile(le, 1.0) == 0.025
    assert round_quantile([0.0] * len(le), 0.99) is None


def test_plans_interleave_every_cell_once_per_repetition_each_engine_once():
    for plan in (full_plan(("code", "prose")), quick_plan(("code", "prose"))):
        names = [c.name for c in plan.run]
        assert names[0] == "target_only" and len(set(names)) == len(names)
        first = plan.cells(0)
        for rep in range(plan.reps):
            assert sorted(map(str, plan.cells(rep))) == sorted(map(str, first))
        assert plan.cells(1)[0] == first[1]  # rotated
    full = full_plan(("code", "prose"))
    assert full.reps >= 5 and len(full.cells(0)) == 2 * 3 * 3  # c = 1, 4 and 16
    assert "draft_alone" in {c.name for c in full.run}


def test_every_cell_runs_in_every_engine_in_turn_the_first_turn_rotating():
    plan = full_plan(("code", "prose"))
    names = [c.name for c in plan.run]
    rows = names + [TWIN]
    firsts = []
    for rep in range(plan.reps):
        for n in range(len(plan.cells(rep))):
            turns = plan.turns(rep, n)
            assert sorted(name for _, name, _ in turns) == sorted(rows)
            for config, name, xargs in turns:  # the twin in its engine, pinned
                assert (config.name, xargs) == (("specpair_adaptive", {PIN_ARG: f"fixed:{K}"})
                                                if name == TWIN else (name, None))
            firsts.append(turns[0][1])
    # 5 x 18 cells over 8 turns: each turn first 11 or 12 times
    assert {firsts.count(r) for r in rows} == {11, 12}


def test_too_little_memory_for_the_engines_is_one_line_and_exit_3(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr("bench.live.run.ENGINE_MB", 10**9)
    assert live_main(["--quick", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bench-live: 6 engines up at once want about 6000000000 MB, "
                              "the box has ") and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "live-work" / "measurements.jsonl").exists()


def test_the_paired_plan_runs_only_the_adaptive_engine_many_times():
    plan = paired_plan(("code", "prose"))
    assert [c.name for c in plan.run] == ["specpair_adaptive"]
    assert plan.run[0].twin == (TWIN, f"fixed:{K}") and plan.reps == PAIRED_REPS >= 20
    assert plan.cells(0) == full_plan(("code", "prose")).cells(0)  # the full plan's cells
    assert plan.measurements() == 20 * 18 * 2 + 3  # adaptive and twin, + warm-ups


def test_the_versus_plan_runs_draft_model_and_specpairs_fixed_rows_at_t0_many_times():
    plan = versus_plan(("code", "prose"))
    assert [c.name for c in plan.run] == ["target_only", "vllm_draft_model", "specpair_greedy",
                                          "specpair_sampled"]
    assert plan.versus == VERSUS and plan.reps == PAIRED_REPS
    assert [s.temperature for s in plan.samplings] == [0.0] and plan.concurrencies == (1, 4)
    assert all(c.twin is None for c in plan.run)
    assert full_plan(("code",)).versus == quick_plan(("code",)).versus == VERSUS
    assert paired_plan(("code",)).versus == ()


def test_the_floor_plan_runs_target_only_and_the_adaptive_engine_with_a_twin_pinned_off():
    plan = floor_plan(("code", "prose"))
    assert [c.name for c in plan.run] == ["target_only", "specpair_adaptive"]
    assert plan.run[1].twin == (OFF_TWIN, "off") and plan.reps == PAIRED_REPS
    assert plan.run[1].env == {"SPECPAIR_DEPTH_POLICY": "adaptive"}  # the policy as shipped
    assert [s.temperature for s in plan.samplings] == [1.0, 1.0]
    assert [s.top_p for s in plan.samplings] == [1.0, 0.9]
    assert plan.versus == FLOOR == (("specpair_adaptive", "target_only"),
                                    (OFF_TWIN, "target_only"))
    assert plan.measurements() == 20 * 12 * 3 + 2 * 3  # target-only, adaptive, twin; warm-ups
    assert parse_setting("off", K).mode == "off"  # the twin's pin is a setting the engine reads


def test_specpair_rows_pin_the_depth_policy_and_adaptive_runs_it_as_shipped():
    for plan in (full_plan(("code", "prose")), quick_plan(("code", "prose"))):
        by = {c.name: c for c in plan.run}
        assert by["specpair_greedy"].env == {"SPECPAIR_DEPTH_POLICY": f"fixed:{K}"}
        assert by["specpair_sampled"].env == {"SPECPAIR_DEPTH_POLICY": f"fixed:{K}"}
        adaptive = by["specpair_adaptive"]
        assert adaptive.env == {"SPECPAIR_DEPTH_POLICY": "adaptive"}
        assert adaptive.drafter_args == ("--mode", "sampled")
        assert adaptive.speculative["num_speculative_tokens"] == K  # K max = the bench's K
        assert adaptive.twin == (TWIN, f"fixed:{K}")  # pinned per request, same engine
        assert all(c.twin is None for c in by.values() if c is not adaptive)
        assert by["target_only"].env == by["vllm_draft_model"].env == {}


def test_the_command_tells_its_plan_and_duration_and_refuses_bad_input(tmp_path, capsys):
    ok = subprocess.run([sys.executable, "-m", "bench.live", "--plan"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "7 engine starts" in ok.stderr and "all up at once, taking turns" in ok.stderr
    assert "minutes on a quiet 2-core box" in ok.stderr
    paired = subprocess.run([sys.executable, "-m", "bench.live", "--paired", "--reps", "3",
                             "--plan"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert paired.returncode == 0, paired.stderr
    assert "paired plan: 1 engine start (specpair_adaptive), 3 interleaved" in paired.stderr
    for argv, message in ((["--pair", str(tmp_path)], "no target/config.json"),
                          (["--env", "NOEQUALS"], "KEY=VALUE"), (["--bogus"], "bogus"),
                          (["--reps", "0"], "--reps wants 1..200"),
                          (["--workloads", "code,poetry"], "--workloads wants some of"),
                          (["--concurrency", "1,x"], "--concurrency wants integers"),
                          (["--quick", "--paired"], "not allowed with"),
                          (["--paired", "--versus"], "not allowed with")):
        with pytest.raises(SystemExit) as exit_:
            live_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 4 and len(err.strip().splitlines()) == 1, err
        assert message in err
    assert live_main(["--quick", "--concurrency", "16", "--plan"]) == 4
    assert capsys.readouterr().err == ("bench-live: --concurrency 16: the QUICK plan runs 1,4\n")
    assert live_main(["--workloads", "copy", "--concurrency", "1,16", "--plan"]) == 0
    assert "(workloads copy; T=0, T=1, T=1 top-p 0.9; concurrency 1, 16)" in \
        capsys.readouterr().err
    assert live_main(["--paired", "--workloads", "foreign", "--concurrency", "1", "--plan"]) == 0
    assert "(workloads foreign; T=0, T=1, T=1 top-p 0.9; concurrency 1)" in \
        capsys.readouterr().err
    minutes = {}
    for flags in ([], ["--steady"]):  # c requests kept in flight: about 2 - 1/c a turn's time
        assert live_main(["--floor", "--concurrency", "16", "--plan", *flags]) == 0
        err = capsys.readouterr().err
        assert ("concurrency 16, c > 1 kept in flight)" in err) == bool(flags), err
        minutes[bool(flags)] = int(err.split("About ")[1].split()[0])
    assert 1.6 * minutes[False] < minutes[True] < 2.1 * minutes[False], minutes


def test_report_only_renders_table_json_and_png_from_a_runs_measurements(tmp_path, capsys):
    pair = tmp_path / "pair"
    (pair / "target").mkdir(parents=True)
    (pair / "target" / "config.json").write_text('{"vocab_size": 64}')
    work = tmp_path / "live-work"
    work.mkdir()
    (work / "run.json").write_text(json.dumps({"pair": str(pair), "title": "t"}))
    counters = {"drafts": 30.0, "draft_tokens": 90.0, "accepted": 30.0,
                "per_pos": [18.0, 9.0, 3.0], "round_s_count": 8.0, "round_s_sum": 0.04,
                "drafter_s_count": 8.0, "drafter_s_sum": 0.03}
    ms = [_m("target_only", r, 100.0 + r, conc=c) for r in (0, 1) for c in (1, 4)]
    ms += [_m("specpair_sampled", r, 90.0, conc=c, counters=counters)
           for r in (0, 1) for c in (1, 4)]
    (work / "measurements.jsonl").write_text("".join(json.dumps(m) + "\n" for m in ms))
    assert live_main(["--report-only", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "live.json").read_text())
    check_rows(doc["rows"])
    assert len(doc["rows"]) == 4 and all(r["model"] is not None for r in doc["rows"])
    assert "specpair_sampled" in out and "wrote " in out
    assert (tmp_path / "live.png").read_bytes()[:4] == b"\x89PNG"

    # a saved live.json (as bench/results/ keeps them) prints the same table, writing nothing
    saved = tmp_path / "saved.json"
    (tmp_path / "live.json").rename(saved)
    assert live_main(["--report-only", "--from", str(saved)]) == 0
    assert capsys.readouterr().out == table(doc) + "\n"
    assert not (tmp_path / "live.json").exists()


def test_report_only_from_a_file_that_is_no_live_json_is_one_line_and_exit_4(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    for text in ("{", '{"rows": []}'):
        bad.write_text(text)
        assert live_main(["--report-only", "--from", str(bad)]) == 4
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "not a readable live.json" in err
    assert live_main(["--report-only", "--from", str(tmp_path / "absent.json")]) == 4
    assert "not a readable live.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        live_main(["--from", str(bad)])
    assert exit_.value.code == 4 and "--from is for --report-only" in capsys.readouterr().err
