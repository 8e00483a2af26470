"""The drafting session over the real TCP client: what the drafter holds of each request.

The loopback drafter (``TrivialDrafter``) answers RESYNC to any item that does not
continue the history it holds, as a real drafter must, and counts the items that
carried a whole history: so these tests see exactly what the session resent."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry
from wire_loopback import TrivialDrafter, trivial_hello

from specpair.vllm.metrics import TargetMetrics
from specpair.wire.client import DraftClient
from specpair.wire.frames import RequestParams
from specpair.wire.server import ServerThread
from specpair.wire.session import DraftSession, StepRequest

V = 500
KEY = b"k" * 32
PARAMS = RequestParams(1.0, 0, 1.0, 11)


def session(port: int, deadline_s: float = 5.0, **kw) -> tuple[DraftSession, DraftClient]:
    c = DraftClient("127.0.0.1", port, KEY, vocab_size=V, tokenizer_fingerprint=bytes(32),
                    **kw)
    return DraftSession(c, V, deadline_s), c


def step(s: DraftSession, histories: dict[str, list[int]], depth: dict[str, int] | None = None,
         sampled: int = 1):
    """One step over ``histories`` (req id -> committed tokens), as an adapter drives it."""
    s.begin(set(histories))
    reqs = []
    for rid, toks in histories.items():
        start = s.needed_from(rid, len(toks))
        reqs.append(StepRequest(rid, len(toks), torch.tensor(toks[start:], dtype=torch.int64),
                                sampled, (depth or {}).get(rid, 3), PARAMS))
    return s.step(reqs)


@pytest.fixture
def pair():
    hello = trivial_hello(V)
    drafter = TrivialDrafter(hello)
    with ServerThread(drafter, hello, KEY) as srv:
        s, c = session(srv.port)
        yield drafter, srv, s
        c.close()


def test_deltas_then_resync_then_the_whole_history(pair):
    drafter, _, s = pair
    assert step(s, {"r": [1, 2, 3]})[0] is not None
    assert step(s, {"r": [1, 2, 3, 4]})[0] is not None and drafter.full_resends == 1
    (wire_id,) = drafter.lengths
    drafter.release((wire_id,))  # the drafter lost the request's state
    assert step(s, {"r": [1, 2, 3, 4, 5]}) == [None] and s.counters.resync == 1
    assert step(s, {"r": [1, 2, 3, 4, 5, 6]})[0] is not None
    assert drafter.lengths == {wire_id: 6} and drafter.full_resends == 2  # same id, whole


def test_first_round_after_a_reconnect_carries_whole_histories(pair):
    drafter, _, s = pair
    step(s, {"a": [1, 2], "b": [7]})
    s.source.close()  # e.g. the connection dropped between steps
    out = step(s, {"a": [1, 2, 3], "b": [7, 8]})
    assert all(d is not None for d in out), s.counters
    assert drafter.full_resends == 4 and s.counters.resync == 0 and s.source.connects == 2


def test_restarted_drafter_gets_whole_histories():
    hello = trivial_hello(V)
    srv = ServerThread(TrivialDrafter(hello), hello, KEY).start()
    port = srv.port
    s, c = session(port, backoff_initial_s=0.01)
    assert all(d is not None for d in step(s, {"1": [1, 2], "2": [7]}))
    srv.stop()
    assert step(s, {"1": [1, 2, 3], "2": [7, 8]}) == [None, None]
    second = TrivialDrafter(hello)
    with ServerThread(second, hello, KEY, port=port):
        time.sleep(0.05)
        out = step(s, {"1": [1, 2, 3, 4], "2": [7, 8, 9]})
        assert all(d is not None for d in out), s.counters
        assert second.full_resends == 2 and sorted(second.lengths.values()) == [3, 4]
    c.close()


def test_depth_beyond_the_drafter_is_refused_locally_and_not_asked_again(pair):
    drafter, srv, s = pair
    out = step(s, {"a": [1, 2], "b": [3]}, depth={"b": 9})
    assert out[0] is not None and out[1] is None
    assert s.counters.refused == 1 and srv.server.stats.malformed == 0
    assert len(drafter.lengths) == 1  # b never reached the drafter
    out = step(s, {"a": [1, 2, 4], "b": [3, 5]}, depth={"b": 2})
    assert out[0] is not None and out[1] is None and s.needed_from("b", 2) == 2
    assert s.source.connects == 1 and sorted(drafter.lengths.values()) == [3]


POISONS = {  # params outside the sampling domain (docs/core.md), inside the wire's structure
    "temperature": RequestParams(1e-40, 0, 1.0, 11),  # logits / T = inf, the row NaN
    "top_k": RequestParams(1.0, 2**70, 1.0, 11),  # no int64: the encoder refuses the frame
    "both": RequestParams(1e-40, 2**70, 1.0, 11),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_request_is_refused_alone_and_never_sent(pair, poison):
    drafter, srv, s = pair
    registry = CollectorRegistry()
    metrics = TargetMetrics(registry)
    histories = {"a": [1, 2], "bad": [3, 4], "b": [5]}
    params = {"a": PARAMS, "bad": POISONS[poison], "b": RequestParams(0.0, 4, 0.9, 12)}
    for round_ in range(3):
        s.begin(set(histories))
        reqs = []
        for rid, toks in histories.items():
            start = s.needed_from(rid, len(toks))
            reqs.append(StepRequest(rid, len(toks), torch.tensor(toks[start:],
                                                                 dtype=torch.int64),
                                    1, 3, params[rid]))
        out = s.step(reqs)
        metrics.publish(s)
        assert out[0] is not None and out[2] is not None and out[1] is None, (round_, s.counters)
        for toks in histories.values():
            toks.append(round_ + 6)
    # refused once, then never asked again (not a missing item that starts over each step)
    assert s.counters.refused == 1 and s.counters.missing == 0 and s.counters.errors == 0
    assert s.counters.drafted == 6 and s.counters.resync == 0 and s.needed_from("bad", 5) == 5
    assert registry.get_sample_value("specpair_items_total",
                                     {"outcome": "refused", "reason": "refused"}) == 1
    # never sent: the drafter holds the two good requests only, and saw no bad frame
    assert sorted(drafter.lengths.values()) == [3, 4] and srv.server.stats.malformed == 0
    assert drafter.full_resends == 2


def test_release_of_finished_requests_reaches_the_drafter(pair):
    drafter, _, s = pair
    step(s, {"a": [1], "b": [2]})
    assert len(drafter.lengths) == 2
    step(s, {"b": [2, 3]})  # a finished
    end = time.monotonic() + 2.0
    while len(drafter.lengths) != 1 and time.monotonic() < end:
        time.sleep(0.01)
    assert list(drafter.lengths.values()) == [2]


DRAFTER = textwrap.dedent("""
    import sys
    from specpair.wire.server import serve
    from wire_loopback import TrivialDrafter, trivial_hello
    hello = trivial_hello(500)
    serve(TrivialDrafter(hello, delay_s=float(sys.argv[2])), hello, "127.0.0.1",
          int(sys.argv[1]), key=b"k" * 32, ready=lambda p: print("ready", p, flush=True))
