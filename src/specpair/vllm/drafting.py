"""The per-step drafting protocol: the one owner of what a decode step does about drafts, for
the V1 proposer (``specpair.vllm.v1``) and the V2 speculator (``specpair.vllm.v2``) alike.

The adapters only translate: vLLM's batch into ``RequestStep``s, and the answer (per
request its ``specpair.qlaw.Drafts``, or None: no drafts, a target-only step) into vLLM's
verifier inputs. A step, on every tensor-parallel rank, in the same order whatever happens
(docs/architecture.md, "Tensor parallelism"):

1. rank 0 only: the drafting session (``specpair.wire.session``) begins the step, the depth
   policy (``specpair.vllm.depth_policy``) observes what each request committed (and what
   the n-gram lookup, ``specpair.vllm.ngram``, would have earned), learns what the lookup
   finds now and chooses depths and sources; the requests given n-gram drafts take the
   lookup's and the session asks the drafter for the others. Any failure here is "no
   drafts" for the step, never a skipped collective;
2. rank 0's answer is handed to every rank through vLLM's TP group (``specpair.vllm.tp``):
   per request id its drafts as shipped (draft ids, q in its compact wire form, widened on
   each rank by the one q-law), absent for no drafts (MISSING, REFUSED, late, depth 0);
3. the guard: every rank digests what it appended at the step just sampled and what it will
   verify (its own batch's request ids in order, with each one's depth, draft ids and q),
   and one all-reduce tells whether all ranks agree:
   - appended tokens differ: the ranks have diverged already (their token tables differ,
     and every forward from here mixes two histories): ``RanksDiverged`` stops the engine
     with one line instead of serving text the target would not produce;
   - what is verified differs: every rank drops the step's drafts (a target-only step),
     rank 0 counts ``specpair_rank_mismatch_total`` and logs one ERROR line naming the step;
4. rank 0 only: the policy and the session learn what reached the verifier; the specpair
   series on /metrics are published (once per target, whatever the TP size).

Only rank 0 opens a drafter connection, holds drafter keys of unseeded requests, runs the
policy and exports metrics. With one rank nothing is shared or digested.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specpair.qlaw import Drafts
from specpair.vllm import settings
from specpair.vllm.depth_policy import DepthPolicy, sampling_law
from specpair.vllm.drafter_source import make_source
from specpair.vllm.errors import RanksDiverged
from specpair.vllm.metrics import TargetMetrics, target_metrics
from specpair.vllm.ngram import NgramLookup
from specpair.vllm.tp import TPGroup, tp_group
from specpair.wire.frames import RequestParams
from specpair.wire.session import DraftSession, StepRequest
from specpair.wire.source import DraftSource

__all__ = ["Drafting", "RequestStep", "drafter_seed", "digest", "NGRAM_MODE"]

log = logging.getLogger(__name__)

# Odd 64-bit constant (2^64 / golden ratio): multiplying by it mod 2^64 is a bijection
# that spreads nearby seeds apart, so the key of a request's drafts (specpair.rng's
# DRAFT stream) is not the vLLM seed that keys the verifier's own noise.
_SEED_MIX = 0x9E3779B97F4A7C15
_GREEDY_T = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily
# the new tokens of a request with none to send (every request at depth 0): one tensor, shared
# and never written. A fresh torch.zeros(0) a request made V1's propose_remote for 16 requests
# at depth 0 (stand-ins for vLLM's batch, one process) take 0.76-0.84 ms a step, 0.17-0.19 so
_NO_TOKENS = torch.zeros(0, dtype=torch.int64)
NGRAM_MODE = "ngram"  # the metrics' label of n-gram drafts (beside "greedy" and "sampled")


def drafter_seed(seed: int | None) -> int:
    """The 63-bit Philox key of a request's drafts, from its vLLM seed (any 64-bit int);
    a fresh random key when the request has none (the caller keeps it for the request)."""
    if seed is None:
        return int.from_bytes(os.urandom(8), "little") >> 1
    return ((seed * _SEED_MIX) & (2**64 - 1)) >> 1


def digest(*parts: bytes | str | int | torch.Tensor | None) -> int:
    """A 64-bit digest of ``parts`` in order (tensors by dtype, shape and bytes)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        if isinstance(p, torch.Tensor):
            t = p.detach().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            # a fresh dense copy: a view of one element may keep any stride (contiguous()
            # returns it as is), and reinterpreting bytes needs a unit stride
            flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))
            h.update(flat.view(torch.uint8).numpy().tobytes())
        elif isinstance(p, str):
            h.update(p.encode() + b"\0")
        elif isinstance(p, int):
            h.update(p.to_bytes(8, "little", signed=True))
        elif p is None:
            h.update(b"\xff")
        else:
            h.update(len(p).to_bytes(8, "little") + p)
    return int.from_bytes(h.digest(), "little")


