"""The drafter's server bounds what one connection can hold.

Real server on 127.0.0.1, real sockets, the loopback TrivialDrafter as handler:
- a connection that sends nothing after authentication is closed after idle_timeout_s;
- a frame whose header started but which does not complete within frame_timeout_s (a
  stalled 256 MiB header) gets ERROR MALFORMED and the close, not a connection held forever;
- past max_requests_per_connection the least recently asked for requests are released
  (RESYNC when asked again);
- a round is handed to the handler in chunks (items and new tokens), answered whole and in
  order;
- a frame over the server's frame limit is refused from its header;
- two targets' requests are held apart, each connection reported once when authenticated.
"""

from __future__ import annotations

import dataclasses
import struct
import time

import pytest
import torch
from wire_loopback import TrivialDrafter, trivial_hello

from specpair.wire import errors as E
from specpair.wire.codec import encode
from specpair.wire.codec.header import HEADER, LIMITS
from specpair.wire.conn import Connection
from specpair.wire.frames import ItemStatus, ProposalFrame, Propose, ProposeItem, RequestParams
from specpair.wire.server import ServerThread, chunks, pieces

V = 1000
KEY = b"k" * 32
P = RequestParams(1.0, 0, 1.0, 3)


def _connect(srv) -> Connection:
    return Connection.open("127.0.0.1", srv.port, KEY, time.monotonic() + 5,
                           check_hello=lambda hello: None)


def _item(rid: int, new: list[int], position: int | None = None) -> ProposeItem:
    return ProposeItem(rid, torch.tensor(new), 0, len(new) if position is None else position,
                       2, P, None)


def _ask(conn: Connection, round_id: int, *items: ProposeItem) -> ProposalFrame:
    conn.send(encode(Propose(round_id, items)), time.monotonic() + 5)
    answer = conn.read(time.monotonic() + 5)
    assert isinstance(answer, ProposalFrame) and answer.round_id == round_id
    return answer


class _Recording(TrivialDrafter):
    def __init__(self, hello) -> None:
        super().__init__(hello)
        self.calls: list[int] = []  # items per handle() call
        self.released: list[tuple[int, ...]] = []

    def handle(self, propose: Propose) -> ProposalFrame:
        self.calls.append(len(propose.items))
        return super().handle(propose)

    def release(self, request_ids: tuple[int, ...]) -> None:
        self.released.append(tuple(request_ids))
        super().release(request_ids)


def _server(handler=None, **options) -> ServerThread:
    hello = trivial_hello(V)
    return ServerThread(handler or _Recording(hello), hello, KEY, **options)


def test_an_idle_connection_is_closed_after_its_timeout() -> None:
    with _server(idle_timeout_s=0.3) as srv:
        conn = _connect(srv)
        _ask(conn, 1, _item(1, [1, 2]))
        with pytest.raises(E.ConnectionLost):
            conn.read(time.monotonic() + 5)  # closed quietly, without an ERROR
        assert srv.server.stats.idle_closed == 1
        t = time.monotonic()
        while not srv.server.handler.released and time.monotonic() - t < 5:
            time.sleep(0.01)
        assert srv.server.handler.released == [(1,)]  # its requests are released


def test_a_stalled_frame_gets_error_and_the_close() -> None:
    stalled = []
    with _server(frame_timeout_s=0.3, on_stalled=lambda: stalled.append(1)) as srv:
        conn = _connect(srv)
        head = struct.pack("<4sHBBII", b"SPWR", 1, 5, 0, LIMITS.frame_bytes - HEADER.size, 0)
        conn.send(head[:9], time.monotonic() + 5)  # a 256 MiB header, started, never finished
        t = time.monotonic()
        with pytest.raises(E.PeerError, match=f"ERROR {E.ErrorCode.MALFORMED}:"):
            conn.read(time.monotonic() + 5)
        assert time.monotonic() - t < 3
        assert srv.server.stats.stalled == 1 and stalled == [1]
        conn2 = _connect(srv)
        conn2.send(head, time.monotonic() + 5)  # a whole header, then no body
        with pytest.raises(E.PeerError, match="not complete"):
            conn2.read(time.monotonic() + 5)
        assert srv.server.stats.stalled == 2


