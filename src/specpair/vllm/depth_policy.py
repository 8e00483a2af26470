"""The depth policy: per request and round, how many drafts (0..K) the target asks for.

The one owner of that choice; the V1 proposer and the V2 speculator ask it per request
before each PROPOSE round and tell it what was handed to the verifier (docs/performance.md,
"Adaptive policy"). Modes (``SPECPAIR_DEPTH_POLICY``, overlays/vllm/0.32.0/README.md):

- ``adaptive`` (default): k maximizing expected tokens per second,
  E(k) / t(k) with E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j (Leviathan et al. 2023, 3.3),
  from RUNNING estimates: a_j, the chance that draft j is accepted once drafts 1..j-1 were,
  counted per request from earlier rounds' accepted counts (shrunk towards the engine-wide
  counts of requests drafted under the same law: greedy or sampled, truncated or not; a
  greedy request's a_2 says nothing of a sampled one's), and the step time t(k): the time
  between successive propose calls, split into the PROPOSE round as the session timed it
  (drafter + wire; none at k = 0) and the rest (the target's verify of 1 + k tokens, vLLM's
  own work), each a decayed least-squares fit a + b*k against the largest depth asked for
  at the earlier call, kept per batch size (1, 2, 4, 8, ... requests in the step: four
  requests' round and verify cost more than one's, and a fit carried from one to the other
  would misjudge every k until it had relearned). k = 0 (target-only for
  that request) when no k > 0 beats it. A probe round drafts one more than the best k
  (k = 1 from 0; one less from K), so a request that stopped drafting can come back and
  the fits see two depths: every ``probe_every`` rounds while a request drafts, at gaps
  doubling up to PROBE_MAX rounds while it stays at 0.
- ``fixed`` / ``fixed:K``: always K (the speculative config's K when not given).
- ``off``: never draft (every step target-only).
- ``schedule:K1,K2,...``: round r of a request drafts K_{r mod n} (a deterministic
  schedule for tests and diagnosis).

One request may carry its own setting (V1: ``vllm_xargs={"specpair_depth_policy": ...}``,
``PIN_ARG``), any of the values above. A request pinned that way, or run by a pinned engine
setting, is outside the adaptive estimates: its rounds teach neither the acceptance counts
nor the step-time fits (a step with any such request is not timed), so adaptive requests
beside it choose as they would alone. A value that does not parse is logged once for the
request and ignored (the engine's setting applies): one bad request never stops the others.

Every choice is a function of earlier rounds only (accepted counts and step times already
seen), never of the current round's draws: the verifier's test is exact for any proposal
length chosen that way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field

__all__ = ["DepthPolicy", "PolicySetting", "expected_tokens", "parse_setting", "sampling_law",
           "ENV", "PIN_ARG"]

log = logging.getLogger(__name__)

ENV = "SPECPAIR_DEPTH_POLICY"
PIN_ARG = "specpair_depth_policy"  # a request's own setting (its sampling params' extra_args)
PROBE_EVERY = 16  # rounds of a request between probes (adaptive), while it drafts
PROBE_MAX = 256  # ... doubling up to this while it stays at k = 0
_DECAY = 0.98  # weight kept by older observations per new one (engine-wide counts, cost fit)
_PRIOR_ROUNDS = 4.0  # a request's own counts weigh against this many engine-wide rounds
_PRIOR_A = 0.7  # acceptance per position before anything is seen (optimistic: it drafts K)
_PRIOR_SLOPE = 0.1  # b / a before two depths were timed: each draft adds a tenth of a step
_SLOPE_WEIGHT = 4.0  # pseudo-observations of that prior slope in the fit
_OUTLIER = 5.0  # a step gap above this many times the fitted t(k) is an idle gap, not timed
_MIN_FIT = 5.0  # observations before outliers are judged


@dataclass(frozen=True)
class PolicySetting:
    mode: str  # "adaptive", "fixed", "off" or "schedule"
    depth: int | None = None  # fixed: K (None: the configured K)
    schedule: tuple[int, ...] = ()
    probe_every: int = PROBE_EVERY


def parse_setting(text: str, k_max: int, name: str = ENV) -> PolicySetting:
    """``SPECPAIR_DEPTH_POLICY``'s value (or ``name``'s); ValueError naming what is wrong."""
    mode, _, arg = text.strip().partition(":")
    mode = mode.lower() or "adaptive"

    def depths(s: str) -> tuple[int, ...]:
        try:
            ks = tuple(int(x) for x in s.split(","))
        except ValueError:
            ks = ()
        if not ks or any(not 0 <= k <= k_max for k in ks):
            raise ValueError(f"{name}={text!r}: depths must be integers in 0..{k_max} "
                             "(the speculative config's num_speculative_tokens)")
        return ks

    if mode in ("adaptive", "off") and not arg:
        return PolicySetting(mode)
    if mode == "fixed":
        return PolicySetting(mode, depths(arg)[0] if arg else None)
    if mode == "schedule" and arg:
        return PolicySetting(mode, schedule=depths(arg))
    raise ValueError(f"{name}={text!r}: expected adaptive, off, fixed, fixed:K or "
                     "schedule:K1,K2,...")


def sampling_law(temperature: float, top_k: int = 0, top_p: float = 1.0) -> tuple[bool, bool]:
    """The part of a request's sampling settings its drafts' acceptance depends on most:
    (greedy, truncated). ``choose``'s ``law``: requests share engine-wide counts only
    within one."""
    return temperature < 1e-5, top_k > 0 or top_p < 1.0


def expected_tokens(accept: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: tokens one round commits with k drafts."""
    total, run = 1.0, 1.0
    for a in accept[:k]:
        run *= a
        total += run
    return total


