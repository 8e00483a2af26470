"""Context features end to end: target client -> TCP wire -> drafter engine -> model.

The probe model's drafts are the position-weighted sum of the feature codes it
was given (see drafter_probe.py), so a draft equal to the sum over the target's
committed history proves every feature row crossed the wire intact and landed
at its own position: through partial rounds, rejections, and the whole-history
resend (tokens and features) the client makes after reconnecting.
"""

from __future__ import annotations

import os
import random

import torch
from drafter_probe import ProbeModel, expected_first_draft

from specpair.drafter.engine import DrafterEngine
from specpair.wire.client import MISSING, DraftClient
from specpair.wire.codec.header import VERSION
from specpair.wire.frames import ProposeItem, RequestParams
from specpair.wire.server import ServerThread

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
        codes = {r: [rng.randrange(WIDTH) for _ in range(4 + r)] for r in (1, 2)}
        new = {r: list(c) for r, c in codes.items()}
        acc = dict.fromkeys(codes, 0)
        for rnd in range(6):
            if rnd == 3:
                client.close()  # the next round reconnects and resends whole histories
            items = [ProposeItem(r, torch.tensor([rng.randrange(V) for _ in new[r]]), acc[r],
                                 len(codes[r]), K, top1,
                                 torch.nn.functional.one_hot(torch.tensor(new[r]),
                                                             WIDTH).float())
                     for r in codes]
            drafts = client.propose(items, deadline_s=10.0)
            for r, d in zip(codes, drafts, strict=True):
                assert d is not MISSING, (rnd, client.missing, client.last_error)
                assert int(d.tokens[0]) == expected_first_draft(codes[r], V), (rnd, r)
                acc[r] = rng.randrange(K + 1)
                new[r] = [rng.randrange(WIDTH) for _ in range(acc[r] + 1)]
                codes[r] += new[r]
        assert client.connects == 2
        client.close()