def _verify_digest(reqs: Sequence[RequestStep], drafts: Sequence[Drafts | None]) -> int:
    """What this rank verifies: its batch's request ids in order, each one's drafts and q."""
    parts: list[bytes | str | int | torch.Tensor | None] = []
    for r, d in zip(reqs, drafts, strict=True):
        parts.append(r.req_id)
        if d is None:
            parts.append(0)
        else:
            parts += [d.depth, d.tokens, int(d.kind), d.q_logp, d.q_ids]
    return digest(*parts)


@dataclass(frozen=True)
class RequestStep:
    """One running request at a decode step, as an adapter hands it over."""

    req_id: str  # vLLM's request id
    length: int  # n: committed tokens (prompt + accepted output)
    num_sampled: int  # tokens committed at this step (0: still in prefill: no depth to choose)
    temperature: float  # its sampling params (below 1e-5: greedy)
    top_k: int  # 0 or >= V: off
    top_p: float  # 1: off
    seed: int | None  # the vLLM seed keying its drafter's draws (None: a fresh key, kept)
    reproducible: bool = False  # its user set the seed: depths from its own history only
    pin: str | None = None  # its own depth-policy setting (PIN_ARG's value)


@dataclass(frozen=True)
class _Plan:
    """Rank 0's part of a step, kept for learning once the step's outcome is known."""

    steps: list[StepRequest]  # what the session was asked, one per request, in order


