"""Which draft source a vLLM process uses: the drafter named by its environment.

vLLM builds speculators from its config inside worker processes, so the
drafter's address travels in environment variables (documented in
overlays/vllm/0.32.0/README.md):

- ``SPECPAIR_DRAFTER``: ``HOST:PORT`` of a ``specpair drafter serve`` process
  (the probability wire, ``specpair.wire.client.DraftClient``), or
  ``inproc:MODEL_DIR`` to run the drafter engine inside the target process
  (``specpair.drafter.inprocess.InProcessSource``; development and tests, no network).
- ``SPECPAIR_DRAFTER_KEY_FILE``: the shared key file of the wire.
- ``SPECPAIR_DRAFT_DEADLINE_MS``: per-step deadline (default 200); a later
  answer is MISSING and that step is target-only.
- ``SPECPAIR_DRAFT_FEATURES``: ``KIND:DTYPE:WIDTH`` of the target hidden states
  the drafter's HELLO asks for (e.g. ``LAST_HIDDEN:bfloat16:7168``; V2 only).

``specpair.vllm.settings`` parses and checks them (one line naming a bad value). Only the
drafting rank (the first of the TP group, ``specpair.vllm.drafting``) builds a source.

The wire client checks the drafter's HELLO against the target's vocabulary
size and tokenizer fingerprint (of the target's tokenizer directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specpair.vllm import settings
from specpair.wire.frames import FeatureKind, FeatureSpec
from specpair.wire.source import DraftSource

__all__ = ["make_source"]


def make_source(vocab_size: int, tokenizer_dir: str | Path) -> DraftSource:
    """The draft source named by SPECPAIR_DRAFTER (see the module docstring)."""
    from specpair.models.tokenizer import fingerprint

    where = settings.drafter(os.environ)
    if where is None:
        raise settings.BadTargetSetting(f"{settings.DRAFTER} is not set (HOST:PORT of the "
                                        "drafter, or inproc:DIR)")
    if where[0] == "inproc":
        from specpair.drafter.engine import DrafterEngine
        from specpair.drafter.inprocess import InProcessSource
        from specpair.drafter.model import HFDraftModel
        from specpair.wire.codec.header import VERSION

        model_dir = Path(where[1])
        engine = DrafterEngine(HFDraftModel(model_dir),
                               tokenizer_fingerprint=fingerprint(model_dir), wire_version=VERSION)
        return InProcessSource(engine)
    from specpair.wire.auth import load_key
    from specpair.wire.client import DraftClient

    host, port, key_file = where[1]
    spec = settings.features(os.environ)
    features = (None if spec is None else
                FeatureSpec(FeatureKind[spec[0]], getattr(torch, spec[1]), spec[2]))
    return DraftClient(host, port, load_key(key_file), vocab_size=vocab_size,
                       tokenizer_fingerprint=fingerprint(Path(tokenizer_dir)),
                       features=features)
