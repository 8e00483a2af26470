"""The stand-in pair of the real-Docker deploy tests (test_deploy_standin.py,
test_deploy_recovery.py): a busybox image built here with `docker import` (no specpair image
needed) serves /health over httpd on host networking as the target's two ranks and the
drafter, through a copy of inventories/local that points the service role at it (no smoke
completion, no in-image gates: the stand-in has none). Needs a statically linked busybox:
$SPECPAIR_TEST_BUSYBOX, or `busybox` on PATH (Debian's busybox-static); skipped otherwise, or
without a Docker engine.
"""


from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# SPECPAIR_TEST_STANDIN_ID (a short name) and SPECPAIR_TEST_STANDIN_PORT (the first of three ports)
# let two runs on one Docker engine (two checkouts) use their own image, containers and ports.
_ID = os.environ.get("SPECPAIR_TEST_STANDIN_ID", "")
_PORT = int(os.environ.get("SPECPAIR_TEST_STANDIN_PORT", "28400"))
_SUFFIX = f"-{_ID}" if _ID else ""
IMAGE = f"specpair-standin{_SUFFIX}:test"
NAMES = {"sparkhead": f"specpair-standin{_SUFFIX}-target",
         "sparkworker": f"specpair-standin{_SUFFIX}-worker",
         "x86host": f"specpair-standin{_SUFFIX}-drafter"}
PORTS = {"sparkhead": _PORT, "x86host": _PORT + 1, "sparkworker": _PORT + 2}
HOSTS = ("local-sparkhead", "local-sparkworker", "local-x86host")
START = b"""#!/bin/sh
mkdir -p /tmp/www && echo ok > /tmp/www/health
exec httpd -f -p 127.0.0.1:$1 -h /tmp/www
"""


def docker(*args: str, **kw) -> subprocess.CompletedProcess:  # noqa: ANN003
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False,
                          timeout=120, **kw)


def _busybox() -> Path | None:
    env = os.environ.get("SPECPAIR_TEST_BUSYBOX")
    found = env or shutil.which("busybox")
    return Path(found) if found and Path(found).is_file() else None


