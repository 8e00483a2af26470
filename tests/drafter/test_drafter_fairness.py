"""One target cannot starve another.

Two DraftClients on one drafter (the tiny draft model behind a real WireServer on
127.0.0.1). The hog sends a round of 24 whole 1900-token histories (several seconds of
prefill on this CPU); while it is in flight the other target's small rounds (4 requests,
K = 3) must keep completing within their 1.5 s deadline. Before the fix the single handler
ran the hog's round whole and every one of the other's rounds came back LATE. The server now
hands rounds to the model in chunks (the hog's 1900-token histories in pieces of 512 new
tokens), taken from the waiting connections in turn.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from specpair.drafter.engine import DrafterEngine
from specpair.drafter.model import HFDraftModel
from specpair.models.tiny import TinyPair
from specpair.wire.client import DraftClient
from specpair.wire.codec.header import VERSION
from specpair.wire.frames import DraftItem, ProposeItem, RequestParams
from specpair.wire.server import ServerThread

KEY = b"fairness-key-0123456789abcdef"
FP = bytes(32)
P = RequestParams(1.0, 0, 1.0, 7)
DEADLINE_S = 1.5


@pytest.fixture(scope="module")
def draft_model(tiny_pair: TinyPair) -> HFDraftModel:
    return HFDraftModel(tiny_pair.draft)


def _client(srv: ServerThread, v: int) -> DraftClient:
    return DraftClient("127.0.0.1", srv.port, KEY, vocab_size=v, tokenizer_fingerprint=FP)


def test_a_huge_round_does_not_make_another_targets_rounds_late(
        draft_model: HFDraftModel) -> None:
    engine = DrafterEngine(draft_model, tokenizer_fingerprint=FP, wire_version=VERSION)
    v = draft_model.vocab_size
    g = torch.Generator().manual_seed(0)
    hog_items = [ProposeItem(10_000 + r, torch.randint(1, v, (1900,), generator=g), 0, 1900, 3,
                             P, None) for r in range(24)]
    with ServerThread(engine, engine.hello(), KEY) as srv, _client(srv, v) as hog, \
            _client(srv, v) as other:
        hist = {r: [1, 5 + r, 9] for r in range(4)}
        new = {r: list(h) for r, h in hist.items()}  # committed since the request's last round
        acc = dict.fromkeys(hist, 0)

        def ask() -> float:
            items = [ProposeItem(r, torch.tensor(new[r]), acc[r], len(hist[r]), 3, P, None)
                     for r in hist]
            t = time.perf_counter()
            got = other.propose(items, DEADLINE_S)
            dt = time.perf_counter() - t
            assert all(isinstance(d, DraftItem) for d in got), got  # none LATE
            for r, d in zip(hist, got, strict=True):  # the target keeps 1 draft, adds 1 token
                acc[r], new[r] = 1, [int(d.tokens[0]), 11]
                hist[r] += new[r]
            return dt

        ask()  # connect and prefill before the hog starts
        hog.ensure_connected(10.0)
        done = threading.Event()
        answer: list = []
        threading.Thread(target=lambda: (answer.extend(hog.propose(hog_items, 120.0)),
                                         done.set()), daemon=True).start()
        time.sleep(0.3)  # the hog's round is in the handler
        lat = []
        while not done.is_set() and len(lat) < 200:
            lat.append(ask())
        assert done.wait(120.0) and all(isinstance(d, DraftItem) for d in answer)
    assert len(lat) >= 5, f"only {len(lat)} rounds overlapped the hog's round"
    assert max(lat) < DEADLINE_S
