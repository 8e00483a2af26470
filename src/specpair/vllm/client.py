"""What the V1 proposer and the V2 speculator share: the drafting session, built from the
environment, and the drafter's seeds.

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

``specpair.vllm.settings`` parses and checks them (one line naming a bad value).

vLLM's own ``PROMETHEUS_MULTIPROC_DIR`` (an empty directory per start) carries the
specpair metrics from the engine process to the API server's ``/metrics``
(``specpair.vllm.metrics``, docs/operations.md).

The wire client checks the drafter's HELLO against the target's vocabulary
size and tokenizer fingerprint (of the target's tokenizer directory).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from specpair.vllm import settings
from specpair.vllm.metrics import TargetMetrics
from specpair.wire.frames import FeatureKind, FeatureSpec
from specpair.wire.session import DraftSession
from specpair.wire.source import DraftSource

__all__ = ["LazyRemote", "drafter_seed", "make_source"]

log = logging.getLogger(__name__)

# Odd 64-bit constant (2^64 / golden ratio): multiplying by it mod 2^64 is a bijection
# that spreads nearby seeds apart, so the key of a request's drafts (specpair.rng's
# DRAFT stream) is not the vLLM seed that keys the verifier's own noise.
_SEED_MIX = 0x9E3779B97F4A7C15


def drafter_seed(seed: int | None) -> int:
    """The 63-bit Philox key of a request's drafts, from its vLLM seed (any 64-bit int);
    a fresh random key when the request has none (callers keep it for the request)."""
    if seed is None:
        return int.from_bytes(os.urandom(8), "little") >> 1
    return ((seed * _SEED_MIX) & (2**64 - 1)) >> 1


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


class LazyRemote:
    """Mixin of the V1 proposer and the V2 speculator: the drafting session, built on
    first use (the drafter may start after vLLM). Needs ``self.vocab_size`` and
    ``self.tokenizer_dir``; tests may set ``self.source`` beforehand."""

    source: DraftSource | None = None  # the wire client (or the in-process engine)
    remote: DraftSession | None = None  # the session over ``source`` (vllm/probe.py reads it)
    metrics: TargetMetrics  # the target's specpair series (set by the constructor)

    def session(self) -> DraftSession:
        if self.remote is None:
            if self.source is None:
                self.source = make_source(self.vocab_size, self.tokenizer_dir)
            self.remote = DraftSession(self.source, self.vocab_size,
                                       settings.deadline_s(os.environ))
        return self.remote

    def connect_early(self) -> None:
        """At engine start (the constructor's end): build the session and connect once,
        within the step deadline, so that specpair_drafter_connected reads 1 before the first
        request when the drafter is up (an idle target would otherwise alert). A drafter not
        up yet is reconnected at the first step. Skipped without SPECPAIR_DRAFTER or when a
        source was set; never raises (a bad setting raises again at the first step)."""
        if self.source is not None or not os.environ.get("SPECPAIR_DRAFTER"):
            return
        try:
            session = self.session()
            session.begin(())
        except Exception as exc:
            log.warning("specpair: no drafter session at engine start (%s); the first step "
                        "tries again", exc)
            self.source = self.remote = None
            return
        self.metrics.publish(session)