def test_requests_per_connection_are_bounded_lru() -> None:
    with _server(max_requests_per_connection=2) as srv:
        conn = _connect(srv)
        _ask(conn, 1, _item(1, [1, 2]))
        _ask(conn, 2, _item(2, [1, 2]))
        _ask(conn, 3, _item(1, [3], position=3))  # 1 is now more recent than 2
        _ask(conn, 4, _item(3, [1, 2]))
        assert srv.server.handler.released == [(2,)] and srv.server.stats.evicted == 1
        got = _ask(conn, 5, _item(2, [3], position=3), _item(1, [4], position=4))
        assert [i.status for i in got.items] == [ItemStatus.RESYNC, ItemStatus.OK]
        conn.close()


def test_a_round_is_served_in_chunks_answered_whole_and_in_order() -> None:
    with _server(chunk_items=3, chunk_tokens=10) as srv:
        conn = _connect(srv)
        items = [_item(r, [1, 2]) for r in range(10)] + [_item(10, list(range(1, 30)))]
        got = _ask(conn, 1, *items)
        assert [i.request_id for i in got.items] == list(range(11))
        assert all(i.status == ItemStatus.OK for i in got.items)
        assert srv.server.handler.calls == [3, 3, 3, 1, 1, 1, 1]  # 29 tokens: 10 + 10 + 9
        assert srv.server.handler.lengths[11] == 29  # the pieces left the whole history held
        got = _ask(conn, 2, _item(10, list(range(1, 25)), position=53))  # a long delta
        assert got.items[0].status == ItemStatus.OK and srv.server.handler.lengths[11] == 53
        conn.close()
    p = Propose(1, tuple(items))
    assert [len(c.items) for c in chunks(p, 4, 1000)] == [4, 4, 3]
    assert [it for c in chunks(p, 4, 5) for it in c.items] == items
    big = _item(7, list(range(1, 26)))
    ps = pieces(big, 10)
    assert [(x.new_tokens.tolist()[0], x.position, x.depth) for x in ps] == [
        (1, 10, 1), (11, 20, 1), (21, 25, 2)]
    assert ps[0].new_tokens.numel() == ps[0].position  # the first is a whole history
    delta = dataclasses.replace(_item(7, list(range(1, 26)), position=40), num_accepted=2)
    assert [(x.position, x.num_accepted) for x in pieces(delta, 10)] == [(25, 2), (35, 0),
                                                                         (40, 0)]


def test_a_frame_over_the_servers_limit_is_refused_from_its_header() -> None:
    with _server(limits=dataclasses.replace(LIMITS, frame_bytes=4096)) as srv:
        conn = _connect(srv)
        conn.send(encode(Propose(1, (_item(1, list(range(1, 1999))),))), time.monotonic() + 5)
        with pytest.raises(E.PeerError, match=f"ERROR {E.ErrorCode.MALFORMED}:"):
            conn.read(time.monotonic() + 5)


def test_two_targets_with_the_same_request_ids_do_not_share_state() -> None:
    """Each target numbers its requests from 1: the handler must hold them apart, and one
    target's close must not release the other's. Each connection that passes the
    handshake is reported once (the drafter's specpair_drafter_connections_total)."""
    authenticated = []
    with _server(on_authenticated=lambda: authenticated.append(1)) as srv:
        a, b = _connect(srv), _connect(srv)
        assert _ask(a, 1, _item(1, [1, 2, 3])).items[0].status == ItemStatus.OK
        assert _ask(b, 1, _item(1, [1, 7])).items[0].status == ItemStatus.OK
        for rnd in range(2, 5):  # each continues its own history
            assert _ask(a, rnd, _item(1, [5], position=2 + rnd)).items[0].status == ItemStatus.OK
            assert _ask(b, rnd, _item(1, [6], position=1 + rnd)).items[0].status == ItemStatus.OK
        a.close()
        time.sleep(0.2)  # a's close releases a's request 1 only
        assert _ask(b, 5, _item(1, [6], position=6)).items[0].status == ItemStatus.OK
        b.close()
        assert authenticated == [1, 1]
