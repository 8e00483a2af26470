"""A test draft model whose drafts reveal which features it saw at which positions.

Its "cache" is one int per position. A committed token at absolute position i
with feature row f contributes ``argmax(f) * (i + 1)``; a draft token fed by
``step`` (no target features) contributes its id. The logits put ``PEAK``
nats on ``sum(contributions) mod V`` and 0 elsewhere, so a draft drawn with
top-k 1 IS that sum: any feature row that arrives shifted, dropped, stale or
twice changes the drafts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specpair.drafter.model import Row
from specpair.wire.frames import FeatureKind, FeatureSpec

PEAK = 30.0


def expected_first_draft(codes: Sequence[int], vocab: int) -> int:
    """The first draft after committed tokens whose feature argmaxes are ``codes``."""
    return sum(c * (i + 1) for i, c in enumerate(codes)) % vocab


class ProbeModel:
    max_positions = 4096

    def __init__(self, vocab_size: int = 512, width: int = 24) -> None:
        self.vocab_size = vocab_size
        self.feature_spec = FeatureSpec(FeatureKind.LAST_HIDDEN, torch.float32, width)

    def begin(self, rows: Sequence[Row]) -> tuple[_Session, torch.Tensor]:
        caches = []
        for r in rows:
            assert r.features is not None and r.features.shape == (r.tokens.numel(),
                                                                    self.feature_spec.width)
            past = r.cache if r.cache is not None else torch.zeros(0, dtype=torch.int64)
            assert past.numel() == r.start
            pos = r.start + torch.arange(r.tokens.numel())
            caches.append(torch.cat([past, r.features.argmax(dim=1) * (pos + 1)]))
        session = _Session(caches, self.vocab_size)
        return session, session.logits()

    def crop(self, cache: torch.Tensor, length: int) -> torch.Tensor | None:
        return cache[:length] if length else None


class _Session:
    def __init__(self, caches: list[torch.Tensor], vocab: int) -> None:
        self.caches, self.vocab = caches, vocab

    def logits(self) -> torch.Tensor:
        out = torch.zeros(len(self.caches), self.vocab)
        for b, c in enumerate(self.caches):
            out[b, int(c.sum()) % self.vocab] = PEAK
        return out

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.caches = [torch.cat([c, t.view(1)]) for c, t in zip(self.caches, tokens, strict=True)]
        return self.logits()

    def finish(self) -> list[torch.Tensor]:
        return self.caches
