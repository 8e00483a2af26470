"""Helpers of the end-to-end tests: the probe, and the local pair's child processes (whose
owner is ``specpair.pairprocs``, shared with ``make bench-live``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from specpair.pairprocs import SRC, ApiServer, Drafter, free_port, overlaid_vllm
from vllm_checks.probe import PROBE, RESULT_MARK

__all__ = ["ApiServer", "Drafter", "free_port", "overlaid_vllm", "probe"]


def probe(vllm_dir: Path, model: Path, log: Path, *, env: dict[str, str] | None = None,
          **opts: object) -> dict:
    """Run tests/vllm_checks/probe.py with ``vllm_dir`` first on PYTHONPATH; its JSON report."""
    args = [sys.executable, PROBE, "--model", str(model)]
    for k, v in opts.items():
        args += [f"--{k.replace('_', '-')}", v if isinstance(v, str) else json.dumps(v)]
    full_env = {**os.environ, **(env or {}),
                "PYTHONPATH": os.pathsep.join([str(vllm_dir), str(SRC)])}
    t = time.perf_counter()
    with open(log, "w") as f:
        run = subprocess.run(args, stdout=subprocess.PIPE, stderr=f, text=True, env=full_env,
                             timeout=900)
    lines = [x for x in run.stdout.splitlines() if x.startswith(RESULT_MARK)]
    if run.returncode != 0 or not lines:
        raise RuntimeError(f"probe failed (rc {run.returncode}); see {log}")
    report = json.loads(lines[-1][len(RESULT_MARK):])
    report["wall_s"] = time.perf_counter() - t
    return report