class Drafting:
    """The drafting of one vLLM worker (one caller thread: the adapter's propose)."""

    def __init__(self, depth: int, vocab_size: int, max_model_len: int,
                 tokenizer_dir: str, group: TPGroup | None = None) -> None:
        self.depth = depth  # K: the speculative config's num_speculative_tokens
        self.vocab_size = vocab_size  # the target's V
        self.max_model_len = max_model_len  # no draft may reach past it
        self.tokenizer_dir = tokenizer_dir  # for the HELLO fingerprint
        self.group = tp_group() if group is None else group
        settings.check(os.environ, depth)  # a bad value stops the engine at start, every rank
        self.policy = DepthPolicy.from_env(depth)  # k per request and round (rank 0 runs it)
        self.drafter = self.group.rank == 0  # only the first rank drafts
        self.ngram = NgramLookup(*settings.ngram(os.environ), max_model_len)
        # request id -> (committed length, the lookup's drafts then): measured at its next step
        self._lookups: dict[str, tuple[int, torch.Tensor | None]] = {}
        # request id -> its committed tokens on the host (rank 0; int32, in a buffer that
        # doubles as it fills) and their number, for requests the lookup may serve: each step
        # copies only what was committed since, for the lookup and the drafter alike
        self._history: dict[str, tuple[np.ndarray, int]] = {}
        # the target's specpair series: exported by the drafting rank only (once per target)
        self.metrics: TargetMetrics | None = target_metrics(depth) if self.drafter else None
        self.source: DraftSource | None = None  # the wire client or in-process engine; tests
        self.remote: DraftSession | None = None  # may set source before the first step
        self._seeds: dict[str, int] = {}  # vLLM request id -> drafter key of an unseeded one
        self.steps = 0  # steps run (named in the guard's lines)
        self.rank_mismatches = 0  # steps whose drafts the guard dropped
        if self.drafter and self.policy.ngram_adaptive:
            # numba compiles the lookup (about 5 s of CPU on a 2-core box) while vLLM loads
            # the model, not in the first step (a step that needs it first waits for it)
            threading.Thread(target=self.ngram.warm_up, name="specpair-ngram-warm-up",
                             daemon=True).start()

    # ---- the session, rank 0 only ---------------------------------------------------------

    def session(self) -> DraftSession:
        """The drafting session, built on first use (the drafter may start after vLLM)."""
        if self.remote is None:
            if self.source is None:
                self.source = make_source(self.vocab_size, self.tokenizer_dir)
            self.remote = DraftSession(self.source, self.vocab_size,
                                       settings.deadline_s(os.environ))
        return self.remote

    def connect_early(self) -> None:
        """At engine start, on the drafting rank: build the session and connect once, within
        the step deadline, so that specpair_drafter_connected reads 1 before the first
        request when the drafter is up (an idle target would otherwise alert). A drafter not
        up yet is reconnected at the first step. Skipped without SPECPAIR_DRAFTER or when a
        source was set; never raises (a bad setting raises again at the first step)."""
        if (not self.drafter or self.source is not None
                or not os.environ.get(settings.DRAFTER)):
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

    # ---- one step -------------------------------------------------------------------------

    def step(self, reqs: Sequence[RequestStep], live: Collection[str],
             appended: Callable[[], int],
             tokens: Callable[[int, int, int], torch.Tensor],
             features: Callable[[int], torch.Tensor] | None = None,
             depth: int | None = None,
             host: Callable[[int], np.ndarray] | None = None) -> list[Drafts | None]:
        """Per request of ``reqs`` (in order) the drafts to verify, or None.

        ``live``: the request ids vLLM still runs; ``appended()``: a digest of the tokens this
        rank appended at the step just sampled; ``tokens(i, start, n)``: request i's committed
        tokens [start:n] int64; ``features(i)``: the target states that predicted request i's
        tokens committed at this step (drafters that declare features); ``depth``: this
        step's K when vLLM asks for fewer than the configured one; ``host(i)``: request i's
        committed tokens [0:n] where the host holds them already (int32, read during this
        call only; V1: a view of its token table), for the lookup to read without a copy
        (without it they are copied in from ``tokens``, ``_committed``)."""
        self.steps += 1
        started = time.perf_counter()
        k_max = self.depth if depth is None else min(depth, self.depth)
        plan, answer = None, {}
        if self.drafter:
            try:
                plan, answer = self._ask(reqs, live, tokens, features, k_max, host)
            except Exception:
                log.exception("specpair: unexpected error while drafting step %d (a bug, "
                              "counted in errors); the step is target-only", self.steps)
                if self.remote is not None:
                    self.remote.counters.errors += 1
        shared = self.group.share(answer)  # {vLLM request id: Drafts} on every rank
        drafts = [shared.get(r.req_id) for r in reqs]
        if self.group.size > 1:
            same_appended, same_verified = self.group.agree([appended(),
                                                             _verify_digest(reqs, drafts)])
            if not same_appended:
                msg = (f"specpair: tensor-parallel rank {self.group.rank} appended other tokens "
                       f"than another rank at step {self.steps}: the ranks have diverged; "
                       "stopping the engine (its restart brings the target back)")
                log.error(msg)
                raise RanksDiverged(msg)
            if not same_verified:
                drafts = [None] * len(reqs)
                self.rank_mismatches += 1
                if self.drafter:
                    log.error("specpair: tensor-parallel ranks disagree on the drafts of step "
                              "%d (%d requests); every rank drops them: the step is "
                              "target-only", self.steps, len(reqs))
        if self.drafter:
            self._learn(plan, drafts)
            self.policy.work_time(time.perf_counter() - started)
        return drafts

    def _ask(self, reqs: Sequence[RequestStep], live: Collection[str],
             tokens: Callable[[int, int, int], torch.Tensor],
             features: Callable[[int], torch.Tensor] | None,
             k_max: int, host: Callable[[int], np.ndarray] | None
             ) -> tuple[_Plan, dict[str, Drafts]]:
        """Rank 0: begin, observe, choose depths, ask the drafter."""
        session, policy = self.session(), self.policy
        session.begin(live)
        policy.begin(live)
        for done in [self._seeds, self._lookups, self._history]:
            for rid in [r for r in done if r not in live]:
                del done[rid]
        params = [self._params(r) for r in reqs]
        history, found = {}, {}
        for i, (r, p) in enumerate(zip(reqs, params, strict=True)):
            if r.num_sampled:  # (a request still in prefill has no depth to choose)
                policy.observe(r.req_id, r.num_sampled, r.pin,
                               sampling_law(p.temperature, p.top_k, p.top_p), r.reproducible)
                if policy.looks_up(r.req_id):  # (only the lookup needs the whole history)
                    history[r.req_id] = (host(i) if host is not None else
                                         self._committed(r, lambda a, b, i=i: tokens(i, a, b)))
                    self._measure_lookup(r, history[r.req_id])
                    # the lookup's drafts: measured at the next step, drafted now if chosen
                    # (the policy knows whether it matched: a function of the history only)
                    n = r.length
                    got = self.ngram.drafts(history[r.req_id],
                                            max(1, min(k_max, self.max_model_len - n - 1)))
                    found[r.req_id] = got
                    self._lookups[r.req_id] = (n, None if got is None else got.tokens)
                    policy.lookup(r.req_id, 0 if got is None else got.depth)
        chosen = policy.depths(session.greedy_items)
        spec = session.features
        steps, local = [], {}
        for i, (r, p) in enumerate(zip(reqs, params, strict=True)):
            n = r.length
            k = min(k_max, chosen.get(r.req_id, 0), max(0, self.max_model_len - n - 1))
            if k and policy.ngram(r.req_id):
                got = found.get(r.req_id)
                if got is not None:
                    local[r.req_id] = Drafts(got.tokens[:k], got.kind, None, None)
                k = 0  # nothing asked of the drafter for it this step
            start = session.needed_from(r.req_id, n) if k else n
            held = history.get(r.req_id)
            new = (_NO_TOKENS if start >= n else tokens(i, start, n)
                   if held is None else torch.from_numpy(held[start:n].astype(np.int64)))
            feats = None
            if spec is not None and k and features is not None:
                feats = features(i).to("cpu", spec.dtype)
            steps.append(StepRequest(r.req_id, n, new, r.num_sampled, k, p, feats,
                                     greedy=policy.greedy(r.req_id)))
        got = session.step(steps)
        for rid, d in local.items():
            session.hand_local(rid, d.depth, NGRAM_MODE)
        answer = {s.req_id: d for s, d in zip(steps, got, strict=True) if d is not None}
        return _Plan(steps), answer | local

    def _committed(self, r: RequestStep, tokens: Callable[[int, int], torch.Tensor]
                   ) -> np.ndarray:
        """Rank 0: ``r``'s committed tokens [0:n] on the host, extended by what was committed
        since the last step (read whole at its first step, or when it shrank: preempted and
        recomputed)."""
        n = r.length
        buf, held = self._history.get(r.req_id, (None, 0))
        if buf is None or held > n:
            buf, held = np.empty(max(64, 2 * n), dtype=np.int32), 0
        if n > buf.shape[0]:
            grown = np.empty(2 * n, dtype=np.int32)
            grown[:held] = buf[:held]
            buf = grown
        if held < n:
            buf[held:n] = tokens(held, n).numpy()
        self._history[r.req_id] = (buf, n)
        return buf[:n]

    def _measure_lookup(self, r: RequestStep, history: np.ndarray) -> None:
        """Rank 0: what the lookup's drafts of ``r``'s last step would have earned against
        the tokens the target committed since (the policy's n-gram estimates)."""
        last = self._lookups.pop(r.req_id, None)
        if last is None or last[0] != r.length - r.num_sampled or last[1] is None:
            return  # no lookup, not made at the length this step's tokens follow, or no match
        n, drafts = last
        compared = min(drafts.numel(), r.num_sampled)
        committed = history[n:n + compared]
        matched = 0
        while matched < compared and int(committed[matched]) == int(drafts[matched]):
            matched += 1
        self.policy.ngram_seen(r.req_id, compared, matched)

    def _learn(self, plan: _Plan | None, drafts: list[Drafts | None]) -> None:
        """Rank 0: what reached the verifier teaches the policy and the session; publish."""
        if plan is not None:
            session = self.remote
            withdrawn = []
            for s, d in zip(plan.steps, drafts, strict=True):
                self.policy.handed(s.req_id, 0 if d is None else d.depth)
                if d is None:
                    withdrawn.append(s.req_id)
            session.withdraw(withdrawn)  # drafts asked for but dropped by the guard
            self.policy.round_time(session.last_round_s)
        self.metrics.rank_mismatch(self.rank_mismatches)
        if self.remote is not None:
            self.metrics.publish(self.remote, self.policy)

    def _params(self, r: RequestStep) -> RequestParams:
        greedy = r.temperature < _GREEDY_T
        seed = r.seed
        if seed is None:
            key = self._seeds.get(r.req_id)
            if key is None:
                key = self._seeds[r.req_id] = drafter_seed(None)
        else:
            key = drafter_seed(seed)
        return RequestParams(
            temperature=0.0 if greedy else float(r.temperature),
            top_k=int(r.top_k) if 0 < int(r.top_k) < self.vocab_size else 0,
            top_p=float(r.top_p),
            seed=key,
        )