def _rootfs(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "tmp", "run", "run/secrets", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(busybox), "bin/busybox")
        for applet in ("sh", "httpd", "wget", "mkdir", "sleep", "echo"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        info = tarfile.TarInfo("start")
        info.size, info.mode = len(START), 0o755
        tar.addfile(info, io.BytesIO(START))
    return buf.getvalue()


def rm_containers() -> None:
    docker("rm", "-f", *NAMES.values())


def make_standin(tmp_path_factory):  # a module-scoped fixture's body (yields)
    busybox = _busybox()
    if busybox is None:
        pytest.skip("no statically linked busybox ($SPECPAIR_TEST_BUSYBOX, or busybox on PATH "
                    "from Debian's busybox-static) to build the stand-in image from")
    if shutil.which("docker") is None or docker("info").returncode != 0:
        pytest.skip("Docker cannot run here (no docker CLI or no engine answering `docker info`)")
    tmp = tmp_path_factory.mktemp("standin")
    out = subprocess.run(["docker", "import", "-", IMAGE], input=_rootfs(busybox),
                         capture_output=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    image_id = docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    inv = tmp / "inventory"
    shutil.copytree(ROOT / "inventories" / "local", inv)
    with (inv / "group_vars" / "all.yml").open("a") as f:
        f.write("specpair_inventory_name: standin\nspecpair_gates_enabled: false\n")
    for group, name in NAMES.items():
        port = PORTS[group]
        with (inv / "group_vars" / f"{group}.yml").open("a") as f:
            f.write(yaml.safe_dump({
                "specpair_service_container_name": name,
                "specpair_service_command": ["/start", str(port)],
                "specpair_service_healthcheck": ["wget", "-q", "-O", "/dev/null",
                                                 f"http://127.0.0.1:{port}/health"],
                "specpair_service_health_timeout_s": 20,
                "specpair_service_api_url": "",
                "specpair_service_env": {}}))
    releases = {}
    for name, depth in (("sa", 3), ("sb", 2)):
        path = tmp / f"{name}.yml"
        path.write_text(yaml.safe_dump({"name": name, "profiles": {"target": "cpu",
                                                                   "drafter": "cpu"},
                                        "images": {"target": image_id, "drafter": image_id},
                                        "config": {"depth": depth,
                                                   "drafter_mode": "sampled"}}))
        releases[name] = path
    rm_containers()
    yield {"inv": inv, "state": tmp / "state", "releases": releases, "locks": tmp / "locks"}
    rm_containers()
    docker("rmi", IMAGE)


def cli(env: dict, *argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specpair", *argv, "-i", str(env["inv"]), "-e",
         f"specpair_state_root={env['state']}"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "SPECPAIR_LOCK_DIR":
             str(env["locks"])}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(env: dict) -> list:
    return [json.loads((env["state"] / h / "release.json").read_text())["current"]["name"]
            for h in HOSTS]


def label(name: str) -> str | None:
    out = docker("inspect", "--format", '{{index .Config.Labels "specpair.release"}}', name)
    return out.stdout.strip() if out.returncode == 0 else None


def intent(env: dict) -> dict:
    """The intent of the last move (inventories/local: <state root>/intent.json), or {}."""
    try:
        return json.loads((env["state"] / "intent.json").read_text())
    except (OSError, ValueError):  # absent (it is renamed into place whole)
        return {}


def current(env: dict, host: str) -> str | None:
    try:
        data = json.loads((env["state"] / host / "release.json").read_text())
    except (OSError, ValueError):
        return None
    return (data.get("current") or {}).get("name")


# Kill points of a deploy moving to release `to`, found by polling what the run leaves (the
# intent file, container labels, the hosts' release.json), not by hooks in the playbooks.
POINTS = {
    "intent written": lambda env, to: intent(env).get("phase") == "moving"
    and intent(env)["to"]["name"] == to,
    "old target removed": lambda env, to: label(NAMES["sparkhead"]) is None,
    "new drafter started": lambda env, to: label(NAMES["x86host"]) == to,
    # the target's rank 1 starts beside the drafter, before its head
    "new worker started": lambda env, to: label(NAMES["sparkworker"]) == to
    and label(NAMES["sparkhead"]) is None,
    "new target started": lambda env, to: label(NAMES["sparkhead"]) == to,
    "records committing": lambda env, to: intent(env).get("phase") == "commit",
    "first record written": lambda env, to: any(current(env, h) == to for h in HOSTS),
}


def tree(pid: int) -> list[int]:
    """`pid` and every process under it (whatever session or group each runs in)."""
    kids: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL the CLI and everything under it, until only its (unreaped) self is left."""
    for _ in range(20):
        alive = tree(pid)
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        if len(alive) == 1:
            break
        time.sleep(0.05)


def run(env: dict, *argv: str) -> tuple[int, str]:
    p = cli(env, *argv)
    out, err = p.communicate(timeout=900)
    return p.returncode, out + err


def deploy(env: dict, release: str) -> tuple[int, str]:
    return run(env, "deploy", "-r", str(env["releases"][release]))


def previous(env: dict, host: str) -> str | None:
    data = json.loads((env["state"] / host / "release.json").read_text())
    return (data.get("previous") or {}).get("name")


def kill_then(env: dict, point: str, then: str = "deploy") -> str:
    """From a whole pair, start a deploy of the other release, SIGKILL its whole process tree
    at `point`, then run ONE `then` (deploy of that release, rollback or restore) and check it
    converged: one release recorded and running on every host, the intent done, the recovery
    rolled forward exactly when the kill came while committing, and the release `then` moves
    to from the recovered record: deploy the new one, restore the record's current, rollback
    its previous. Exit 0 (restore: 1, only for the completion the stand-in cannot serve).
    Returns a line saying what happened and how long `then` took."""
    if current(env, HOSTS[0]) is None:  # no pair yet: a whole one to move from
        rc, out = deploy(env, "sa")
        assert rc == 0, out
    if then == "rollback" and previous(env, HOSTS[0]) is None:  # something to roll back to
        rc, out = deploy(env, "sb")
        assert rc == 0, out
    now, before = current(env, HOSTS[0]), previous(env, HOSTS[0])
    to = "sb" if now == "sa" else "sa"
    p = cli(env, "deploy", "-r", str(env["releases"][to]))
    t0 = time.monotonic()
    try:
        while not POINTS[point](env, to):
            assert p.poll() is None, f"the run ended before {point}: {p.communicate()}"
            assert time.monotonic() - t0 < 600, f"{point} not reached in 600 s"
            time.sleep(0.02)
    finally:
        killed_at = time.monotonic() - t0
        kill_tree(p.pid)
        p.communicate(timeout=60)
    state = {h: current(env, h) for h in HOSTS}
    phase = intent(env).get("phase")
    assert phase != "done", (point, state)  # the kill left an unfinished intent
    # Committing means every host had passed; the kill leaves the containers running.
    forward = phase == "commit"
    expect = {"deploy": to, "restore": to if forward else now,
              "rollback": now if forward else before}[then]
    t1 = time.monotonic()
    rc, out = (deploy(env, to) if then == "deploy" else
               run(env, "rollback" if then == "rollback" else "restore"))
    took = time.monotonic() - t1
    if then == "restore":  # pair_restored needs a real completion: the stand-in serves none
        assert rc == 1 and "pair consistent: yes" in out, (point, state, out)
        assert "failure: pair_restored is false: no real completion was served" in out, out
    else:
        assert rc == 0, (point, state, out)
    assert "recovery: found an unfinished deploy" in out, out
    assert ("rolled FORWARD" if forward else "rolled BACK") in out, out
    assert [current(env, h) for h in HOSTS] == [expect] * 3, (then, out)
    assert {label(name) for name in NAMES.values()} == {expect}
    assert intent(env).get("phase") == "done"
    said = next(line for line in out.splitlines() if "recovery:" in line).strip()
    return (f"{point} -> {then}: killed {killed_at:.0f} s into the deploy {now} -> {to} with "
            f"records {state}, phase {phase}; then {said}; {then} converged on {expect} in "
            f"{took:.0f} s")


def window(env: dict) -> str:
    """Deploy the other release and measure, from Docker's events, the half-pair window: from
    the first stop signal to the old pair to the new target's health. Checks the order
    playbooks/tasks/apply-pair.yml keeps (every old container gone before the new drafter and
    worker are created; the new drafter healthy and the worker created before the new target
    head is created) and returns a line with the window and its parts."""
    if current(env, HOSTS[0]) is None:
        rc, out = deploy(env, "sa")
        assert rc == 0, out
    to = "sb" if current(env, HOSTS[0]) == "sa" else "sa"
    # Streamed while the deploy runs: `docker events --since` replays only the engine's last
    # few hundred events, which the health checks' exec events (every 2 s) soon push out.
    with tempfile.TemporaryFile("w+") as log:
        watch = subprocess.Popen(["docker", "events", "--format", "{{json .}}",
                                  *(f"--filter=container={n}" for n in NAMES.values())],
                                 stdout=log, text=True)
        try:
            time.sleep(1)  # subscribed before the deploy starts
            rc, out = deploy(env, to)
            time.sleep(1)
        finally:
            watch.terminate()
            watch.wait(timeout=30)
        assert rc == 0, out
        log.seek(0)
        events = log.read()
    at: dict[tuple[str, str], float] = {}
    for line in events.splitlines():
        e = json.loads(line)
        role = {NAMES["sparkhead"]: "target", NAMES["sparkworker"]: "worker",
                NAMES["x86host"]: "drafter"}[e["Actor"]["Attributes"]["name"]]
        at.setdefault((role, e.get("status") or e["Action"]), e["timeNano"] / 1e9)  # the first
    roles = ("target", "worker", "drafter")
    steps = [(r, s) for r in roles for s in ("kill", "destroy")] + [
        ("drafter", "create"), ("drafter", "health_status: healthy"), ("target", "create"),
        ("target", "health_status: healthy"), ("worker", "create")]
    missing = [s for s in steps if s not in at]
    assert not missing, (missing, events)
    stop = min(at[r, "kill"] for r in roles)
    gone = max(at[r, "destroy"] for r in roles)
    t = [gone, *(at[s] for s in steps[6:10])]
    assert t == sorted(t), at  # old pair gone < drafter created < healthy < target created < ...
    assert gone < at["worker", "create"] < at["target", "create"], at
    return (f"half-pair window of the deploy to {to}: {t[4] - stop:.1f} s (first stop signal "
            f"to the old pair -> new target healthy): removals {t[0] - stop:.1f} s, then "
            f"{t[1] - t[0]:.1f} s to the drafter's create, drafter create -> healthy "
            f"{t[2] - t[1]:.1f} s, {t[3] - t[2]:.1f} s of Ansible steps to the target's "
            f"create, target create -> healthy {t[4] - t[3]:.1f} s")
