"""Handshake refusals are counted, logged at most once a minute, and a bare TCP probe is not
logged as a refusal (real server, real client, 127.0.0.1)."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from wire_loopback import TrivialDrafter, trivial_hello

from specpair.wire import errors as E
from specpair.wire.client import DraftClient
from specpair.wire.server import ServerThread

V = 500
KEY = b"k" * 32


def _refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and r.getMessage().startswith("refused a connection at the handshake")]


def _wait(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cond()


def test_refusals_are_rate_limited_and_port_probes_stay_quiet(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="specpair.wire.server")
    hello = trivial_hello(V)
    with ServerThread(TrivialDrafter(hello), hello, KEY) as srv:
        stats = srv.server.stats
        for _ in range(20):  # what a TCP health check does: connect, close (the server sees
            # the end of the stream, or a reset when its CHALLENGE meets the closed socket)
            socket.create_connection(("127.0.0.1", srv.port), timeout=3).close()
        _wait(lambda: stats.auth_failures == 20)
        assert _refused(caplog) == []
        for _ in range(4):  # a peer without the key: refused four times, logged once
            wrong = DraftClient("127.0.0.1", srv.port, b"w" * 32, vocab_size=V,
                                tokenizer_fingerprint=bytes(32))
            with pytest.raises(E.AuthFailed):
                wrong.connect(timeout_s=5.0)
            wrong.close()
        _wait(lambda: stats.auth_failures == 24)
        assert len(_refused(caplog)) == 1
        srv.server._refusals.every_s = 0.2  # shorten the minute: the next line may come
        time.sleep(0.3)
        wrong = DraftClient("127.0.0.1", srv.port, b"w" * 32, vocab_size=V,
                            tokenizer_fingerprint=bytes(32))
        with pytest.raises(E.AuthFailed):
            wrong.connect(timeout_s=5.0)
        wrong.close()
        _wait(lambda: len(_refused(caplog)) == 2)
        assert _refused(caplog)[1].endswith("(3 more since the previous such line)")
