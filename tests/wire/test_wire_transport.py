"""Loopback tests of the transport and the client, with in-process drafters.

What the drafter holds of each request, and when a whole history is due, is the
session's (tests/wire/test_wire_session.py): here items go as the test writes them."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import torch
from wire_loopback import TrivialDrafter, trivial_hello

from specpair.proposal import QKind
from specpair.qlaw import Drafts
from specpair.sampling import SamplingParams
from specpair.verify import verify
from specpair.wire import errors as E
from specpair.wire.assemble import to_proposal
from specpair.wire.client import DraftClient
from specpair.wire.codec import decode, encode
from specpair.wire.codec.header import HEADER, Kind, seal
from specpair.wire.frames import (
    AuthOk,
    Challenge,
    DraftItem,
    FeatureKind,
    FeatureSpec,
    Propose,
    ProposeItem,
    RequestParams,
)
from specpair.wire.server import ServerThread
from specpair.wire.source import Missing, MissingReason

V = 500
KEY = b"k" * 32
FP = bytes(32)
PARAMS = RequestParams(1.0, 0, 1.0, 11)


def item(rid, tokens, position, depth=3, accepted=0, features=None):
    return ProposeItem(rid, torch.tensor(tokens, dtype=torch.int64), accepted, position, depth,
                       PARAMS, features)


def client(port, **kw):
    kw.setdefault("vocab_size", V)
    kw.setdefault("tokenizer_fingerprint", FP)
    return DraftClient("127.0.0.1", port, kw.pop("key", KEY), **kw)


@pytest.fixture
def pair():
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello)
    with ServerThread(drafter, hello, KEY) as srv, client(srv.port) as c:
        yield drafter, srv, c


def wait_for(cond, timeout=2.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_round_trip_verified_and_usable_by_the_verifier(pair):
    drafter, _, c = pair
    out = c.propose([item(1, [5, 6, 7], 3), item(2, [9], 1)], deadline_s=5.0)
    assert all(isinstance(d, DraftItem) for d in out)
    ids, lp = drafter.law(1, 3)  # the law it drew d_1 from, shipped exactly
    assert torch.equal(out[0].q_ids[0], ids) and torch.equal(out[0].q_logp[0], lp)
    out = c.propose([item(1, [out[0].tokens[0].item(), 4], 5)], deadline_s=5.0)
    assert isinstance(out[0], DraftItem) and drafter.full_resends == 2  # only the first rounds
    batch = [Drafts(d.tokens, d.kind, d.q_logp, d.q_ids) for d in out] + [None]  # + MISSING
    proposal = to_proposal(batch, depth=3, vocab_size=V)
    assert proposal.present.tolist() == [True, False]
    verdict = verify(torch.randn(2, 4, V), proposal, SamplingParams.make(2, seed=[11, 12]),
                     torch.tensor([5, 9]), on_missing="drop")
    assert verdict.dropped.tolist() == [False, True]
    assert verdict.num_accepted[1] == 0 and (verdict.tokens[1, 1:] == -1).all()


def test_client_without_the_key_is_refused():
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello)
    with ServerThread(drafter, hello, KEY) as srv:
        with pytest.raises(E.AuthFailed):
            client(srv.port, key=b"x" * 32).connect()
        bad = client(srv.port, key=b"x" * 32)
        assert bad.propose([item(1, [1, 2], 2)], 1.0) == [Missing(MissingReason.DISCONNECTED)]
        assert "ERROR 2" in bad.last_error
        assert srv.server.stats.auth_failures == 2 and srv.server.stats.rounds == 0
        assert drafter.lengths == {}  # the handler never ran


def test_drafter_without_the_key_is_refused():
    """A fake drafter that accepts any AUTH but cannot prove it holds the key."""
    lsock = socket.create_server(("127.0.0.1", 0))

    def fake():
        conn, _ = lsock.accept()
        with conn:
            conn.sendall(encode(Challenge(bytes(32))))
            conn.recv(4096)
            conn.sendall(encode(AuthOk(bytes(32))) + encode(trivial_hello(V)))
            time.sleep(0.5)

    t = threading.Thread(target=fake, daemon=True)
    t.start()
    with pytest.raises(E.AuthFailed, match="lacks the key"):
        client(lsock.getsockname()[1]).connect(timeout_s=2.0)
    t.join()
    lsock.close()


def _raw(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    head = s.recv(HEADER.size + 32, socket.MSG_WAITALL)
    assert isinstance(decode(head, authenticated=False), Challenge)
    return s


def test_unauthenticated_frames_and_silence_are_refused():
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello)
    with ServerThread(drafter, hello, KEY, handshake_timeout_s=0.3) as srv:
        s = _raw(srv.port)  # a PROPOSE instead of AUTH
        s.sendall(encode(Propose(1, (item(1, [1], 1),))))
        err = decode(s.recv(4096), authenticated=False)
        assert err.code == E.ErrorCode.AUTH_FAILED
        assert s.recv(10) == b""  # closed
        s.close()
        s = _raw(srv.port)  # silence: closed after the handshake deadline
        t0 = time.monotonic()
        data = s.recv(4096)
        assert decode(data, authenticated=False).code == E.ErrorCode.AUTH_FAILED
        assert time.monotonic() - t0 < 2.0
        s.close()
        assert drafter.lengths == {}


def test_malformed_frame_after_auth_gets_error_and_close(pair):
    drafter, srv, c = pair
    c.connect()
    bad = bytearray(encode(Propose(1, (item(1, [1, 2], 2),))))
    bad[-5] = 0x7F  # the last token id becomes ~2^31, far above the vocabulary
    c._conn.send(seal(Kind.PROPOSE, bytes(bad[HEADER.size:])), time.monotonic() + 1)
    with pytest.raises(E.PeerError, match="outside"):
        c._conn.read(time.monotonic() + 2)
    assert srv.server.stats.malformed == 1 and drafter.lengths == {}


def test_hello_mismatch_is_refused():
    spec = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 4)
    for hello, kw in [(trivial_hello(V + 1), {}), (trivial_hello(V, fingerprint=b"\1" * 32), {}),
                      (trivial_hello(V, features=spec), {}),
                      (trivial_hello(V, kind=QKind.POINT_MASS), {"accept_greedy": False}),
                      (trivial_hello(V, kind=QKind.DENSE), {"accept": (QKind.SPARSE,)})]:
        with (ServerThread(TrivialDrafter(hello), hello, KEY) as srv,
              pytest.raises(E.HelloMismatch)):
            client(srv.port, **kw).connect()


def test_late_answer_is_missing_within_the_deadline_then_skipped():
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello, delay_s=0.4)
    with ServerThread(drafter, hello, KEY) as srv, client(srv.port) as c:
        c.connect()
        t0 = time.monotonic()
        assert c.propose([item(1, [1, 2], 2)], deadline_s=0.05) == [Missing(MissingReason.LATE)]
        assert time.monotonic() - t0 < 0.15  # never blocks past the deadline (+ scheduling)
        drafter.delay_s = 0.0
        out = c.propose([item(1, [3], 3)], deadline_s=5.0)
        assert isinstance(out[0], DraftItem) and c.late_answers == 1


def test_many_late_rounds_stay_in_order_through_the_bounded_queue():
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello, delay_s=0.15)
    with ServerThread(drafter, hello, KEY, queue_depth=1) as srv, client(srv.port) as c:
        c.connect()
        for pos in (2, 3, 4):  # each round late; the drafter still applies every history
            assert c.propose([item(1, list(range(pos)) if pos == 2 else [pos], pos)],
                             deadline_s=0.01) == [Missing(MissingReason.LATE)]
        drafter.delay_s = 0.0
        out = c.propose([item(1, [5], 5)], deadline_s=5.0)
        assert isinstance(out[0], DraftItem) and c.late_answers == 3
        assert drafter.lengths[1] == 5 and drafter.full_resends == 1


def test_unreachable_drafter_returns_at_once_and_backs_off():
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    c = client(free, backoff_initial_s=10.0)
    t0 = time.monotonic()
    gone = [Missing(MissingReason.DISCONNECTED)]
    assert c.propose([item(1, [1], 1)], 0.5) == gone
    assert c.propose([item(1, [2], 2)], 0.5) == gone  # backing off: no new attempt
    assert time.monotonic() - t0 < 0.5
    assert c.connects == 0 and c.ensure_connected(0.5) is None


def test_resync_then_whole_history(pair):
    drafter, _, c = pair
    assert isinstance(c.propose([item(1, [1, 2, 3], 3)], 5.0)[0], DraftItem)
    drafter.release((1,))  # the drafter lost the request's state
    assert c.propose([item(1, [4], 4)], 5.0) == [Missing(MissingReason.RESYNC)]
    out = c.propose([item(1, [1, 2, 3, 4, 5], 5)], 5.0)  # the whole history
    assert isinstance(out[0], DraftItem) and drafter.lengths[1] == 5
    assert drafter.full_resends == 2


def test_reconnect_after_the_drafter_restarted_is_a_new_epoch():
    hello = trivial_hello(V)
    srv = ServerThread(TrivialDrafter(hello), hello, KEY).start()
    port = srv.port
    c = client(port, backoff_initial_s=0.01)
    assert c.ensure_connected(5.0) == 1
    assert isinstance(c.propose([item(1, [1, 2], 2)], 5.0)[0], DraftItem)
    srv.stop()
    assert isinstance(c.propose([item(1, [3], 3)], 1.0)[0], Missing)  # shutting down / gone
    with ServerThread(TrivialDrafter(hello), hello, KEY, port=port):
        time.sleep(0.05)
        assert c.ensure_connected(5.0) == 2  # the session resends whole histories now
    c.close()


def test_handler_failure_answers_resync(pair):
    drafter, srv, c = pair

    def boom(_):
        raise RuntimeError("model fell over")

    real = drafter._item
    drafter._item = boom
    assert c.propose([item(1, [1, 2], 2)], 5.0) == [Missing(MissingReason.RESYNC)]
    assert srv.server.stats.handler_failures == 1
    drafter._item = real
    assert isinstance(c.propose([item(1, [1, 2, 3], 3)], 5.0)[0], DraftItem)  # sent whole


def test_context_features_arrive_aligned_and_steer_the_drafts():
    spec = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, 4)
    hello = trivial_hello(V, features=spec)

    def feats(tokens, start):  # row i encodes (token, absolute position)
        return torch.tensor([[t, start + i, 1.0, -1.0] for i, t in enumerate(tokens)])

    drafter = TrivialDrafter(hello)
    with ServerThread(drafter, hello, KEY) as srv, client(srv.port, features=spec) as c:
        a = c.propose([item(1, [4, 5, 6], 3, features=feats([4, 5, 6], 0))], 5.0)[0]
        b = c.propose([item(1, [7], 4, features=feats([7], 3))], 5.0)[0]
        for pos, tok in enumerate([4, 5, 6, 7]):
            assert drafter.received[(1, pos)].tolist() == [tok, pos, 1.0, -1.0]
        same_tokens = c.propose([item(2, [7], 1, features=feats([7], 3) * 0)], 5.0)[0]
        assert isinstance(a, DraftItem) and isinstance(b, DraftItem)
        assert not torch.equal(b.q_ids, same_tokens.q_ids)  # the law depends on the features
        with pytest.raises(E.FeatureMismatch):
            c.propose([item(3, [1], 1)], 1.0)  # features missing: the caller's bug
        with pytest.raises(E.BadShape):
            c.propose([item(3, [1, 2], 2, features=feats([1], 0))], 1.0)  # a row short


def test_release_reaches_the_drafter(pair):
    drafter, _, c = pair
    c.propose([item(1, [1], 1), item(2, [2], 1)], 5.0)
    c.release([1])
    assert wait_for(lambda: 1 not in drafter.lengths) and 2 in drafter.lengths


def test_closing_the_connection_releases_its_requests(pair):
    drafter, _, c = pair
    c.propose([item(1, [1], 1), item(2, [2], 1)], 5.0)
    assert drafter.lengths.keys() == {1, 2}
    c.close()
    assert wait_for(lambda: drafter.lengths == {})


def test_greedy_drafter_point_mass():
    hello = trivial_hello(V, kind=QKind.POINT_MASS)
    with ServerThread(TrivialDrafter(hello), hello, KEY) as srv, client(srv.port) as c:
        d = c.propose([item(1, [1, 2], 2)], 5.0)[0]
        assert d.kind == QKind.POINT_MASS and d.q_logp is None


def test_bad_batches_raise_and_send_nothing(pair):
    _, srv, c = pair
    with pytest.raises(E.DuplicateRequest):
        c.propose([item(1, [1], 1), item(1, [1], 1)], 1.0)
    with pytest.raises(E.TokenLimit):
        c.propose([item(1, [1], 1), item(2, [1, 2], 1)], 1.0)  # more new tokens than position
    with pytest.raises(E.FeatureMismatch):
        c.propose([item(1, [1], 1, features=torch.zeros(1, 4))], 1.0)  # none declared
    with pytest.raises(E.TokenOutOfRange):
        c.propose([item(1, [1], 1), item(2, [V], 1)], 1.0)  # the drafter would refuse it
    with pytest.raises(E.BadParams):
        c.propose([item(1, [1], 1), ProposeItem(2, torch.tensor([1]), 0, 1, 3,
                                                RequestParams(-1.0, 0, 1.0, 0), None)], 1.0)
    assert c.hello is None and srv.server.stats.rounds == 0  # not even connected


def test_depth_beyond_the_drafter_is_missing_locally(pair):
    drafter, srv, c = pair
    out = c.propose([item(1, [1, 2], 2, depth=3), item(2, [3], 1, depth=9)], 5.0)
    assert isinstance(out[0], DraftItem) and out[1] == Missing(MissingReason.REFUSED)
    assert srv.server.stats.malformed == 0 and drafter.lengths == {1: 2}  # 2 was not sent
    out = c.propose([item(1, [4], 3), item(2, [3, 5], 2, depth=2)], 5.0)
    assert all(isinstance(d, DraftItem) for d in out)  # request 2 whole, once served
    assert drafter.lengths == {1: 3, 2: 2} and c.connects == 1


def test_shutdown_with_a_release_still_queued_logs_no_error():
    """A target hangs up while the handler is busy, so the server's RELEASE of its requests
    waits in the handler queue; the drafter then shuts down and cancels it. The connection
    task must end quietly (Python 3.11's stream callback logs a cancelled task as an error)."""
    from specpair.wire.server import WireServer

    async def main() -> list[dict]:
        loop = asyncio.get_running_loop()
        errors: list[dict] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        hello = trivial_hello(V)
        server = WireServer(TrivialDrafter(hello), hello, KEY)
        port = await server.start()

        c = client(port)
        out = await loop.run_in_executor(None, c.propose, [item(1, [5, 6], 2)], 5.0)
        assert isinstance(out[0], DraftItem)
        busy = threading.Event()
        server._executor.submit(busy.wait, 5.0)  # the handler thread is busy elsewhere
        c.close()  # the target hangs up holding request 1
        for _ in range(200):  # until the hang-up's RELEASE waits behind the busy handler
            if server._executor._work_queue.qsize():
                break
            await asyncio.sleep(0.01)
        assert server._executor._work_queue.qsize(), "the RELEASE never got queued"
        threading.Timer(0.2, busy.set).start()
        await server.close()  # cancels the queued RELEASE
        await asyncio.sleep(0.2)  # let the connection task and its stream callback finish
        return errors

    errors = asyncio.run(main())
    assert errors == [], [e.get("message") for e in errors]
