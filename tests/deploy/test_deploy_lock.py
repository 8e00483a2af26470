"""One run at a time, honest exit codes, and a CLI that owns its Ansible run (two runs on one
pair, an exit 0 for a broken pair, or an ansible-playbook still running after its CLI was
stopped, would each leave the pair split unseen): the deploy lock (specpair.deploy.lock)
refuses a second run at once naming the holder and takes over a stale one; a play that exits
0 on a pair the summary calls inconsistent is a failure; SIGTERM to `specpair gates` ends
ansible-playbook within seconds.

The concurrent and SIGTERM tests are real: `python -m specpair` subprocesses and a real
ansible-runner run of a playbook that sleeps (a stand-in playbooks/gates.yml in a copy of the
checkout, inventories/local), no Docker needed. The others replace run_playbook with a stub."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specpair.cli import main
from specpair.deploy import runner
from specpair.deploy.lock import DeployLock, Locked, holder_record
from specpair.errors import EXIT_BUSY, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

ROOT = Path(__file__).resolve().parents[2]
ID = "sha256:" + "a" * 64
MARK = "3127.5"  # the stand-in playbook's `sleep` argument: finds its process in /proc

SLEEPER = f"""---
- name: Sleep as a long gate run would
  hosts: controller
  gather_facts: false
  tasks:
    - name: Sleep
      ansible.builtin.command: sleep {MARK}
      changed_when: false
"""


def _release(name: str) -> dict:
    return {"name": name, "profiles": {"target": "cpu", "drafter": "cpu"},
            "images": {"target": ID, "drafter": ID},
            "config": {"depth": 4, "drafter_mode": "sampled"}}


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout copy (SPECPAIR_REPO) whose gates.yml sleeps; releases a and b; a state root
    and lock directory of its own."""
    root = tmp_path / "repo"
    (root / "playbooks").mkdir(parents=True)
    (root / "playbooks" / "deploy.yml").write_text("---\n")
    (root / "playbooks" / "gates.yml").write_text(SLEEPER)
    shutil.copy(ROOT / "ansible.cfg", root / "ansible.cfg")
    shutil.copytree(ROOT / "inventories" / "local", root / "inventories" / "local")
    (root / "releases").mkdir()
    for name in ("a", "b"):
        (root / "releases" / f"{name}.yml").write_text(yaml.safe_dump(_release(name)))
    monkeypatch.setenv("SPECPAIR_REPO", str(root))
    monkeypatch.setenv("SPECPAIR_LOCK_DIR", str(tmp_path / "locks"))
    return root


def _env(root: Path) -> dict[str, str]:
    return {**os.environ, "SPECPAIR_REPO": str(root), "PYTHONPATH": str(ROOT / "src"),
            "SPECPAIR_LOCK_DIR": str(root.parent / "locks")}


def _cli(root: Path, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specpair", *argv, "-e",
                             f"specpair_state_root={root.parent / 'state'}"],
                            env=_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _sleepers() -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", MARK.encode()] and not _zombie(proc):
                out.append(int(proc.name))
    return out


def _zombie(proc: Path) -> bool:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return True


def _wait_for(what, timeout: float = 60.0):  # noqa: ANN001, ANN202
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s")


def test_a_second_run_is_refused_at_once_naming_the_holder_and_sigterm_stops_ansible(repo):
    """Two concurrent runs on one inventory: the second exits 6 at once with one line naming
    the first (pid, host, action, since); SIGTERM to the first ends its ansible-playbook (and
    the sleeping task) within a few seconds, exit 130, lock released."""
    first = _cli(repo, "gates", "-i", "local")
    try:
        _wait_for(_sleepers)  # Ansible is inside the task
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "specpair", "deploy", "-i", "local", "-r",
                                 "b", "-e", f"specpair_state_root={repo.parent / 'state'}"],
                                env=_env(repo), capture_output=True, text=True, timeout=60)
        assert second.returncode == EXIT_BUSY, second.stderr
        err = second.stderr
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"pid {first.pid} on host " in err and "(gates, inventory local, since 20" in err
        assert "another run holds the deploy lock" in err and "nothing was changed" in err
        assert time.monotonic() - t0 < 15  # refused, not queued behind a 50-minute sleep

        t0 = time.monotonic()
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=30)
        stopped_s = time.monotonic() - t0
        assert first.returncode == EXIT_INTERRUPTED, err
        _wait_for(lambda: not _sleepers(), timeout=3)  # its task's process is gone too
        assert stopped_s < 5, stopped_s
        assert "SIGTERM: stopping ansible-playbook" in err
        assert "stopped by SIGTERM" in out and "next step: the run was stopped" in out
        assert "specpair restore -i local" in out
        locks = sorted((repo.parent / "locks").iterdir())
        assert [p.name for p in locks] == ["host-" + os.uname().nodename + ".lock",
                                           "inventory-local.lock"]
        assert all(p.read_text() == "" for p in locks)  # released: no holder left
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for pid in _sleepers():
            os.kill(pid, signal.SIGKILL)


