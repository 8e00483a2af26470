"""The stand-in pair of the real-Docker deploy tests (test_deploy_standin.py,
test_deploy_recovery.py): a busybox image built here with `docker import` (no specpair image
needed) serves /health over httpd on host networking as both target and drafter, through a
copy of inventories/local that points the service role at it (no smoke completion, no in-image
gates: the stand-in has none). Needs a statically linked busybox: $SPECPAIR_TEST_BUSYBOX, or
`busybox` on PATH (Debian's busybox-static); skipped otherwise, or without a Docker engine.
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
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "specpair-standin:test"
NAMES = {"sparkhead": "specpair-standin-target", "x86host": "specpair-standin-drafter"}
PORTS = {"sparkhead": 28400, "x86host": 28401}
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
                "specpair_service_health_timeout_s": 40,
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


def deploy(env: dict, release: str) -> tuple[int, str]:
    p = cli(env, "deploy", "-r", str(env["releases"][release]))
    out, err = p.communicate(timeout=900)
    return p.returncode, out + err


def kill_then_deploy(env: dict, point: str) -> str:
    """From a whole pair, start a deploy of the other release, SIGKILL its whole process tree
    at `point`, then run ONE deploy of that release and check it converged: exit 0, one
    release recorded and running on every host, the intent done, rolled forward exactly when
    the kill came while committing. Returns a line saying what happened."""
    now = current(env, HOSTS[0])
    if now is None:  # no pair yet: a whole one to move from
        rc, out = deploy(env, "sa")
        assert rc == 0, out
        now = "sa"
    to = "sb" if now == "sa" else "sa"
    p = cli(env, "deploy", "-r", str(env["releases"][to]))
    t0 = time.monotonic()
    try:
        while not POINTS[point](env, to):
            assert p.poll() is None, f"the run ended before {point}: {p.communicate()}"
            assert time.monotonic() - t0 < 600, f"{point} not reached in 600 s"
            time.sleep(0.02)
    finally:
        kill_tree(p.pid)
        p.communicate(timeout=60)
    state = {h: current(env, h) for h in HOSTS}
    phase = intent(env).get("phase")
    assert phase != "done", (point, state)  # the kill left an unfinished intent
    rc, out = deploy(env, to)
    assert rc == 0, (point, state, out)
    assert "recovery: found an unfinished deploy" in out, out
    # Committing means every host had passed; the kill leaves the containers running.
    assert ("rolled FORWARD" if phase == "commit" else "rolled BACK") in out, out
    assert [current(env, h) for h in HOSTS] == [to] * 3
    assert label(NAMES["sparkhead"]) == to and label(NAMES["x86host"]) == to
    assert intent(env).get("phase") == "done"
    said = next(line for line in out.splitlines() if "recovery:" in line).strip()
    return f"{point}: killed with records {state}, phase {phase}; then {said}"
