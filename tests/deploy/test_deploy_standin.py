"""The real playbooks on the local Docker engine with a stand-in pair (the lock, the exit codes
and the rescue's failures checked against real containers, without specpair's images):
a busybox image built here with `docker import` (no specpair image needed) serves /health over
httpd on host networking as the target's two ranks and the drafter, through a copy of
inventories/local that points the service role at it (no smoke completion, no in-image gates:
the stand-in has none).

  deploy A -> exit 0, pair consistent;
  deploy B while the test takes the target's port once the old target is gone: B's target and
  then A's target (the rescue) restart-loop -> a concurrent deploy is refused (exit 6), the run
  exits 1 listing both failures (the failed rollback included), "pair consistent: NO", next
  step restore, records back at A;
  port freed -> restore -> the pair whole on A (exit 1: pair_restored needs a real completion);
  the whole process tree of a deploy SIGKILLed after the first host's record write (records
  disagree) -> ONE deploy rolls forward and converges (test_deploy_recovery.py sweeps every
  kill point under SPECPAIR_DEPLOY_KILL_SWEEP=1).

The stand-in and its needs: tests/deploy/standin.py.
"""

from __future__ import annotations

import socket
import time

import pytest
from standin import NAMES, PORTS, cli, kill_then, label, make_standin, records


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    yield from make_standin(tmp_path_factory)


def test_deploy_a_serves(standin):
    p = cli(standin, "deploy", "-r", str(standin["releases"]["sa"]))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, out + err
    assert "pair consistent: yes" in out
    assert records(standin) == ["sa"] * 3
    assert label(NAMES["sparkhead"]) == "sa" and label(NAMES["x86host"]) == "sa"


def test_a_failed_rollback_is_a_failure_listed_with_the_next_step(standin):
    p = cli(standin, "deploy", "-r", str(standin["releases"]["sb"]))
    blocker = None
    try:
        t0 = time.monotonic()
        while label(NAMES["sparkhead"]) == "sa":  # until the old target is removed
            assert p.poll() is None and time.monotonic() - t0 < 120
            time.sleep(0.05)
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", PORTS["sparkhead"]))
        blocker.listen()
        second = cli(standin, "deploy", "-r", str(standin["releases"]["sa"]))
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
        assert records(standin) == ["sa"] * 3  # every record written back as it was
    finally:
        blocker.close()
    # The port is free again: the looping target comes up by its restart policy, and restore
    # finds the whole pair on A. pair_restored also needs a real completion, which the
    # stand-in cannot serve: restore says so and exits 1 (the real images' sequence,
    # test_deploy_pair.py, shows pair_restored: true).
    p = cli(standin, "restore")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, out + err
    assert "pair consistent: yes" in out and label(NAMES["sparkhead"]) == "sa"
    assert "failure: pair_restored is false: no real completion was served" in out
    assert records(standin) == ["sa"] * 3


def test_a_kill_at_a_record_write_is_finished_by_the_next_deploy(standin):
    print(kill_then(standin, "first record written"))
