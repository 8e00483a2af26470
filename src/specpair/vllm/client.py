"""Build the draft client the remote speculators call, from the environment.

vLLM builds speculators from its config inside worker processes, so the
drafter's address travels in environment variables (documented in
overlays/vllm/0.32.0/README.md):

- ``SPECPAIR_DRAFTER``: ``HOST:PORT`` of a ``specpair drafter serve`` process
  (the probability wire, ``specpair.wire.client.DraftClient``), or
  ``inproc:MODEL_DIR`` to run the drafter engine inside the target process
  (development and tests; no network).
- ``SPECPAIR_DRAFTER_KEY_FILE``: the shared key file of the wire.
- ``SPECPAIR_DRAFT_DEADLINE_MS``: per-round deadline (default 200); a later
  answer is MISSING and that step is target-only.
- ``SPECPAIR_DRAFT_FEATURES``: ``KIND:DTYPE:WIDTH`` of the target hidden states
  the drafter's HELLO asks for (e.g. ``LAST_HIDDEN:bfloat16:7168``; V2 only).

The wire client checks the drafter's HELLO against the target's vocabulary
size and tokenizer fingerprint (of the target's tokenizer directory).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from specpair.vllm.remote import RemoteDrafts
from specpair.wire.frames import DraftItem, FeatureKind, FeatureSpec, Propose, ProposeItem

__all__ = ["InProcessClient", "deadline_s", "make_client"]


class InProcessClient:
    """The draft-client contract served by an in-process DrafterEngine (no wire)."""

    def __init__(self, engine: object) -> None:
        self.engine = engine  # specpair.drafter.engine.DrafterEngine
        self._round = 0

    def propose(self, batch: Sequence[ProposeItem], deadline_s: float) -> dict[int, DraftItem]:
        self._round += 1
        frame = self.engine.handle(Propose(self._round, tuple(batch)))
        return {it.request_id: it for it in frame.items}

    def release(self, request_ids: Sequence[int]) -> None:
        self.engine.release(request_ids)


def deadline_s() -> float:
    return float(os.environ.get("SPECPAIR_DRAFT_DEADLINE_MS", "200")) / 1000.0


def _features() -> FeatureSpec | None:
    """SPECPAIR_DRAFT_FEATURES=KIND:DTYPE:WIDTH (e.g. LAST_HIDDEN:bfloat16:7168), or None."""
    text = os.environ.get("SPECPAIR_DRAFT_FEATURES", "")
    if not text:
        return None
    kind, dtype, width = text.split(":")
    return FeatureSpec(FeatureKind[kind.upper()], getattr(torch, dtype), int(width))


def make_client(vocab_size: int, tokenizer_dir: str | Path) -> object:
    """The client named by SPECPAIR_DRAFTER (see the module docstring)."""
    from specpair.models.tokenizer import fingerprint

    where = os.environ.get("SPECPAIR_DRAFTER", "")
    if not where:
        raise ValueError("SPECPAIR_DRAFTER is not set (HOST:PORT of the drafter, or inproc:DIR)")
    if where.startswith("inproc:"):
        from specpair.drafter.engine import DrafterEngine
        from specpair.drafter.model import HFDraftModel
        from specpair.wire.codec.header import VERSION

        model_dir = Path(where.removeprefix("inproc:"))
        engine = DrafterEngine(HFDraftModel(model_dir),
                               tokenizer_fingerprint=fingerprint(model_dir), wire_version=VERSION)
        return InProcessClient(engine)
    from specpair.wire.auth import load_key
    from specpair.wire.client import DraftClient

    host, _, port = where.rpartition(":")
    key_file = os.environ.get("SPECPAIR_DRAFTER_KEY_FILE")
    if not key_file:
        raise ValueError("SPECPAIR_DRAFTER_KEY_FILE is not set (the wire's shared key)")
    return DraftClient(host, int(port), load_key(key_file), vocab_size=vocab_size,
                       tokenizer_fingerprint=fingerprint(Path(tokenizer_dir)),
                       features=_features())


class LazyRemote:
    """Mixin of the V1 proposer and the V2 speculator: the drafter connection, built
    on first use (the drafter may start after vLLM). Needs ``self.vocab_size`` and
    ``self.tokenizer_dir``; tests may set ``self.client`` beforehand."""

    client: object | None = None  # the wire client (or an in-process one)
    remote: RemoteDrafts | None = None  # per-request bookkeeping over ``client``

    def state(self) -> RemoteDrafts:
        if self.remote is None:
            if self.client is None:
                self.client = make_client(self.vocab_size, self.tokenizer_dir)
            self.remote = RemoteDrafts(self.client, self.vocab_size, deadline_s())
        return self.remote
