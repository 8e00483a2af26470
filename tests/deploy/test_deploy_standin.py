"""The real playbooks on the local Docker engine with a stand-in pair (issue 16, items 1 and 3):
a busybox image built here with `docker import` (no specpair image needed) serves /health over
httpd on host networking as both target and drafter, through a copy of inventories/local that
points the service role at it (no smoke completion, no in-image gates: the stand-in has none).

  deploy A -> exit 0, pair consistent;
  deploy B while the test takes the target's port once the old target is gone: B's target and
  then A's target (the rescue) restart-loop -> a concurrent deploy is refused (exit 6), the run
  exits 1 listing both failures (the failed rollback included), "pair consistent: NO", next
  step restore, records back at A;
  port freed -> restore -> exit 0, pair_restored.

Needs a statically linked busybox: $SPECPAIR_TEST_BUSYBOX, or `busybox` on PATH (Debian's
busybox-static); skipped otherwise, or without a Docker engine.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
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


def _docker(*args: str, **kw) -> subprocess.CompletedProcess:  # noqa: ANN003
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


def _rm_containers() -> None:
    _docker("rm", "-f", *NAMES.values())


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    busybox = _busybox()
    if busybox is None:
        pytest.skip("no statically linked busybox ($SPECPAIR_TEST_BUSYBOX, or busybox on PATH "
                    "from Debian's busybox-static) to build the stand-in image from")
    if shutil.which("docker") is None or _docker("info").returncode != 0:
        pytest.skip("Docker cannot run here (no docker CLI or no engine answering `docker info`)")
    tmp = tmp_path_factory.mktemp("standin")
    out = subprocess.run(["docker", "import", "-", IMAGE], input=_rootfs(busybox),
                         capture_output=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    image_id = _docker("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
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
    _rm_containers()
    yield {"inv": inv, "state": tmp / "state", "releases": releases, "locks": tmp / "locks"}
    _rm_containers()
    _docker("rmi", IMAGE)


def _cli(env: dict, *argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "specpair", *argv, "-i", str(env["inv"]), "-e",
         f"specpair_state_root={env['state']}"],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "SPECPAIR_LOCK_DIR":
             str(env["locks"])}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _records(env: dict) -> list:
    return [json.loads((env["state"] / h / "release.json").read_text())["current"]["name"]
            for h in HOSTS]


def _label(name: str) -> str | None:
    out = _docker("inspect", "--format", '{{index .Config.Labels "specpair.release"}}', name)
    return out.stdout.strip() if out.returncode == 0 else None


def test_deploy_a_serves(standin):
    p = _cli(standin, "deploy", "-r", str(standin["releases"]["sa"]))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, out + err
    assert "pair consistent: yes" in out
    assert _records(standin) == ["sa"] * 3
    assert _label(NAMES["sparkhead"]) == "sa" and _label(NAMES["x86host"]) == "sa"


def test_a_failed_rollback_is_a_failure_listed_with_the_next_step(standin):
    p = _cli(standin, "deploy", "-r", str(standin["releases"]["sb"]))
    blocker = None
    try:
        t0 = time.monotonic()
        while _label(NAMES["sparkhead"]) == "sa":  # until the old target is removed
            assert p.poll() is None and time.monotonic() - t0 < 120
            time.sleep(0.05)
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", PORTS["sparkhead"]))
        blocker.listen()
        second = _cli(standin, "deploy", "-r", str(standin["releases"]["sa"]))
        _, err2 = second.communicate(timeout=60)
        assert second.returncode == 6, err2
        assert f"pid {p.pid} on host" in err2 and "(deploy of release sb, inventory standin" in err2
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    try:
        assert p.returncode == 1, out + err
        assert "specpair deploy: FAILED" in out and "pair consistent: NO" in out
        assert "putting the previous release sa back failed too" in out
        assert "failure: local-sparkhead: Check that the service is healthy" in out
        assert "next step: specpair restore -i" in out
        assert _records(standin) == ["sa"] * 3  # every record written back as it was
    finally:
        blocker.close()
    # The port is free again: the looping target comes up by its restart policy, and restore
    # finds the whole pair on A. pair_restored also needs a real completion, which the
    # stand-in cannot serve: restore says so and exits 1 (the real images' sequence,
    # test_deploy_pair.py, shows pair_restored: true).
    p = _cli(standin, "restore")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, out + err
    assert "pair consistent: yes" in out and _label(NAMES["sparkhead"]) == "sa"
    assert "failure: pair_restored is false: no real completion was served" in out
    assert _records(standin) == ["sa"] * 3
