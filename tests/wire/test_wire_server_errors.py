"""The drafter's server answers every frame it cannot take with ERROR and keeps serving.

On the server side: a PROPOSAL at the normalization edge (on which the two
SPARSE checks of the code before disagreed) sent to the drafter ended its connection
callback with "Unhandled exception in client_connected_cb" and no ERROR frame. Now a
frame of a kind the drafter does not take is refused from its header and never decoded,
and a decoder that fails with anything but a WireError (a bug, here injected) is
answered ERROR INTERNAL; either way only that connection closes, and a second target
on the same server keeps being served. Real server on 127.0.0.1, real sockets.
"""

from __future__ import annotations

import logging
import socket
import time

import numpy as np
import pytest
import torch
from wire_helpers import one_row_proposal
from wire_loopback import TrivialDrafter, trivial_hello

from specpair.wire import errors as E
from specpair.wire import server as server_module
from specpair.wire.codec import decode, encode
from specpair.wire.codec.header import HEADER
from specpair.wire.conn import Connection
from specpair.wire.frames import (
    Auth,
    Challenge,
    DraftItem,
    ErrorFrame,
    ProposalFrame,
    Propose,
    ProposeItem,
    RequestParams,
)
from specpair.wire.server import ServerThread

V = 1000
KEY = b"k" * 32
# K = 1, S = 10 at sum q = 1 + 1e-3 (tests/wire/test_wire_norm_edge.py's ulp search): the
# code before raised AssertionError decoding it (numpy's diagnosis accepted what C refused).
EDGE_IDS = [73, 46, 125, 683, 35, 504, 889, 784, 454, 344]
EDGE_LP_BITS = [3225128138, 3219911477, 3214360693, 3222025603, 3227020071, 3223340039,
                3218201799, 3224572434, 3244127068, 3250071190]
EDGE = one_row_proposal(np.array(EDGE_IDS), np.array(EDGE_LP_BITS, np.uint32).view(np.float32))


@pytest.fixture
def drafter(caplog):
    """A loopback drafter's server; on exit, no exception escaped a connection callback."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    hello = trivial_hello(V, support=len(EDGE_IDS))  # the edge row passes the limits
    with ServerThread(TrivialDrafter(hello), hello, KEY) as srv:
        yield srv
        time.sleep(0.1)  # let the closed connections' tasks finish and report
    unhandled = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert unhandled == [], unhandled


def _connect(srv) -> Connection:
    return Connection.open("127.0.0.1", srv.port, KEY, time.monotonic() + 5,
                           check_hello=lambda hello: None)


def _round(conn: Connection, rid: int, round_id: int) -> ProposalFrame:
    """One PROPOSE of a whole 3-token history; its PROPOSAL."""
    item = ProposeItem(rid, torch.tensor([4, 5, 6]), 0, 3, 2, RequestParams(1.0, 0, 1.0, rid),
                       None)
    conn.send(encode(Propose(round_id, (item,))), time.monotonic() + 5)
    answer = conn.read(time.monotonic() + 5)
    assert isinstance(answer, ProposalFrame) and isinstance(answer.items[0], DraftItem)
    return answer


def _refused(conn: Connection, data: bytes, code: int) -> None:
    """``data`` sent on an authenticated connection gets ERROR ``code``, then the close."""
    conn.send(data, time.monotonic() + 5)
    with pytest.raises(E.PeerError, match=f"ERROR {code}:"):
        conn.read(time.monotonic() + 5)
    with pytest.raises(E.ConnectionLost):
        conn.read(time.monotonic() + 5)


def _refused_before_auth(port: int, data: bytes) -> ErrorFrame:
    """``data`` sent instead of AUTH: the ERROR frame it gets (then the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        assert isinstance(decode(s.recv(HEADER.size + 32, socket.MSG_WAITALL),
                                 authenticated=False), Challenge)
        s.sendall(data)
        reply = s.recv(4096)
        assert reply, "closed without an ERROR frame"
        assert s.recv(16) == b""
    err = decode(reply, authenticated=False)
    assert isinstance(err, ErrorFrame)
    return err


def test_a_proposal_at_the_normalization_edge_gets_error_and_the_others_go_on(drafter):
    other = _connect(drafter)
    _round(other, 1, 1)
    assert _refused_before_auth(drafter.port, EDGE).code == E.ErrorCode.AUTH_FAILED
    _refused(_connect(drafter), EDGE, E.ErrorCode.UNEXPECTED)  # a target never sends it
    _round(other, 1, 2)
    assert drafter.server.stats.errors == {"UnexpectedFrame": 2}
    other.close()


def test_a_decoder_failing_otherwise_gets_error_internal_and_the_others_go_on(
        drafter, monkeypatch, caplog):
    bug_nonce = b"\x66" * 32

    def buggy(buf, *args, **kwargs):  # a decoder bug: on request 666, on one AUTH nonce
        frame = decode(buf, *args, **kwargs)
        if (isinstance(frame, Auth) and frame.nonce == bug_nonce) or (
                isinstance(frame, Propose) and frame.items[0].request_id == 666):
            raise RuntimeError("decoder bug")
        return frame

    monkeypatch.setattr(server_module, "decode", buggy)
    other = _connect(drafter)
    _round(other, 1, 1)
    bad = ProposeItem(666, torch.tensor([1]), 0, 1, 2, RequestParams(1.0, 0, 1.0, 0), None)
    _refused(_connect(drafter), encode(Propose(1, (bad,))), E.ErrorCode.INTERNAL)
    err = _refused_before_auth(drafter.port, encode(Auth(bug_nonce, bytes(32))))
    assert err.code == E.ErrorCode.AUTH_FAILED and "failed to decode the AUTH" in err.message
    _round(other, 1, 2)
    assert drafter.server.stats.errors == {"InternalError": 2}
    traced = [r.exc_info[1] for r in caplog.records if r.name == "specpair.wire.server"
              and r.exc_info]
    assert len(traced) == 2 and all(isinstance(e, RuntimeError) for e in traced), traced
    other.close()
