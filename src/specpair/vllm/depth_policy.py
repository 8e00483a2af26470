"""The depth policy: per decode step, how many drafts (0..K) each request asks for.

The one owner of that choice. Per step the drafting protocol (``specpair.vllm.drafting``, on
the drafting rank) tells it which requests run (``begin``) and what each committed
(``observe``), asks for the step's depths (``depths``), and tells it what reached the
verifier (``handed``) and how long the PROPOSE round took (``round_time``). Its reasoning,
objective, estimates, probes and measurements are written once, in docs/performance.md,
"Adaptive policy"; the constants below carry the names used there. Its settings
(``SPECPAIR_DEPTH_POLICY``, a request's own ``PIN_ARG``) are
``specpair.vllm.policy_setting``'s; under ``adaptive`` (the default) it chooses one depth d
for the step's adaptive requests, the one maximizing the step's expected tokens per second
from earlier rounds' accepted counts and step times (d = 0, target-only, when no d > 0 beats
it, in a batch by more than MARGIN and, from requests the drafter does not hold, paying their
catch-up; the times fitted per kind of step, its batch size and law, over its own steps,
through a level that follows the box), with probes (``probe``: one step one depth off or two
without drafts while drafting, four at a kind's first, bursts at K while not, and a batch's
drafting stretch probed from its start, without drafts first, so that what it turned off
stays measured); greedy or sampled drafts per sampling law where the drafter serves both (the
other mode tried by one request riding on a step that drafts); per request, n-gram drafts
(``specpair.vllm.ngram``: looked up in its own history, no drafter round) instead of the
drafter's when the lookup matches at this step (``lookup``) and their expected tokens per
second are higher. Their
acceptance given a match is measured at every round whose lookup matched, whatever was
drafted (``ngram_seen``: the lookup's drafts against the tokens the target committed), so
that choice never goes unmeasured.

A request whose user set its seed (``observe``'s ``reproducible``: V1 reads the seed, V2 the
sampler's ``seeds_set``) gets, under ``adaptive``, depths from its own history only (its own
accepted counts shrunk to the fixed prior, the fixed step-cost model OWN_ROUND / OWN_DRAFT,
probes on its own rounds' schedule; the drafter's drafts only), so its completion is the
same whatever runs beside it. One request may carry its own setting (``PIN_ARG`` in its
sampling params' extra_args); a pinned request is outside the adaptive estimates, and a value
that does not parse is logged once and ignored.

Every choice is a function of earlier rounds and the committed tokens only (the lookup reads
nothing else), never of the current round's draws: the verifier's test is exact for any
proposal length, drafting mode and source chosen that way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from specpair.vllm import settings
from specpair.vllm.policy_estimates import (
    PRIOR_A,
    PROBE_MAX,
    Counts,
    Estimates,
    Fit,
    Mean,
    Probes,
    count,
    expected_each,
    first,
    probe,
)
from specpair.vllm.policy_setting import (
    ENV,
    PIN_ARG,
    PROBE_EVERY,
    PolicySetting,
    parse_setting,
)
from specpair.vllm.policy_steps import StepLog

__all__ = ["MARGIN", "DepthPolicy", "sampling_law"]

log = logging.getLogger(__name__)

_PRIOR_ROUNDS = 4.0  # a request's own counts weigh against this many rounds of the prior
# ... and this many under the drafter's sampled drafts of a sampled law: each round's
# acceptance is a coin of chance sum min(p, q), which differs little from prompt to prompt of
# one law (live at c = 1, T = 1, the fixed:3 twin read 0.34-0.53 accepted a draft per
# request, about its coin's noise over 55 rounds), so a request's own few rounds tell little
# beyond its law's: at 4, three rejected first drafts (a 7 % chance at a_1 = 0.58) took a_1
# from 0.60 to 0.33 and kept the request at depth 0 for its remaining 117 steps, where its
# twin ran 1.24x the pace of those steps without drafts
_PRIOR_ROUNDS_SAMPLED = 16.0
# b / a before the data show a slope: the rest of the step (the target's verify of 1 + k
# tokens a request) as flat in k; the round as growing a tenth per draft (a draft model step)
_REST_SLOPE, _ROUND_SLOPE = 0.0, 0.1
_OUTLIER = 5.0  # a step gap above this many times the fitted t(k) is an idle gap, not timed
_MIN_FIT = 5.0  # observations before outliers are judged
_MODE_EVIDENCE = 4.0  # a law's greedy rounds before they can win its drafting mode
# a reproducible request's step cost, relative to a target step (fixed: no timing): its
# round's fixed part and each draft's. The trained pair on a quiet 2-core box measured a
# round of 6.0-6.5 ms (3 drafts, about 1.2 ms each) beside a target step of about 38 ms
# (docs/performance.md): 0.17 and 0.03
OWN_ROUND, OWN_DRAFT = 0.2, 0.03
# a_1 of n-gram drafts before any evidence: none (their acceptance is measured at every round
# whose lookup matched, for free, ``ngram_seen``, so nothing is lost waiting for it; text that
# never repeats never drafts them)
_PRIOR_NGRAM = 0.0
# weight kept by a request's older n-gram observations per new one: they come every matched
# round, and text repeats itself in stretches (a copied block, then new text), so a request's
# own n-gram estimates follow its last few matched rounds; the engine-wide ones decay as the
# others (DECAY)
_NGRAM_DECAY = 0.8
# In a step of more than one adaptive request, d > 0 is favoured only where its expected tokens
# per second beat d = 0's (or the deepest depth a pinned or seeded request of the step drafts
# anyway: its round is paid) by more than this share. Drafting in a batch costs more than its
# steps' fitted times, by one-off costs the fits leave out and that grow with the batch: a
# stretch's first round carries every request's tokens committed since the last, and each
# request that joins while the step drafts brings its prompt. Live at c = 16, T = 1 under a
# steady load (2026-12-07): drafted steps 52 ms at the median against 22.6 without drafts, at
# 2.3-2.4 tokens a request within 2 % of no drafts; a stretch's first step 65 ms, a step a
# request joined in 60; the policy drafted 17-24 % of the request-rounds and ran 0.958
# [0.940-0.976] of the same engine without drafts. With the margin: 4-20 %, 0.985 of
# target-only against 0.965, of its floor 0.960 (inside the noise; docs/performance.md).
# One request alone pays one request's catch-up, and there drafting pays 10-35 % where it
# pays at all
MARGIN = 0.05
# ... and a stretch's first drafted step carries the drafter's catch-up for every request
# whose last step did not draft: in a batch, d > 0 from such requests pays that catch-up
# (the kind's measured excess of its catch-up steps over their fitted times, ``catch``)
# spread over this many steps, the stretch a switch is worth making for. Live at c = 16
# under top-p (2026-12-07, steady): a stretch's first step 91-102 ms against 56 for the
# drafted steps after it and 21 without drafts, and the policy switched drafting on for
# stretches of 1-6 steps eight times in about 1,000 steps, from a fitted t(0) a few per cent
# above the steps' median
CATCH_UP_STEPS = PROBE_EVERY


def sampling_law(temperature: float, top_k: int = 0, top_p: float = 1.0) -> tuple[bool, bool]:
    """The part of a request's sampling settings its drafts' acceptance depends on most:
    (greedy, truncated). ``observe``'s ``law``: requests share engine-wide counts only
    within one."""
    return temperature < 1e-5, top_k > 0 or top_p < 1.0


def _deeper(law: Hashable, mode: Hashable, a1: float) -> float:
    """The prior of a_j (j >= 2), what a request's own counts of it are shrunk towards: for
    the drafter's sampled drafts of a sampled law, its law's a_1 (at most PRIOR_A): a sampled
    draft is accepted with chance sum min(p, q) at every position alike (live at c = 16 under
    top-p 0.64, 0.62, 0.60), and at c = 16 most requests of a law where drafting does not pay
    have no rounds of their own, so PRIOR_A there (E(3) 2.53 against 2.27) made a step
    without drafts a few ms slower than its mean look worse than drafting. Otherwise PRIOR_A:
    greedy drafts and n-gram drafts are accepted all or nothing (a hard first draft, then
    likely ones), so a_1 says little of a_2."""
    return min(a1, PRIOR_A) if _coin(law, mode) else PRIOR_A


def _coin(law: Hashable, mode: Hashable) -> bool:
    """Whether ``mode``'s drafts under ``law`` are the drafter's sampled drafts of a sampled
    law: each accepted with chance sum min(p, q), a coin much alike at every position and
    from prompt to prompt of the law (``_deeper``, ``_PRIOR_ROUNDS_SAMPLED``)."""
    return mode is False and not _greedy_law(law)


def _greedy_law(law: Hashable) -> bool:
    """Whether ``law`` (``sampling_law``'s value; () when not given) is T = 0's."""
    return isinstance(law, tuple) and law[:1] == (True,)


def _truncates(laws: Iterable[Hashable]) -> bool:
    """Whether any of these ``sampling_law`` values truncates (top-p, top-k); () is none."""
    return any(law and law[1] for law in laws)


NGRAM = "ngram"  # the n-gram drafts' key beside the drafter's modes (False: sampled, True: greedy)


@dataclass
class _Req:
    counts: dict[Hashable, Counts]  # by drafting mode (greedy: True; n-gram drafts: NGRAM)
    rounds: int = 0  # depths chosen for this request
    handed: int = 0  # drafts handed to the verifier at the last step
    warm: bool = False  # drafts were handed at the step before this one: the drafter holds
    # its tokens up to this step's, so a round now carries no catch-up
    probes: Probes = field(default_factory=Probes)  # a reproducible request's own schedule
    greedy: bool = False  # the drafting mode chosen at the last step (of those drafts)
    ngram: bool = False  # n-gram drafts chosen at the last step instead of the drafter's
    found: int = 0  # drafts the lookup found at this step (``lookup``; 0: none, or not made)
    setting: PolicySetting | None = None  # its own setting (PIN_ARG); None: the engine's
    law: Hashable = ()  # the engine-wide counts it shares (``observe``'s ``law``)
    reproducible: bool = False  # its user set its seed: depths from its own history only
    # per drafting mode: its last ``_expected`` and what it was computed from (at depth 0 in a
    # batch most requests' counts and their law's a_1 stay as they were from step to step)
    memo: dict[Hashable, tuple[tuple, list[float], list[float]]] = field(default_factory=dict)


@dataclass
class DepthPolicy:
    """Per-engine depth choices (one caller thread: the adapter's propose)."""

    k_max: int
    setting: PolicySetting = field(default_factory=lambda: PolicySetting("adaptive"))
    clock: Callable[[], float] = time.monotonic
    chosen: list[int] = field(default_factory=list)  # choices by k (index), cumulative
    # whether ``adaptive`` may choose n-gram drafts (from_env: unless SPECPAIR_NGRAM=off; see
    # docs/performance.md "N-gram drafts"); pinned settings with an ``n`` take them anyway
    ngram_adaptive: bool = False
    steps: StepLog | None = None  # every step, logged (SPECPAIR_POLICY_STEPS; from_env)

    def __post_init__(self) -> None:
        self.chosen = [0] * (self.k_max + 1)
        # n-gram drafts' estimates where the lookup found none: nothing to accept
        self._no_match = ([0.0] * self.k_max, [1.0] * (self.k_max + 1))
        self._reqs: dict[str, _Req] = {}
        # a_1's engine-wide counts by (law, greedy drafting mode), decayed
        self._pools: dict[tuple[Hashable, bool], Counts] = {}
        # per law: (its last drafting-mode choice, the gap to its next mode probe and the
        # adaptive step of that probe)
        self._mode_probes: dict[Hashable, tuple[bool, int, int]] = {}
        # per kind of step: its batch size (a power-of-two bucket) and whether any request
        # truncates (top-p, top-k: its verify costs more): the rest's and the round's fits
        # and the probe schedule, over that kind's own adaptive steps (another kind's steps
        # neither fade its observations nor reset its probes), and its catch-up steps' excess
        # over their fitted times (seconds); fit, round_fit, _probes and catch are the step's
        self.fit, self.round_fit = self._new_fits()
        self._probes = Probes()
        self.catch = Mean()
        self._kinds: dict[tuple[int, bool], tuple[Fit, Fit, Probes, Mean]] = {
            (1, False): (self.fit, self.round_fit, self._probes, self.catch)}
        self._bucket = 1
        self._step: list[str] = []  # the requests observed at this step, in order
        self._adaptive_steps = 0  # every kind's (the mode probes' clock)
        # request-rounds drafted at a depth their estimates did not favour (cumulative; the
        # engine's adaptive requests and reproducible ones)
        self.probe_rounds = 0
        self.estimates: Estimates | None = None  # the last adaptive step's (metrics)
        self._round: float | None = None  # the last step's round time (None: no round)
        self._work: float | None = None  # the last step's drafting work (``work_time``)
        self._last: float | None = None  # clock at the last begin
        self._last_depth: int | None = None  # largest depth asked for at the last step
        self._before = 0  # ... and at the step before it
        self._untimed = False  # the last step had a request outside the adaptive estimates
        self._joined = False  # a request was observed for the first time at the last step
        self._catch_up = False  # a request drafted at the last step but not at the one before
        # the last step's observation of the rest (fit, depth, seconds, step), added at the
        # next begin unless a request joined in between; and of a catch-up's excess
        self._pending: tuple[Fit, int, float, int] | None = None
        self._pending_catch: tuple[Mean, float] | None = None
        self._logged_depth: int | None = None  # the last logged step's depth (``steps``)
        self._favoured: int | None = None  # its adaptive estimates' depth (None: none adaptive)

    @property
    def _steps(self) -> int:
        """Adaptive steps of the step's kind decided (its fits' and probes' clock)."""
        return self._probes.steps

    @classmethod
    def from_env(cls, k_max: int) -> DepthPolicy:
        return cls(k_max, parse_setting(os.environ.get(ENV, "adaptive"), k_max),
                   ngram_adaptive=settings.ngram_adaptive(os.environ),
                   steps=StepLog.from_env(os.environ))

    def begin(self, live: Collection[str]) -> None:
        """A step starts: time the last one (against the largest depth asked for) and forget
        finished requests."""
        now, k = self.clock(), self._last_depth
        # A request's first step follows its prefill, and its first round carries its
        # prompt to the drafter: so the rest of a step is timed one step late, once it is
        # known that no request joined in the next one (whose prefill ran inside this gap),
        # and the round of a step a request joined in is not timed. Nor is a round that
        # carried a request's catch-up (its first round after steps without drafts): it
        # costs what the tokens carried cost, not the depth's (timed, the rounds of probes
        # from d = 0 kept the round's fit high). Nor is the rest of a step without drafts
        # that follows a drafted step: switching costs it (live at c = 16 about one in three
        # took 70-120 ms against 30-35), staying at d = 0 does not.
        if self._pending is not None and not self._joined:
            fit, depth, rest, step = self._pending
            fit.add(depth, rest, step)
        if self._pending_catch is not None and not self._joined:
            mean, excess = self._pending_catch
            mean.add(excess)
        self._pending = self._pending_catch = None
        if self.steps is not None and self._last is not None and k is not None:
            self._log_step(self.steps, now - self._last, k)
        if self._last is not None and k is not None and not self._untimed:
            gap = now - self._last
            if (k or not self._before) and (self.fit.w < _MIN_FIT
                                            or gap <= _OUTLIER * self.time(k)):
                self._pending = (self.fit, k, max(0.0, gap - (self._round or 0.0)),
                                 self._steps)
                if k and self._round is not None and not (self._joined or self._catch_up):
                    self.round_fit.add(k, self._round, self._steps)
            # a catch-up's excess over the step's fitted time, once the step's times are
            # known (both fits timed: round_fit is timed only from drafted steps)
            if (k and self._catch_up and not self._joined and self._round is not None
                    and self.fit.w >= _MIN_FIT and self.round_fit.w > 0):
                self._pending_catch = (self.catch, max(0.0, gap - self.time(k)))
        self._before = k or 0
        self._last, self._last_depth, self._round, self._work = now, None, None, None
        self._untimed = self._joined = self._catch_up = False
        self._favoured = None
        self._step = []
        for rid in [r for r in self._reqs if r not in live]:
            del self._reqs[rid]
        self._bucket = 1 << max(0, len(live) - 1).bit_length()  # 1, 2, 4, 8, ... requests

    def _log_step(self, steps: StepLog, gap: float, k: int) -> None:
        """The last step, as ``begin`` is about to time it (``policy_steps``)."""
        laws = [self._reqs[rid].law for rid in self._step if rid in self._reqs]
        e = self.estimates if self._favoured is not None else None
        steps.write(t=self._last, depth=k, prev=self._logged_depth, gap_s=gap,
                    round_s=self._round, work_s=self._work, requests=len(self._step),
                    joined=self._joined,
                    pinned=self._untimed, greedy=all(_greedy_law(law) for law in laws),
                    truncated=_truncates(laws), favoured=self._favoured,
                    rest_ms=None if e is None else [round(1e3 * x, 2) for x in e.rest_seconds],
                    round_ms=None if e is None else [round(1e3 * x, 2)
                                                     for x in e.round_seconds],
                    accept=None if e is None else [round(a, 3) for a in e.accept])
        self._logged_depth = k

    @staticmethod
    def _new_fits() -> tuple[Fit, Fit]:
        """The step without its PROPOSE round (the verify of 1 + k tokens a request; 1 until
        timed) and the round (k > 0; 0 until timed)."""
        return Fit(_REST_SLOPE, (1.0, _REST_SLOPE), jump=True), Fit(_ROUND_SLOPE, (0.0, 0.0))

    def observe(self, req_id: str, num_sampled: int, pin: str | None = None,
                law: Hashable = (), reproducible: bool = False) -> None:
        """``req_id`` runs this step and wants a depth (``depths``); ``num_sampled`` is what
        the target committed at this step (1 + the drafts it accepted of those handed at
        the last step); ``pin``: the request's own setting (PIN_ARG's value); ``law``: what
        its drafts' acceptance depends on beyond its context (``sampling_law``);
        ``reproducible``: its user set its seed; all three read at its first step."""
        r = self._reqs.get(req_id)
        if r is None:
            r = self._reqs[req_id] = _Req({m: Counts.empty(self.k_max)
                                           for m in (False, True, NGRAM)},
                                          setting=self._pin(req_id, pin), law=law,
                                          reproducible=reproducible)
            self._joined = True
        # n-gram drafts learn from ``ngram_seen`` (every round, whatever was drafted)
        if (r.handed and num_sampled > 0 and not r.ngram
                and (r.setting or self.setting).mode == "adaptive"):
            self._learn(r, r.handed, min(r.handed, num_sampled - 1))
        # the drafter holds the request's tokens only after a round of its own drafts
        r.warm, r.handed, r.found = r.handed > 0 and not r.ngram, 0, 0
        self._step.append(req_id)

    def depths(self, greedy_items: bool = False) -> dict[str, int]:
        """This step's depth for every request observed since ``begin``; ``greedy_items``:
        whether the drafter drafts greedily for the requests that ask (``greedy``)."""
        out, adaptive = {}, []
        key = (self._bucket, _truncates(self._reqs[rid].law for rid in self._step))
        if key not in self._kinds:
            self._kinds[key] = (*self._new_fits(), Probes(), Mean())
        self.fit, self.round_fit, self._probes, self.catch = self._kinds[key]
        for rid in self._step:
            r = self._reqs[rid]
            s = r.setting or self.setting
            if s.mode == "adaptive" and r.reproducible:
                out[rid] = self._own(r)
            elif s.mode == "adaptive":
                adaptive.append(rid)
            else:
                self._untimed = True
                out[rid] = self._pinned(r, s, greedy_items)
        if adaptive:
            reqs, floor = [self._reqs[rid] for rid in adaptive], max(out.values(), default=0)
            probed = self._modes(reqs, greedy_items)
            d = self._adaptive(reqs, self._one_source(reqs, floor))
            for law, r in probed.items() if d else ():
                if not r.ngram:  # (``_one_source`` may have given it n-gram drafts)
                    r.greedy = not r.greedy
                    self._mode_probed(law)
            out |= dict.fromkeys(adaptive, d)
        for rid, k in out.items():
            r = self._reqs[rid]
            r.rounds += 1
            self.chosen[k] += 1
            self._catch_up = self._catch_up or (k > 0 and not r.warm and not r.ngram)
        # the step is timed against what was asked: a round that came back late still cost it
        self._last_depth = max(out.values(), default=0)
        return {rid: out[rid] for rid in self._step}

    def greedy(self, req_id: str) -> bool:
        """Whether ``req_id``'s drafts this step are to be argmax drafts (``depths`` chose)."""
        r = self._reqs.get(req_id)
        return r is not None and r.greedy

    def looks_up(self, req_id: str) -> bool:
        """Whether n-gram drafts may be chosen for ``req_id`` (observed this step): under
        ``adaptive`` (a seeded request keeps the drafter's), or a setting with an ``n``. The
        lookup runs, and is measured, only for those."""
        r = self._reqs.get(req_id)
        if r is None:
            return False
        s = r.setting or self.setting
        return (s.mode == "adaptive" and self.ngram_adaptive and not r.reproducible
                or any(s.ngram))

    def ngram(self, req_id: str) -> bool:
        """Whether ``req_id``'s drafts this step are n-gram drafts (``depths`` chose)."""
        r = self._reqs.get(req_id)
        return r is not None and r.ngram

    def lookup(self, req_id: str, found: int) -> None:
        """The lookup found ``found`` drafts for ``req_id`` (observed this step) in its
        committed tokens (0: no match): n-gram drafts are chosen only where it found some, at
        most that many (``depths`` follows)."""
        r = self._reqs.get(req_id)
        if r is not None:
            r.found = found

    def ngram_seen(self, req_id: str, compared: int, matched: int) -> None:
        """What n-gram drafts of ``req_id`` would have earned at the last step: ``compared``
        of the lookup's drafts met a token the target committed (0: the lookup found no
        match), and the first ``matched`` of those equal them. Each committed token is the
        target's own sample given the tokens before it (the verifier is exact), so a match at
        position j is a draw of exactly the acceptance of an n-gram draft there (q a point
        mass: accepted with probability p(x_j)), whether n-gram drafts, the drafter's or none
        were verified. The estimates are of that acceptance given a match (the choice is
        made knowing whether the lookup matched, ``lookup``): a round without one is not
        counted. Counted for adaptive requests only, as ``observe`` counts."""
        r = self._reqs.get(req_id)
        if r is None or (r.setting or self.setting).mode != "adaptive" or compared == 0:
            return
        count((r.counts[NGRAM],), compared, matched, _NGRAM_DECAY)
        count((self._pool(r.law, NGRAM),), compared, matched)

    def handed(self, req_id: str, depth: int) -> None:
        """``depth`` drafts of ``req_id`` go to the verifier this step (0: none); a request
        not observed this step (prefill) is ignored."""
        r = self._reqs.get(req_id)
        if r is None:
            return
        r.handed = depth

    def round_time(self, seconds: float | None) -> None:
        """The PROPOSE round of this step took ``seconds`` (None: none was sent)."""
        self._round = seconds

    def work_time(self, seconds: float) -> None:
        """The drafting protocol's own work at this step took ``seconds`` on the drafting
        rank, its PROPOSE round included (the step log's ``work_s``; not an estimate's)."""
        self._work = seconds

    def time(self, k: int, round_trip: bool = True) -> float:
        """The fitted step time with depth k: no PROPOSE round at k = 0, nor without
        ``round_trip`` (every request's drafts n-gram ones)."""
        return self.fit.time(k) + (self.round_fit.time(k) if k and round_trip else 0.0)

    def acceptance(self, req_id: str, law: Hashable = (), greedy: bool | None = None
                   ) -> list[float]:
        """The running a_1..a_K of ``req_id`` (its counts shrunk to the engine's) under its
        chosen drafting mode (or ``greedy``'s); of a request not seen yet, the engine's for
        ``law``."""
        r = self._reqs.get(req_id)
        mode = (r.greedy if r else False) if greedy is None else greedy
        law = r.law if r else law
        a1 = first(self._pool(law, mode))
        return self._acceptance(r, mode, a1, _deeper(law, mode, a1))

    def best(self, req_ids: Collection[str], floor: int = 0) -> int:
        """The d in 0..K maximizing the expected tokens per second of a step in which the
        requests ``req_ids`` draft d (and others ``floor``) (ties: the smaller)."""
        return self._best([self._reqs[rid] for rid in req_ids if rid in self._reqs], floor)

    def _best(self, reqs: list[_Req], floor: int) -> int:
        return self._rates(reqs, floor)[0]

    def _rates(self, reqs: list[_Req], floor: int
               ) -> tuple[int, list[float], Sequence[list[float]]]:
        """The favoured depth, the expected tokens per second of each d, each request's
        a_1..a_K."""
        accepts, each = zip(*(self._expected(r, NGRAM if r.ngram else r.greedy)
                              for r in reqs), strict=True)
        round_trip = floor > 0 or not all(r.ngram for r in reqs)
        batch = len(reqs) > 1
        # in a batch, the drafter's catch-up of the requests it does not hold (CATCH_UP_STEPS)
        catch = (self.catch.value * sum(not r.warm for r in reqs) / len(reqs) / CATCH_UP_STEPS
                 if batch and round_trip else 0.0)
        rates = [sum(e[d] for e in each)
                 / (self.time(max(d, floor), round_trip) + (catch if d else 0.0))
                 for d in range(self.k_max + 1)]
        # beyond the depths the step pays for anyway (``floor``) only by MARGIN, in a batch
        margin = MARGIN if batch else 0.0
        paid = max(range(min(floor, self.k_max) + 1), key=lambda d: (rates[d], -d))
        d = max(range(self.k_max + 1), key=lambda d: (rates[d], -d))
        if d > floor and rates[d] <= (1.0 + margin) * rates[paid]:
            d = paid
        return d, rates, accepts

    def _adaptive(self, reqs: list[_Req],
                  rated: tuple[int, list[float], Sequence[list[float]]]) -> int:
        """The step's depth for ``reqs`` from their ``_rates`` (a probe's, when one is due)."""
        favoured, rates, accepts = rated
        self._adaptive_steps += 1
        d = probe(self._probes, favoured, self.k_max, self.setting.probe_every,
                  batch=len(reqs) > 1)
        self._favoured = favoured
        if d != favoured:
            self.probe_rounds += len(reqs)
        timed = self.fit.w > 0
        ks = range(self.k_max + 1)
        self.estimates = Estimates(
            len(reqs), favoured, d,
            tuple(self.fit.time(k) if timed else 0.0 for k in ks),
            tuple(self.round_fit.time(k) if timed and k else 0.0 for k in ks),
            tuple(r if timed else 0.0 for r in rates),
            tuple(sum(a[j] for a in accepts) / len(accepts) for j in range(self.k_max)))
        return d

    def _own(self, r: _Req) -> int:
        """A reproducible request's depth: from its own accepted counts and the fixed cost
        model only (module docstring), probed on its own schedule (``probe`` over its own
        rounds); the drafter's own mode."""
        r.greedy = r.ngram = False
        accept = self._acceptance(r, False, PRIOR_A, PRIOR_A)
        rates = [e / (1.0 + (OWN_ROUND + OWN_DRAFT * d if d else 0.0))
                 for d, e in enumerate(expected_each(accept, self.k_max))]
        favoured = max(range(self.k_max + 1), key=lambda k: (rates[k], -k))
        d = probe(r.probes, favoured, self.k_max, self.setting.probe_every, zero=False)
        self.probe_rounds += d != favoured
        return d

    def _pinned(self, r: _Req, s: PolicySetting, greedy_items: bool) -> int:
        r.greedy = r.ngram = False
        if s.mode == "off":
            return 0
        i = 0 if s.mode == "fixed" else r.rounds % len(s.schedule)
        def at(flags: tuple[bool, ...]) -> bool:  # a flag per entry (one: every entry's)
            return flags[i] if i < len(flags) else flags[0]
        r.greedy, r.ngram = greedy_items and at(s.greedy), at(s.ngram)
        if s.mode == "fixed":
            return self.k_max if s.depth is None else min(s.depth, self.k_max)
        return min(s.schedule[i], self.k_max)

    def _modes(self, reqs: list[_Req], greedy_items: bool) -> dict[Hashable, _Req]:
        """Each adaptive request's drafting mode this step, its law's (``_law_mode``), then
        its source (``_source``). Returns, per law whose mode probe is due, the request that
        drafts in the other mode if the step drafts (``depths``: the probe rides on a step
        that drafts anyway; deciding the step's depth with it, a probe of a mode that does not
        pay kept a one-request law from drafting until the probe was made)."""
        probed: dict[Hashable, _Req] = {}
        modes: dict[Hashable, bool] = {}  # each law's, decided at its first request
        for r in reqs:
            if not greedy_items or _greedy_law(r.law):
                r.greedy = False  # no choice; at T = 0 a sampled draft is the argmax already
            elif r.law in modes:
                r.greedy = modes[r.law]
            else:
                r.greedy = modes[r.law] = self._law_mode(r.law)
                if self._mode_probe_due(r.law, r.greedy):
                    probed[r.law] = r
            r.ngram = self._source(r)
        return probed

    def _source(self, r: _Req) -> bool:
        """n-gram drafts for ``r`` when its lookup matched at this step and their best
        expected tokens per second (its n-gram estimates, no PROPOSE round) beat both its
        drafter mode's (the round included) and no drafts. Both estimates stay measured: the
        n-gram ones at every round whose lookup matched (``ngram_seen``), the drafter's kept
        from its rounds and refreshed by the engine's probes of it."""
        def best(mode: Hashable, round_trip: bool) -> float:
            return max(e / self.time(d, round_trip)
                       for d, e in enumerate(self._expected(r, mode)[1]) if d)
        if self.k_max == 0 or not self.ngram_adaptive or not r.found:
            return False
        return best(NGRAM, False) > max(best(r.greedy, True), 1.0 / self.time(0))

    def _one_source(self, reqs: list[_Req], floor: int
                    ) -> tuple[int, list[float], Sequence[list[float]]]:
        """n-gram drafts for every adaptive request of the step when the step's best expected
        tokens per second is higher so than with each request's own choice (``_source``): one
        request that takes the drafter's drafts makes the whole step wait for the PROPOSE
        round (at c = 16 18-28 ms beside a step of 25-35), which its own choice does not
        weigh. Not where the step has a round anyway (``floor``: a pinned or seeded request
        drafts), nor where no request's lookup matched: n-gram drafts would draft nothing,
        and a step without drafts is no faster for being called theirs, so the comparison
        cannot pick them (skipping it saved 0.05 ms of a step at c = 16 in the engine, a
        quarter of the choice's cost). Returns the ``_rates`` of the sources kept."""
        mixed = self._rates(reqs, floor)
        if (not self.ngram_adaptive or floor or all(r.ngram for r in reqs)
                or not any(r.found for r in reqs)):
            return mixed
        own = [r.ngram for r in reqs]
        for r in reqs:
            r.ngram = True
        lookups = self._rates(reqs, floor)
        if max(lookups[1]) > max(mixed[1]):
            return lookups
        for r, choice in zip(reqs, own, strict=True):
            r.ngram = choice
        return mixed

    def _expected(self, r: _Req, mode: Hashable) -> tuple[list[float], list[float]]:
        """``r``'s a_1..a_K under ``mode`` (a drafter mode or NGRAM), shrunk to its law's,
        under NGRAM 0 beyond the drafts its lookup found at this step; and its E(0)..E(K).
        Computed again only when what they are computed from changed (``_Req.memo``: the
        same floats, from the same inputs)."""
        ngram = mode == NGRAM
        if ngram and not r.found:
            return self._no_match
        a1 = first(self._pool(r.law, mode), _PRIOR_NGRAM if ngram else PRIOR_A)
        own = r.counts[mode]
        key = (a1, r.found if ngram else 0, *own.tested, *own.accepted)
        memo = r.memo.get(mode)
        if memo is not None and memo[0] == key:
            return memo[1], memo[2]
        a = self._acceptance(r, mode, a1, _deeper(r.law, mode, a1))
        if ngram:
            a = [x if j < r.found else 0.0 for j, x in enumerate(a)]
        each = expected_each(a, self.k_max)
        r.memo[mode] = (key, a, each)
        return a, each

    def _law_mode(self, law: Hashable) -> bool:
        """Greedy drafts for the law's requests once its greedy rounds (at least
        _MODE_EVIDENCE, decayed) accepted their first draft more often than its sampled
        rounds' estimated a_1; sampled drafts (the drafter's own mode) until then."""
        g = self._pool(law, True)
        return (g.tested[0] >= _MODE_EVIDENCE
                and g.accepted[0] / g.tested[0] > first(self._pool(law, False)))

    def _mode_probe_due(self, law: Hashable, choice: bool) -> bool:
        """Whether the law's mode probe is due at this step. Its gap doubles per probe made
        while the law's choice stays the same; a probe is made (``_mode_probed``) only at a
        step that drafts: at one without drafts (a probe of the depth, or no depth paying)
        the other mode had no round, and stays due."""
        every, now = self.setting.probe_every, self._adaptive_steps
        last, gap, due = self._mode_probes.get(law, (choice, every, now + every))
        if choice != last:
            gap, due = every, now + every
        self._mode_probes[law] = (choice, gap, due)
        return now >= due

    def _mode_probed(self, law: Hashable) -> None:
        choice, gap, _ = self._mode_probes[law]
        gap = min(2 * gap, PROBE_MAX)
        self._mode_probes[law] = (choice, gap, self._adaptive_steps + gap)

    def _acceptance(self, r: _Req | None, greedy: Hashable, first: float, deeper: float
                    ) -> list[float]:
        """Each position's own counts shrunk towards its prior: a_1's, ``first`` (the law's
        engine-wide estimate; PRIOR_A for a reproducible request); a deeper one's,
        ``deeper`` (``_deeper``). Engine-wide counts of a_j (j >= 2) would mislead:
        position j is tested only where drafts 1..j-1 were accepted, so those counts come
        from the requests that reach it most (greedy prose: a_1 ~ 1, a_2 ~ 0.05), not from
        the request at hand (greedy code: a_1 ~ 0.3 on a hard prompt, then ~ 1)."""
        out = []
        own = r.counts[greedy] if r else None
        weight = (_PRIOR_ROUNDS_SAMPLED if r and not r.reproducible and _coin(r.law, greedy)
                  else _PRIOR_ROUNDS)
        for j in range(self.k_max):
            t, a = (own.tested[j], own.accepted[j]) if own else (0.0, 0.0)
            out.append((a + weight * (first if j == 0 else deeper)) / (t + weight))
        return out

    def _pin(self, req_id: str, pin: str | None) -> PolicySetting | None:
        if pin is None:
            return None
        try:
            return parse_setting(str(pin), self.k_max, PIN_ARG)
        except ValueError as exc:
            log.warning("request %s: %s; ignored, the engine's %s applies", req_id, exc, ENV)
            return None

    def _pool(self, law: Hashable, greedy: Hashable = False) -> Counts:
        key = (law, greedy)
        if key not in self._pools:
            self._pools[key] = Counts.empty(1)
        return self._pools[key]

    def _learn(self, r: _Req, handed: int, accepted: int) -> None:
        count((r.counts[r.greedy], self._pool(r.law, r.greedy)), handed, accepted)