@dataclass
class _Counts:
    tested: list[float]  # per position j: rounds whose draft j was verified (1..j-1 accepted)
    accepted: list[float]  # of those, rounds whose draft j was accepted

    @classmethod
    def empty(cls, k_max: int) -> _Counts:
        return cls([0.0] * k_max, [0.0] * k_max)


@dataclass
class _Req:
    counts: _Counts
    rounds: int = 0  # choices made for this request
    probe_gap: int = PROBE_EVERY  # rounds from one probe to the next
    next_probe: int = PROBE_EVERY - 1  # the round of the next probe
    handed: int = 0  # drafts handed to the verifier at the last step
    setting: PolicySetting | None = None  # its own setting (PIN_ARG); None: the engine's
    law: Hashable = ()  # the engine-wide counts it shares (``choose``'s ``law``)


@dataclass
class _Fit:
    """Decayed sums of (x = depth, y = seconds) for t(k) = a + b*k."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    coef: tuple[float, float] = (1.0, _PRIOR_SLOPE)  # (a, b) until timed (relative units)

    def add(self, x: float, y: float) -> None:
        d = _DECAY
        self.w, self.x, self.y = d * self.w + 1, d * self.x + x, d * self.y + y
        self.xx, self.xy = d * self.xx + x * x, d * self.xy + x * y
        mean_x, mean_y = self.x / self.w, self.y / self.w
        var = self.xx - self.w * mean_x * mean_x
        cov = self.xy - self.w * mean_x * mean_y
        # ridge towards the prior slope (a step grows by a tenth per draft) so one timed
        # depth still gives a slope; measured variation takes over as it accumulates
        a0 = mean_y / (1 + _PRIOR_SLOPE * mean_x)
        b = max(0.0, (cov + _SLOPE_WEIGHT * _PRIOR_SLOPE * a0) / (var + _SLOPE_WEIGHT))
        self.coef = (max(mean_y - b * mean_x, 1e-9), b)

    def time(self, k: int) -> float:
        a, b = self.coef
        return a + b * k


@dataclass
class DepthPolicy:
    """Per-engine depth choices (one caller thread: the adapter's propose)."""

    k_max: int
    setting: PolicySetting = field(default_factory=lambda: PolicySetting("adaptive"))
    clock: Callable[[], float] = time.monotonic
    chosen: list[int] = field(default_factory=list)  # choices by k (index), cumulative

    def __post_init__(self) -> None:
        self.chosen = [0] * (self.k_max + 1)
        self._reqs: dict[str, _Req] = {}
        self._pools: dict[Hashable, _Counts] = {}  # engine-wide by law, decayed
        self.fit = _Fit()  # the step without its PROPOSE round: verify of 1 + k tokens
        self.round_fit = _Fit(coef=(0.0, 0.0))  # the PROPOSE round (k > 0); 0 until timed
        # both per batch size (its power-of-two bucket): the step's; fit, round_fit are the
        # current bucket's
        self._fits: dict[int, tuple[_Fit, _Fit]] = {1: (self.fit, self.round_fit)}
        self._round: float | None = None  # the last step's round time (None: no round)
        self._last: float | None = None  # clock at the last begin
        self._last_depth: int | None = None  # largest depth asked for at the last step
        self._untimed = False  # the last step had a request outside the adaptive estimates

    @classmethod
    def from_env(cls, k_max: int) -> DepthPolicy:
        return cls(k_max, parse_setting(os.environ.get(ENV, "adaptive"), k_max))

    def begin(self, live: Collection[str]) -> None:
        """A step starts: time the last one (against the largest depth asked for) and forget
        finished requests."""
        now, k = self.clock(), self._last_depth
        if self._last is not None and k is not None and not self._untimed:
            gap = now - self._last
            if self.fit.w < _MIN_FIT or gap <= _OUTLIER * self.time(k):
                self.fit.add(k, max(0.0, gap - (self._round or 0.0)))
                if k and self._round is not None:
                    self.round_fit.add(k, self._round)
        self._last, self._last_depth, self._round = now, None, None
        self._untimed = False
        for rid in [r for r in self._reqs if r not in live]:
            del self._reqs[rid]
        bucket = 1 << max(0, len(live) - 1).bit_length()  # 1, 2, 4, 8, ... requests
        if bucket not in self._fits:
            self._fits[bucket] = (_Fit(), _Fit(coef=(0.0, 0.0)))
        self.fit, self.round_fit = self._fits[bucket]

    def choose(self, req_id: str, num_sampled: int, pin: str | None = None,
               law: Hashable = ()) -> int:
        """This round's depth for ``req_id``; ``num_sampled`` is what the target committed
        at this step (1 + the drafts it accepted of those handed at the last step); ``pin``:
        the request's own setting (PIN_ARG's value); ``law``: what its drafts' acceptance
        depends on beyond its context (``sampling_law``); both read at its first round."""
        r = self._reqs.get(req_id)
        if r is None:
            r = self._reqs[req_id] = _Req(_Counts.empty(self.k_max),
                                          setting=self._pin(req_id, pin), law=law)
        s = r.setting or self.setting
        adaptive = s.mode == "adaptive"
        if r.handed and num_sampled > 0 and adaptive:
            self._learn(r, r.handed, min(r.handed, num_sampled - 1))
        r.handed = 0
        self._untimed |= not adaptive
        k = self._pick(req_id, r, s)
        r.rounds += 1
        self.chosen[k] += 1
        # the step is timed against what was asked: a round that came back late still cost it
        self._last_depth = max(self._last_depth or 0, k)
        return k

    def handed(self, req_id: str, depth: int) -> None:
        """``depth`` drafts of ``req_id`` go to the verifier this step (0: none); a request
        ``choose`` was not asked about this step (prefill) is ignored."""
        r = self._reqs.get(req_id)
        if r is None:
            return
        r.handed = depth

    def round_time(self, seconds: float | None) -> None:
        """The PROPOSE round of this step took ``seconds`` (None: none was sent)."""
        self._round = seconds

    def time(self, k: int) -> float:
        """The fitted step time with depth k: no PROPOSE round at k = 0."""
        return self.fit.time(k) + (self.round_fit.time(k) if k else 0.0)

    def acceptance(self, req_id: str) -> list[float]:
        """The running a_1..a_K of ``req_id`` (its counts shrunk to the engine's)."""
        r = self._reqs.get(req_id)
        pool = self._pool(r.law if r else ())
        out = []
        for j in range(self.k_max):
            pool_t, pool_a = pool.tested[j], pool.accepted[j]
            prior = (pool_a + _PRIOR_A) / (pool_t + 1.0)
            t, a = (r.counts.tested[j], r.counts.accepted[j]) if r else (0.0, 0.0)
            out.append((a + _PRIOR_ROUNDS * prior) / (t + _PRIOR_ROUNDS))
        return out

    def best(self, req_id: str) -> int:
        """The k in 0..K maximizing E(k) / t(k) for ``req_id`` now (ties: the smaller)."""
        accept = self.acceptance(req_id)
        rates = [expected_tokens(accept, k) / self.time(k) for k in range(self.k_max + 1)]
        return max(range(self.k_max + 1), key=lambda k: (rates[k], -k))

    def _pin(self, req_id: str, pin: str | None) -> PolicySetting | None:
        if pin is None:
            return None
        try:
            return parse_setting(str(pin), self.k_max, PIN_ARG)
        except ValueError as exc:
            log.warning("request %s: %s; ignored, the engine's %s applies", req_id, exc, ENV)
            return None

    def _pick(self, req_id: str, r: _Req, s: PolicySetting) -> int:
        if s.mode == "off":
            return 0
        if s.mode == "fixed":
            return self.k_max if s.depth is None else min(s.depth, self.k_max)
        if s.mode == "schedule":
            return min(s.schedule[r.rounds % len(s.schedule)], self.k_max)
        k = self.best(req_id)
        if r.rounds >= r.next_probe:
            # while it stays off, each probe waits twice as long (a probe that does not pay
            # costs less and less); drafting again, every probe_every rounds
            r.probe_gap = min(2 * r.probe_gap, PROBE_MAX) if k == 0 else s.probe_every
            r.next_probe = r.rounds + r.probe_gap
            k = k + 1 if k < self.k_max else k - 1
        return k

    def _pool(self, law: Hashable) -> _Counts:
        if law not in self._pools:
            self._pools[law] = _Counts.empty(self.k_max)
        return self._pools[law]

    def _learn(self, r: _Req, handed: int, accepted: int) -> None:
        """Draft j was verified for j <= accepted + 1 (and <= handed), accepted for
        j <= accepted."""
        pool = self._pool(r.law)
        for c in (r.counts, pool):  # older rounds fade: the law drifts with context
            c.tested[:] = [_DECAY * t for t in c.tested]
            c.accepted[:] = [_DECAY * a for a in c.accepted]
        for j in range(min(accepted + 1, handed)):
            ok = 1.0 if j < accepted else 0.0
            for c in (r.counts, pool):
                c.tested[j] += 1.0
                c.accepted[j] += ok
