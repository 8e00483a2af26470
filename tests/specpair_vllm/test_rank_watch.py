"""A headless tensor-parallel rank exits when its head goes away (specpair.vllm.rank_watch):
over real sockets on 127.0.0.1, the rank's connection to the head's rendezvous port read from
/proc. Not before it joined (the head may start after it), not while the connection holds,
and after the head's side closes: once, with EXIT_HEAD_GONE, after the grace period."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from specpair.vllm.rank_watch import EXIT_HEAD_GONE, connected_to, watch_head

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _wait(cond, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_a_rank_exits_once_its_head_goes_away_and_not_before():
    head = socket.create_server(("127.0.0.1", 0))
    port = head.getsockname()[1]
    other = socket.create_server(("127.0.0.1", 0))
    exits: list[int] = []
    watch_head("127.0.0.1", port, every_s=0.05, grace_s=0.3, exit_=exits.append)
    time.sleep(0.5)
    assert exits == []  # never joined: the head may not be up yet
    elsewhere = socket.create_connection(other.getsockname())
    assert not connected_to("127.0.0.1", port)  # a connection to another port is not the head
    rank = socket.create_connection(("127.0.0.1", port))
    accepted, _ = head.accept()
    assert _wait(lambda: connected_to("127.0.0.1", port))
    time.sleep(0.5)
    assert exits == []  # joined, and the connection holds
    accepted.close()  # the head goes away: the rank's side is left in CLOSE_WAIT
    head.close()
    assert _wait(lambda: exits == [EXIT_HEAD_GONE])
    time.sleep(0.3)
    assert exits == [EXIT_HEAD_GONE]  # once
    rank.close()
    elsewhere.close()
    other.close()


def test_the_health_check_says_whether_the_rank_joined_its_head(capsys):
    """`python -m specpair.vllm.rank_watch ADDR PORT --pid P`: the health check of a headless
    rank (the deploy role's, compose's): 0 once P's process tree holds its connection to the
    head, 1 before and after, 2 for an address that does not resolve; one line each."""
    import os
    import subprocess

    from specpair.vllm.rank_watch import main

    head = socket.create_server(("127.0.0.1", 0))
    port = head.getsockname()[1]
    me = str(os.getpid())
    assert main(["127.0.0.1", str(port), "--pid", me]) == 1
    assert capsys.readouterr().out.startswith("not joined: no connection to the head")
    rank = socket.create_connection(("127.0.0.1", port))
    accepted, _ = head.accept()
    assert _wait(lambda: main(["127.0.0.1", str(port), "--pid", me]) == 0)
    assert "joined: the rank holds a connection to its head" in capsys.readouterr().out
    # another process's tree (a child of this test, holding no socket) does not hold it
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert main(["127.0.0.1", str(port), "--pid", str(other.pid)]) == 1
    finally:
        other.kill()
        other.wait()
    accepted.close()
    rank.close()
    head.close()
    assert _wait(lambda: main(["127.0.0.1", str(port), "--pid", me]) == 1)
    assert main(["no-such-host.invalid", "1"]) == 2
    assert "cannot check the head at no-such-host.invalid:1" in capsys.readouterr().err
