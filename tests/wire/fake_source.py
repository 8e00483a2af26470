"""A scripted DraftSource for the session and adapter tests (no drafter, no wire)."""

from __future__ import annotations

import torch

from specpair.proposal import QKind
from specpair.wire.errors import TokenOutOfRange
from specpair.wire.frames import DraftItem, ItemStatus, RequestParams
from specpair.wire.source import Missing, MissingReason

V, K = 16, 3
PARAMS = RequestParams(temperature=1.0, top_k=0, top_p=1.0, seed=7)


def ok(item, k=K):
    logq = torch.log_softmax(torch.randn(k, V, generator=torch.Generator().manual_seed(1)), -1)
    return DraftItem(item.request_id, ItemStatus.OK, torch.arange(k, dtype=torch.int64),
                     QKind.DENSE, logq, None)


class FakeSource:
    """A DraftSource answering by script: 'ok', 'missing' (LATE), 'resync', 'refused',
    'raise' (an OSError, as a socket raises), 'wire' (a WireError), 'bug' (any other
    exception), 'garbage' / 'wide' (answers that break the contract)."""

    features = None
    hello = None  # no HELLO: greedy items are not asked of it

    def __init__(self, script):
        self.script, self.batches, self.released = list(script), [], []

    def ensure_connected(self, timeout_s):
        return 1

    def propose(self, batch, deadline_s):
        self.batches.append(list(batch))
        what = self.script.pop(0)
        if what == "raise":
            raise ConnectionError("drafter gone")
        if what == "wire":
            raise TokenOutOfRange("the encoder refused an item")
        if what == "bug":
            raise KeyError("a bug in the source")
        if what == "garbage":
            return [object()] * len(batch)
        if what == "wide":  # q over more tokens than the target has
            return [DraftItem(it.request_id, ItemStatus.OK, torch.arange(K), QKind.DENSE,
                              torch.log_softmax(torch.zeros(K, V + 1), -1), None)
                    for it in batch]
        reason = {"missing": MissingReason.LATE, "resync": MissingReason.RESYNC,
                  "refused": MissingReason.REFUSED}.get(what)
        return [ok(it, it.depth) if reason is None else Missing(reason) for it in batch]

    def release(self, ids):
        self.released.append(tuple(ids))