def _stub(monkeypatch: pytest.MonkeyPatch, summary: dict | None, rc: int = 0) -> list:
    calls: list = []

    def fake(playbook, inventory, extravars, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(playbook)
        return runner.RunResult(playbook, "successful" if rc == 0 else "failed", rc,
                                inventory.parent, {}, [], summary, 0.0)

    monkeypatch.setattr(runner, "run_playbook", fake)
    return calls


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_stale_lock_is_taken_over_and_said_so(repo, monkeypatch, capsys, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    stale = {**holder_record("deploy", "local", "a"), "pid": _dead_pid(),
             "since": "2026-01-01T00:00:00Z"}
    (locks / "inventory-local.lock").write_text(json.dumps(stale))
    calls = _stub(monkeypatch, None)
    assert main(["gates", "-i", "local", "-e", f"specpair_state_root={tmp_path / 's'}"]) == 0
    err = capsys.readouterr().err
    assert calls == ["gates.yml"]
    assert f"took over the stale deploy lock {locks}/inventory-local.lock from pid " \
           f"{stale['pid']} on host" in err
    assert "(deploy of release a, inventory local, since 2026-01-01T00:00:00Z): no longer " \
           "running" in err
    assert (locks / "inventory-local.lock").read_text() == ""


def test_a_held_lock_refuses_in_process_too(tmp_path):
    held = DeployLock(tmp_path / "x.lock")
    held.acquire(holder_record("deploy", "local", "a"))
    try:
        with pytest.raises(Locked, match=r"pid \d+ on host .*\(deploy of release a"):
            DeployLock(tmp_path / "x.lock").acquire(holder_record("rollback", "local", None))
    finally:
        held.release()
    DeployLock(tmp_path / "x.lock").acquire(holder_record("rollback", "local", None))


def _summary(consistent: bool, restored: bool = True) -> dict:
    host = {"role": "target_head", "record_current": "b", "running_release": "b",
            "container": "c", "matches_record": consistent, "health": "ok", "gates": None}
    return {"hosts": {"local-sparkhead": host}, "pair_consistent": consistent,
            "recorded_release": ["b"], "failures": [], "requested": {"name": "b"},
            "pair_restored": restored, "check_mode": False}


@pytest.mark.parametrize("action", ["deploy", "rollback", "restore"])
def test_a_play_that_exits_0_on_an_inconsistent_pair_fails(repo, monkeypatch, capsys, tmp_path,
                                                           action):
    _stub(monkeypatch, _summary(False))
    extra = ["-r", "b"] if action == "deploy" else []
    argv = [action, "-i", "local", *extra, "-e", f"specpair_state_root={tmp_path / 's'}"]
    assert main(argv) == EXIT_FAILED
    out = capsys.readouterr().out
    assert f"specpair {action}: FAILED" in out and "pair consistent: NO" in out
    assert ("failure: pair consistent: NO after the play (hosts not running their recorded "
            "release healthy: local-sparkhead") in out
    assert "next step: specpair restore -i local" in out
    _stub(monkeypatch, _summary(False))
    assert main([*argv, "--json"]) == EXIT_FAILED
    data = json.loads(capsys.readouterr().out)
    assert data["rc"] == 1 and data["next_step"].startswith("specpair restore -i local")


def test_a_consistent_pair_is_ok_and_restore_needs_pair_restored(repo, monkeypatch, tmp_path):
    state = ["-e", f"specpair_state_root={tmp_path / 's'}"]
    _stub(monkeypatch, _summary(True))
    assert main(["deploy", "-i", "local", "-r", "b", *state]) == EXIT_OK
    _stub(monkeypatch, _summary(True, restored=False))
    assert main(["restore", "-i", "local", *state]) == EXIT_FAILED