""")


def _spawn(port, delay):
    # `python -c` puts its working directory on sys.path: wire_loopback is found there
    p = subprocess.Popen([sys.executable, "-c", DRAFTER, str(port), str(delay)],
                         stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent)
    line = p.stdout.readline()
    assert line.startswith("ready"), line
    return p, int(line.split()[1])


def test_killed_drafter_process_mid_round_then_restart():
    p, port = _spawn(0, 1.0)
    try:
        s, c = session(port, deadline_s=3.0, backoff_initial_s=0.01)
        c.connect(timeout_s=5.0)
        threading.Timer(0.2, p.kill).start()  # SIGKILL while the round is in the handler
        t0 = time.monotonic()
        assert step(s, {"r": [1, 2, 3]}) == [None]
        assert time.monotonic() - t0 < 1.0  # noticed the death, did not wait out the deadline
        assert s.counters.missing_by_reason == {"disconnected": 1}
    finally:
        p.kill()
        p.wait()
    p, _ = _spawn(port, 0.0)
    try:
        history = [1, 2, 3]
        end = time.monotonic() + 10.0
        while time.monotonic() < end:  # until the client's backoff lets it reconnect
            history.append(4)
            if step(s, {"r": history})[0] is not None:
                break
            time.sleep(0.01)
        # a fresh drafter answers OK only to a whole history: the session resent it
        assert step(s, {"r": history + [5]})[0] is not None, s.counters
    finally:
        c.close()
        p.terminate()
        assert p.wait(10) == 0  # clean shutdown on SIGTERM


def test_unreachable_drafter_costs_no_token_copies():
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    s, c = session(free, backoff_initial_s=10.0)
    s.begin({"r"})
    assert s.needed_from("r", 5) == 5  # nothing to copy: the round is not sent
    assert s.step([StepRequest("r", 5, torch.zeros(0, dtype=torch.int64), 1, 3, PARAMS)]) == [
        None]
    assert s.counters.missing_by_reason == {"disconnected": 1} and c.connects == 0
