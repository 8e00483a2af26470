"""Run one of specpair's playbooks through ansible-runner, with live progress from its events.

Each run gets a directory build/deploy/<UTC time>-<action>/ (ansible-runner's private data
dir): the runner's artifacts (stdout, events, status), and what the playbooks fetch to the
controller (summary.json, health.json, <host>/gates-junit.xml).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from specpair.deploy.errors import DeployError

__all__ = ["RunResult", "repo_root", "run_playbook", "Progress"]


def repo_root() -> Path:
    """The checkout holding playbooks/: $SPECPAIR_REPO, else the one this package lives in."""
    env = os.environ.get("SPECPAIR_REPO")
    root = Path(env) if env else Path(__file__).resolve().parents[3]
    if not (root / "playbooks" / "deploy.yml").is_file():
        raise DeployError(f"no playbooks/deploy.yml under {root}: run from a specpair checkout "
                          "or set SPECPAIR_REPO")
    return root


@dataclass(frozen=True)
class RunResult:
    """What one playbook run did."""

    playbook: str  # playbooks/<name>.yml
    status: str  # ansible-runner's: successful, failed, timeout, canceled
    rc: int  # ansible-playbook's exit code
    run_dir: Path  # build/deploy/<run id>/ (runner artifacts + fetched reports)
    stats: dict[str, dict[str, int]]  # host -> {ok, changed, failures, skipped, rescued, ...}
    failures: list[str]  # "host: task: message" for every failed task, in order
    summary: dict[str, Any] | None  # summary.json written by the playbook, if any
    elapsed_s: float  # wall time of the run

    @property
    def changed(self) -> int:
        return sum(s.get("changed", 0) for s in self.stats.values())

    def to_json(self) -> dict[str, Any]:
        return {"playbook": self.playbook, "status": self.status, "rc": self.rc,
                "run_dir": str(self.run_dir), "changed": self.changed, "stats": self.stats,
                "failures": self.failures, "summary": self.summary,
                "elapsed_s": round(self.elapsed_s, 1)}


class Progress:
    """Turns runner events into one line per task and one per changed/failed host result."""

    def __init__(self, out: TextIO | None) -> None:
        self.out = out  # None: silent (--json)
        self.failures: list[str] = []
        self.t0 = time.monotonic()

    def _say(self, text: str) -> None:
        if self.out is not None:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.out, flush=True)

    def __call__(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host", "")
        task = data.get("task", "")
        if kind == "playbook_on_play_start":
            self._say(f"PLAY {data.get('play', '')}")
        elif kind == "playbook_on_task_start" and not task.startswith("Validating arguments"):
            self._say(f"  {task}")
        elif kind == "runner_on_ok" and data.get("res", {}).get("changed"):
            self._say(f"    changed: {host}")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            msg = str(data.get("res", {}).get("msg", "")).strip()
            self.failures.append(f"{host}: {task}: {msg}")
            self._say(f"    FAILED: {host}: {msg[:400]}")
        elif kind == "runner_on_unreachable":
            msg = str(data.get("res", {}).get("msg", "")).strip()
            self.failures.append(f"{host}: unreachable: {msg}")
            self._say(f"    UNREACHABLE: {host}: {msg[:400]}")
        return True


def run_playbook(playbook: str, inventory: Path, extravars: dict[str, Any], *,
                 check: bool = False, tags: str | None = None, action: str = "",
                 out: TextIO | None = sys.stderr,
                 on_event: Callable[[dict[str, Any]], bool] | None = None) -> RunResult:
    """Run playbooks/<playbook> against `inventory`; never raises for a failed play."""
    import ansible_runner  # the deploy extra; imported here so other commands never need it

    root = repo_root()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run_dir = root / "build" / "deploy" / f"{stamp}-{action or Path(playbook).stem}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    extravars = {"specpair_artifacts_dir": str(run_dir / "reports"), **extravars}
    progress = Progress(out)
    flags = (["--check"] if check else []) + ([f"--tags {tags}"] if tags else [])
    t0 = time.monotonic()
    with _stop_on_signals(progress) as stopped:
        r = _run(ansible_runner, stopped,
            private_data_dir=str(run_dir), project_dir=str(root),
            playbook=str(root / "playbooks" / playbook), inventory=str(inventory),
            extravars=extravars, cmdline=" ".join(flags) or None, ident="runner", quiet=True,
            envvars={"ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                     # ansible-playbook from this interpreter's environment, activated or not
                     "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                             f"{os.environ.get('PATH', '')}"},
            event_handler=on_event or progress)
    elapsed = time.monotonic() - t0
    stats = _stats(r.stats or {})
    summary_path = run_dir / "reports" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    failures = progress.failures
    if stopped:
        failures = [*failures, f"stopped by {stopped[0]}: ansible-playbook was ended (its "
                    "process group) before the play finished"]
    if r.rc != 0 and not failures:  # ansible-playbook never ran tasks: say why
        stdout = run_dir / "artifacts" / "runner" / "stdout"
        tail = stdout.read_text().strip().splitlines()[-3:] if stdout.is_file() else []
        failures = [" ".join(tail) or f"ansible-playbook exited {r.rc}"]
    return RunResult(playbook=f"playbooks/{playbook}", status=str(r.status), rc=int(r.rc),
                     run_dir=run_dir, stats=stats, failures=failures,
                     summary=summary, elapsed_s=elapsed)


def _run(ansible_runner: Any, stopped: list[str], **kwargs: Any) -> Any:
    # ansible-runner runs ansible-playbook in its own session (pexpect); a True from
    # cancel_callback makes it SIGKILL that process group and wait for it. It polls the callback
    # at least every pexpect_timeout seconds. Ansible's workers run in sessions of their own
    # (each task's module and commands with them), which that kill does not reach: end_tree
    # ends them first.
    def cancel() -> bool:
        if stopped and len(stopped) == 1:
            stopped.append("ended")
            end_tree(os.getpid())
        return bool(stopped)

    return ansible_runner.run(cancel_callback=cancel, settings={"pexpect_timeout": 0.5},
                              **kwargs)


def _procs() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, state) of every process, from /proc."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            out.append((int(proc.name), int(fields[1]), int(fields[2]), fields[0]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, ppid, _g, _s in _procs():
        out.setdefault(ppid, []).append(pid)
    return out


def _groups_alive(groups: set[int]) -> set[int]:
    """The groups with a live member (a zombie waiting for its parent does not count)."""
    return {g for _p, _pp, g, state in _procs() if g in groups and state not in "ZX"}


def end_tree(pid: int, grace_s: float = 3.0) -> None:
    """SIGTERM every process group under `pid` (not its own), SIGKILL what is left after
    `grace_s`; returns once they are gone (or after the SIGKILL)."""
    children = _children()
    todo, tree = list(children.get(pid, [])), []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    own = os.getpgid(0)
    groups = set()
    for p in tree:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p))
    groups.discard(own)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in _groups_alive(groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        deadline = time.monotonic() + grace_s
        while _groups_alive(groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _groups_alive(groups):
            return


@contextlib.contextmanager
def _stop_on_signals(progress: Progress) -> Iterator[list[str]]:
    """While Ansible runs, SIGINT, SIGTERM and SIGHUP stop it (run_playbook then returns a
    canceled run) instead of killing this process and leaving ansible-playbook running."""
    stopped: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped
        return

    def handler(number: int, _frame: Any) -> None:
        if not stopped:
            stopped.append(signal.Signals(number).name)
            progress._say(f"{stopped[0]}: stopping ansible-playbook and waiting for it")

    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield stopped
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _stats(raw: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    hosts = sorted({h for counts in raw.values() if isinstance(counts, dict) for h in counts})
    keys = ("ok", "changed", "failures", "skipped", "rescued", "dark", "ignored")
    return {h: {k: int(raw.get(k, {}).get(h, 0)) for k in keys} for h in hosts}
