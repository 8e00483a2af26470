"""A trivial, exact drafter for the wire's loopback tests and its self-test (test code).

It has no model: its law at each draft position is a fixed-shape SPARSE (or
DENSE) law whose support and weights are a deterministic function of the last
committed token, the absolute position and, when the HELLO asked for context
features, the feature row of the last new token. Drafts are drawn from exactly
the shipped values on the DRAFT stream (``specpair.draft.draft_step`` semantics),
so its proposals are genuine draws d ~ q. It keeps each request's committed
length and answers RESYNC when a PROPOSE does not continue it, as a real drafter
must. ``received`` records the feature rows it got, by (request, position).
"""

from __future__ import annotations

import threading
import time

import torch

from specpair.draft import DraftMode
from specpair.proposal import QKind
from specpair.qlaw import Drafts, widen
from specpair.rng import Stream, uniform
from specpair.sampling import sample_from_logp
from specpair.wire.codec.header import VERSION
from specpair.wire.frames import (
    DraftItem,
    FeatureSpec,
    Hello,
    ItemStatus,
    ProposalFrame,
    Propose,
    ProposeItem,
)

__all__ = ["TrivialDrafter", "trivial_hello"]


def trivial_hello(vocab_size: int, *, kind: QKind = QKind.SPARSE, support: int = 8,
                  max_depth: int = 8, features: FeatureSpec | None = None,
                  fingerprint: bytes = bytes(32)) -> Hello:
    """The HELLO a TrivialDrafter serves."""
    greedy = kind == QKind.POINT_MASS
    return Hello(version=VERSION, mode=DraftMode.GREEDY if greedy else DraftMode.SAMPLED,
                 vocab_size=vocab_size, tokenizer_fingerprint=fingerprint, q_encodings=(kind,),
                 max_depth=max_depth, max_support=min(support, vocab_size), features=features)


class TrivialDrafter:
    """Handler for ``specpair.wire.server``: deterministic laws, exact draws, RESYNC logic."""

    def __init__(self, hello: Hello, *, delay_s: float = 0.0) -> None:
        self.hello = hello
        self.delay_s = delay_s  # sleep per round (to test deadlines)
        self.lengths: dict[int, int] = {}  # request -> committed length it holds
        self.last: dict[int, int] = {}  # request -> last committed token
        self.signal: dict[int, int] = {}  # request -> feature signal of its last token
        self.received: dict[tuple[int, int], torch.Tensor] = {}  # (req, pos) -> feature row
        self.full_resends = 0  # items that carried a whole history
        self._lock = threading.Lock()

    def release(self, request_ids: tuple[int, ...]) -> None:
        with self._lock:
            for rid in request_ids:
                for table in (self.lengths, self.last, self.signal):
                    table.pop(rid, None)

    def handle(self, propose: Propose) -> ProposalFrame:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            return ProposalFrame(propose.round_id, tuple(self._item(it) for it in propose.items))

    def _item(self, it: ProposeItem) -> DraftItem:
        n = it.new_tokens.shape[0]
        empty = torch.zeros(0, dtype=torch.int64)
        if n == it.position:
            self.full_resends += 1
        elif self.lengths.get(it.request_id, -1) + n != it.position:
            return DraftItem(it.request_id, ItemStatus.RESYNC, empty, QKind.SPARSE, None, None)
        if it.depth > self.hello.max_depth:
            return DraftItem(it.request_id, ItemStatus.REFUSED, empty, QKind.SPARSE, None, None)
        self.lengths[it.request_id] = it.position
        self.last[it.request_id] = int(it.new_tokens[-1])
        if it.features is not None:
            start = it.position - n
            for i in range(n):
                self.received[(it.request_id, start + i)] = it.features[i].clone()
            self.signal[it.request_id] = int(it.features[-1].float().sum().round())
        return self._draft(it)

    def law(self, request_id: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [S] int64, log q [S] fp32) at an absolute draft position."""
        v, s = self.hello.vocab_size, self.hello.max_support
        base = (self.last[request_id] * 7919 + position * 104729
                + self.signal.get(request_id, 0) * 15485863) % v
        ids = (base + torch.arange(s) * (v // s)) % v  # distinct: j * (v // s) < v for j < s
        w = torch.linspace(1.0, 0.1, ids.shape[0]) * (1 + (base % 5))
        return ids, torch.log_softmax(w, dim=0)

    def _draft(self, it: ProposeItem) -> DraftItem:
        kind = self.hello.q_encodings[0]
        toks, lps, idss = [], [], []
        for k in range(it.depth):
            pos = it.position + k
            ids, lp = self.law(it.request_id, pos)
            if kind == QKind.POINT_MASS:
                toks.append(int(ids[int(lp.argmax())]))
                continue
            u = uniform(torch.tensor([it.params.seed]), torch.tensor([pos]), Stream.DRAFT)
            col = int(sample_from_logp(lp.unsqueeze(0), u)[0])
            toks.append(int(ids[col]))
            lps.append(lp)
            idss.append(ids)
        tokens = torch.tensor(toks, dtype=torch.int64)
        if kind == QKind.POINT_MASS:
            return DraftItem(it.request_id, ItemStatus.OK, tokens, kind, None, None)
        lp, ids = torch.stack(lps), torch.stack(idss)
        if kind == QKind.SPARSE:
            return DraftItem(it.request_id, ItemStatus.OK, tokens, kind, lp, ids)
        dense = widen(Drafts(tokens, QKind.SPARSE, lp, ids), self.hello.vocab_size)
        return DraftItem(it.request_id, ItemStatus.OK, tokens, kind, dense, None)
