"""Context features end to end: target session -> TCP wire -> drafter engine -> model.

The probe model's drafts are the position-weighted sum of the feature codes it
was given (see drafter_probe.py), so a draft equal to the sum over the target's
committed history proves every feature row crossed the wire intact and landed
at its own position: through partial rounds, rejections, and the whole-history
resend (tokens and features) the session makes after the client reconnected.
"""

from __future__ import annotations

import os
import random

import torch
from drafter_probe import ProbeModel, expected_first_draft

from specpair.drafter.engine import DrafterEngine
from specpair.wire.client import DraftClient
from specpair.wire.codec.header import VERSION
from specpair.wire.frames import RequestParams
from specpair.wire.server import ServerThread
from specpair.wire.session import DraftSession, StepRequest

V, WIDTH, K = 512, 24, 3


def test_features_cross_the_wire_aligned_to_positions() -> None:
    engine = DrafterEngine(ProbeModel(V, WIDTH), tokenizer_fingerprint=bytes(range(32)),
                           wire_version=VERSION)
    key = os.urandom(32)
    rng = random.Random(2)
    top1 = RequestParams(1.0, 1, 1.0, 9)  # top-k 1: the draft is the probe's peak
    with ServerThread(engine, engine.hello(), key) as srv:
        client = DraftClient("127.0.0.1", srv.port, key, vocab_size=V,
                             tokenizer_fingerprint=bytes(range(32)),
                             features=engine.hello().features, connect_timeout_s=10.0)
        session = DraftSession(client, V, 10.0)
        codes = {r: [rng.randrange(WIDTH) for _ in range(n)] for r, n in (("1", 5), ("2", 6))}
        tokens = {r: [rng.randrange(V) for _ in c] for r, c in codes.items()}
        new = {r: list(c) for r, c in codes.items()}  # codes committed by the last round
        for rnd in range(6):
            if rnd == 3:
                client.close()  # the next round reconnects and resends whole histories
            session.begin(set(codes))
            reqs = []
            for r in codes:
                n = len(codes[r])
                start = session.needed_from(r, n)
                reqs.append(StepRequest(r, n, torch.tensor(tokens[r][start:]), len(new[r]), K,
                                        top1, torch.nn.functional.one_hot(
                                            torch.tensor(new[r]), WIDTH).float()))
            drafts = session.step(reqs)
            for r, d in zip(codes, drafts, strict=True):
                assert d is not None, (rnd, session.counters, client.last_error)
                assert int(d.tokens[0]) == expected_first_draft(codes[r], V), (rnd, r)
                new[r] = [rng.randrange(WIDTH) for _ in range(rng.randrange(K + 1) + 1)]
                codes[r] += new[r]
                tokens[r] += [rng.randrange(V) for _ in new[r]]
        assert client.connects == 2 and session.counters.resync == 0
        client.close()
