"""The drafter's rounds, bit for bit: drafted tokens and q bytes pinned by a digest.

A fixed script of PROPOSE rounds (steady state: each request commits some of its drafts
plus one token, so caches are cropped and extended as in serving; a RESYNC-free history)
drives a ``DrafterEngine`` on the committed trained draft model, at B = 1 and 4, K = 3 and
5, with DENSE (temperature only), SPARSE (top-k, top-p) and mixed batches and GREEDY mode.
Every answer's status, kind, tokens, q ids and fp32 q bytes go into one sha256. The digest
was recorded before the round was optimized for speed: a speed-up of the round that
changes a single drawn token or q bit fails here.

Floating-point kernels may round differently on another CPU or torch build, so each digest
is pinned together with the platform it was recorded on: the torch version, its CPU
capability, and the CPU's vendor, family and model (two AMD EPYCs that both report AVX512,
of families 25 and 26, gave different digests: MKL picks its kernels by the CPU). Elsewhere
the test is skipped, saying which, rather than reporting a false failure. It runs on one
torch thread (tests/drafter/conftest.py): the thread count changes matmul rounding too.

The first digest (43d481c2...) was recorded on 2026-12-01, before the round was optimized, on
that day's AMD EPYC (its family not recorded), and the optimized round matched it there. On
2026-12-02's machine (family 26) the tree of that day gave 09d68da1..., the same at the
commit before the day's changes and after them. The committed draft was then retrained with
the 24-layer pair (docs/models.md) on a family-25 EPYC, which changed its weights and so every
digest: on that machine the tree of the first digest (d9ee9c2, before the round was
optimized) and the tree that retrained the pair both give c3152af8... on the new draft, the
pin here now.
"""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path

import pytest
import torch

from specpair.draft import DraftMode
from specpair.drafter.engine import DrafterEngine
from specpair.drafter.model import HFDraftModel
from specpair.models import platform
from specpair.wire.frames import Propose, ProposeItem, RequestParams

DRAFT = Path(__file__).resolve().parents[2] / "models" / "trained" / "draft"
# platform (specpair.models.platform.host()) -> digest of the script below, one torch thread
DIGESTS = {
    ("2.13.0+cpu", "AVX512", "AuthenticAMD", "family 25 model 17"):
        "c3152af80a59dd77b140799abc59951ca41142122e3416836668556a4a3c8e42",
}

# (mode, batch, depth, per-row params (temperature, top_k, top_p))
CASES = [
    (DraftMode.SAMPLED, 1, 3, [(1.0, 0, 1.0)]),
    (DraftMode.SAMPLED, 1, 5, [(0.7, 0, 1.0)]),
    (DraftMode.SAMPLED, 4, 3, [(1.0, 0, 1.0)] * 4),
    (DraftMode.SAMPLED, 4, 5, [(1.0, 20, 1.0), (0.8, 0, 0.9), (1.0, 5, 0.5), (0.0, 0, 1.0)]),
    (DraftMode.SAMPLED, 4, 3, [(1.0, 0, 1.0), (0.9, 10, 1.0), (0.0, 0, 1.0), (1.3, 0, 0.8)]),
    (DraftMode.GREEDY, 4, 5, [(1.0, 0, 1.0)] * 4),
]
ROUNDS = 6


def _script(engine: DrafterEngine, b: int, depth: int, rows: list, h: hashlib._Hash,
            seed: int) -> None:
    rng = random.Random(seed)
    vocab = engine.model.vocab_size
    hist = {r: [1] + [rng.randrange(4, vocab) for _ in range(rng.randrange(8, 40))]
            for r in range(b)}
    new = {r: list(t) for r, t in hist.items()}
    acc = dict.fromkeys(hist, 0)
    for rnd in range(ROUNDS):
        items = tuple(ProposeItem(r, torch.tensor(new[r]), acc[r], len(hist[r]),
                                  depth - (r % 2 if b > 1 else 0),  # mixed depths in a batch
                                  RequestParams(*rows[r], 1000 * seed + r), None)
                      for r in range(b))
        got = engine.handle(Propose(rnd, items))
        for it in got.items:
            h.update(bytes([int(it.status), int(it.kind)]))
            h.update(it.tokens.numpy().tobytes())
            for t in (it.q_ids, it.q_logp):
                if t is not None:
                    h.update(str(tuple(t.shape)).encode())
                    h.update(t.contiguous().numpy().tobytes())
            r = it.request_id
            n = rng.randrange(0, int(it.tokens.numel()) + 1)
            acc[r] = n
            new[r] = it.tokens[:n].tolist() + [rng.randrange(4, vocab)]
            hist[r] += new[r]


def round_digest() -> str:
    model = HFDraftModel(DRAFT)
    h = hashlib.sha256()
    for i, (mode, b, depth, rows) in enumerate(CASES):
        engine = DrafterEngine(model, tokenizer_fingerprint=bytes(32), wire_version=1,
                               mode=mode)
        _script(engine, b, depth, rows, h, seed=i)
    return h.hexdigest()


def test_drafted_tokens_and_q_bits_are_pinned(caplog) -> None:
    here = platform.host()
    if here not in DIGESTS:
        pytest.skip(f"digests recorded on {sorted(DIGESTS)}, this is {here}: fp kernels may "
                    "round differently, so bit identity is not defined across them")
    assert round_digest() == DIGESTS[here]
    # every batch drafted as one: none fell back to drafting each request alone
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
