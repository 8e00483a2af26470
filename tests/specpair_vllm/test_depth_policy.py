"""The depth policy (specpair.vllm.depth_policy): what k it picks from running estimates of
acceptance and step cost, its fallback to target-only and its way back, the pinned modes,
and that its choices depend on earlier rounds only."""

from __future__ import annotations

import itertools
import random

import pytest
from prometheus_client import CollectorRegistry

from specpair.vllm import depth_policy
from specpair.vllm.depth_policy import DepthPolicy, sampling_law
from specpair.vllm.metrics import TargetMetrics
from specpair.vllm.policy_estimates import (
    PROBE_LEN,
    ZERO_LEN,
    Fit,
    expected_each,
    expected_tokens,
    probe,
)
from specpair.vllm.policy_setting import PROBE_EVERY, PolicySetting, parse_setting

K = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(policy, clock, rounds, accepted_of, cost, req="r", round_of=None, law=()):
    """``rounds`` decode steps of one request: the verifier accepts ``accepted_of(k)`` of the
    k drafts handed, and a step that asked for k drafts takes ``cost(k)`` seconds, of which
    its PROPOSE round took ``round_of(k)`` (when given; no round at k = 0). Returns the k
    chosen at each step."""
    chosen, sampled, handed = [], 1, 0
    for _ in range(rounds):
        clock.now += cost(handed)
        policy.begin({req})
        policy.observe(req, sampled, law=law)
        k = policy.depths()[req]
        policy.handed(req, k)
        policy.round_time(round_of(k) if round_of and k else None)
        chosen.append(k)
        sampled, handed = 1 + accepted_of(k), k
    return chosen


def test_expected_tokens_is_one_plus_the_sum_of_prefix_products():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([1.0, 0.0, 1.0], 3) == 2.0
    # every depth's in one pass, as the policy reads them; past the estimates, flat
    assert expected_each([0.5, 0.5, 0.5], 3) == [1.0, 1.5, 1.75, 1.875]
    assert expected_each([0.5], 3) == [1.0, 1.5, 1.5, 1.5]


def test_it_picks_the_k_maximizing_expected_tokens_per_second():
    clock = Clock()
    p = DepthPolicy(K, clock=clock)
    # step cost 1 + 0.2 k, acceptance 0.9 at every position, fed in as observations
    for k in itertools.islice(itertools.cycle(range(K + 1)), 300):
        p.fit.add(k, 1.0 + 0.2 * k)
    p.begin({"r"})
    p.observe("r", 1)
    r = p._reqs["r"]
    r.counts[False].tested[:] = [1000.0] * K
    r.counts[False].accepted[:] = [900.0] * K
    accept = p.acceptance("r")
    assert accept == pytest.approx([0.9] * K, abs=0.01)
    rates = [expected_tokens(accept, k) / (1.0 + 0.2 * k) for k in range(K + 1)]
    assert p.best(["r"]) == max(range(K + 1), key=rates.__getitem__)
    assert p.fit.coef == pytest.approx((1.0, 0.2), rel=0.05)  # the ridge fades
    # the same acceptance with a costly draft step: fewer drafts pay
    q = DepthPolicy(K, clock=clock)
    for k in itertools.islice(itertools.cycle(range(K + 1)), 300):
        q.fit.add(k, 1.0 + 1.5 * k)
    q.begin({"r"})
    q.observe("r", 1)
    q._reqs["r"].counts = r.counts
    assert q.best(["r"]) < p.best(["r"])


def test_one_slow_step_at_a_rare_depth_does_not_lift_the_line():
    """Live at c = 16 (T = 1) a K - 1 probe's round took 75 ms, after one at K of 99 ms,
    against 12-15 ms: each depth weighs at most one point, so the probe's one observation
    weighed as much as K's fifty, the line fell with the depth and, clamped flat, read 37 ms
    at every depth; the policy stopped drafting where it paid. A falling line is flat
    through the most observed depth's mean instead."""
    fit = Fit(0.1, (0.0, 0.0))
    for step in range(50):
        fit.add(3, 0.014, step)
    fit.add(3, 0.099, 50)
    fit.add(2, 0.075, 51)
    # K's mean, its one slow round in it clipped to 28 ms (14.3); the line through both read 46
    assert fit.time(1) == fit.time(3) < 0.017


def test_a_batch_drafts_only_where_it_beats_no_drafts_by_the_margin(monkeypatch):
    """In a batch, drafting's one-off costs (a stretch's catch-up round, the prompts of
    requests joining while it drafts) are not in the fitted step times: d > 0 must beat
    d = 0 by more than MARGIN there. Four requests whose best depth gains 1.6 % over no drafts
    stay at 0; one of them alone, or the four at a gain of 17 %, draft. Without the margin
    (the control) the four draft at 1.6 %."""
    def best(accept: float, reqs: list[str]) -> int:
        p = DepthPolicy(K, clock=Clock())
        p.begin(set(reqs))
        for k in itertools.islice(itertools.cycle(range(K + 1)), 300):
            p.fit.add(k, 1.3 + 0.1 * k if k else 1.0)  # the verify's jump once there are drafts
        for rid in reqs:
            p.observe(rid, 1)
            p._reqs[rid].counts[False].tested[:] = [1e6] * K
            p._reqs[rid].counts[False].accepted[:] = [accept * 1e6] * K
        return p.best(reqs)

    four = ["r0", "r1", "r2", "r3"]
    rates = [expected_tokens([0.38] * K, d) / (1.3 + 0.1 * d if d else 1.0)
             for d in range(K + 1)]
    assert 1.0 < max(rates) / rates[0] < 1 + depth_policy.MARGIN  # 1.016 at d = 2
    assert best(0.38, four) == 0
    assert best(0.38, ["r0"]) == 2
    assert best(0.5, four) == 3
    monkeypatch.setattr(depth_policy, "MARGIN", 0.0)
    assert best(0.38, four) == 2  # the control


def test_a_batch_switches_drafting_on_only_where_it_pays_the_drafters_catch_up(monkeypatch):
    """A stretch's first drafted step carries the drafter's catch-up of every request it does
    not hold, outside the fitted step times: in a batch, d > 0 for such requests pays the
    kind's measured catch-up spread over CATCH_UP_STEPS. Four requests at d = 0 whose best
    depth gains 8.9 % over no drafts (past MARGIN) stay at 0 where the catch-up is two steps
    without drafts; the same four drafting already (the drafter holds them) keep drafting,
    and one alone drafts (as MARGIN, a batch's). The control: with no catch-up measured the
    four switch on."""
    def best(reqs: list[str], catch: float | None, warm: bool = False) -> int:
        p = DepthPolicy(K, clock=Clock())
        p.begin(set(reqs))
        for k in itertools.islice(itertools.cycle(range(K + 1)), 300):
            p.fit.add(k, 1.2 + 0.1 * k if k else 1.0)
        if catch is not None:
            p.catch.add(catch)
        for rid in reqs:
            p.observe(rid, 1)
            p._reqs[rid].counts[False].tested[:] = [1e6] * K
            p._reqs[rid].counts[False].accepted[:] = [0.38e6] * K
            p._reqs[rid].warm = warm
        return p.best(reqs)

    four = ["r0", "r1", "r2", "r3"]
    rates = [expected_tokens([0.38] * K, d) / (1.2 + 0.1 * d if d else 1.0)
             for d in range(K + 1)]
    assert 1 + depth_policy.MARGIN < max(rates) / rates[0] < 1.1  # 1.089 at d = 2
    assert best(four, 2.0) == 0
    assert best(four, 2.0, warm=True) == 2
    assert best(["r0"], 2.0) == 2
    assert best(four, None) == 2  # the control
    monkeypatch.setattr(depth_policy, "CATCH_UP_STEPS", 1e9)
    assert best(four, 2.0) == 2  # ... and spread over no stretch at all


def test_the_catch_up_is_measured_as_a_stretchs_first_steps_excess_over_its_fitted_time():
    """``catch`` is the excess of a stretch's first drafted step (the drafter's catch-up)
    over the fitted time of its depth, from the steps the policy drafts itself (its probes
    from d = 0 here): a first step whose round costs 1.5 more reads 1.5 (such rounds stay
    out of the round's fit), the drafted steps after it add nothing; where first steps cost
    what the others do (the control), it reads 0."""
    def measured(extra: float) -> float:
        clock, p, rng = Clock(), DepthPolicy(K, clock=Clock()), random.Random(7)
        p.clock = clock
        reqs = ["r0", "r1", "r2", "r3"]
        sampled = dict.fromkeys(reqs, 1)
        last = 0
        for _ in range(1500):
            p.begin(set(reqs))
            for rid in reqs:
                p.observe(rid, sampled[rid])
            depths = p.depths()
            k = max(depths.values())
            for rid in reqs:
                p.handed(rid, depths[rid])
                ok = 0
                while ok < depths[rid] and rng.random() < 0.2:
                    ok += 1
                sampled[rid] = 1 + ok
            # the catch-up is the round's: the drafter runs the tokens it did not hold
            catch_up = extra if k and not last else 0.0
            p.round_time(0.3 + catch_up if k else None)
            clock.now += (1.5 + 0.1 * k if k else 1.0) + catch_up
            last = k
        assert p.chosen[0] > 0.9 * sum(p.chosen)  # at d = 0 but for its probes
        return p.catch.value

    assert measured(1.5) == pytest.approx(1.5, abs=0.1)
    assert measured(0.0) == pytest.approx(0.0, abs=0.1)  # the control


def test_a_batch_drafts_one_depth_for_the_sum_of_its_requests_tokens():
    """The step costs what its deepest request costs: with a request whose drafts are
    accepted (0.9) beside one whose drafts never are, the batch's depth maximizes the sum
    of both requests' expected tokens over the step time, i.e. the easy request's depth
    (drafting less for the hard one saves nothing). Alone, the hard request stops drafting.
    Another request pinned at K sets the floor: the step costs t(K) whatever the
    adaptive ones draft, so they draft K."""
    p = DepthPolicy(K, clock=Clock())
    p.begin({"easy", "hard", "pinned"})
    for k in itertools.islice(itertools.cycle(range(K + 1)), 300):
        p.fit.add(k, 1.0 + 0.2 * k)  # the step of this batch size
    for rid, acc in (("easy", 900.0), ("hard", 0.0)):
        p.observe(rid, 1)
        p._reqs[rid].counts[False].tested[:] = [1000.0] * K
        p._reqs[rid].counts[False].accepted[:] = [acc] * K
    easy = [0.9] * K
    rates = [(expected_tokens(easy, d) + 1) / (1.0 + 0.2 * d) for d in range(K + 1)]
    assert p.best(["easy", "hard"]) == max(range(K + 1), key=rates.__getitem__) > 0
    assert p.best(["hard"]) == 0
    assert p.best(["hard"], floor=K) == K  # the step costs t(K) anyway
    p.observe("pinned", 1, "fixed")
    depths = p.depths()
    assert depths["pinned"] == K and depths["easy"] == depths["hard"] == K


def test_it_stops_drafting_when_drafts_are_never_accepted_and_probes_cheaply():
    clock = Clock()
    p = DepthPolicy(K, clock=clock)
    chosen = _drive(p, clock, 300, lambda k: 0, lambda k: 0.01 + 0.003 * k)
    assert chosen[0] > 0  # it starts by drafting (optimistic prior)
    tail = chosen[100:]
    assert tail.count(0) >= len(tail) * 14 // 16  # target-only but for the probes
    assert set(tail) <= {0, K}  # a probe from d = 0 is a burst at K
    assert "".join(map(str, tail)).count(str(K) * PROBE_LEN) >= 1
    # once off, every round it drafts is a probe (and counted as one)
    assert 0 < sum(1 for k in chosen[chosen.index(0):] if k) <= p.probe_rounds


def test_a_round_overhead_that_drafts_cannot_pay_for_means_target_only():
    """The overhead-dominated regime (the random tiny pair): a target step of 3.5 ms, a
    drafter round of 4.5 ms + 0.3 ms per draft, acceptance 3/4, 2/3, 1/2 by position.
    Drafting K = 3 makes E = 2.5 tokens in 9.4 ms, target-only 1 token in 3.5 ms: the policy
    must see that the round is absent at k = 0, and its probes (bursts at 3, and the odd
    round at 3 after accepted probes) must cost under 2 % against target-only."""
    clock = Clock()
    p = DepthPolicy(3, clock=clock)
    rnd = lambda k: 0.0045 + 0.0003 * k  # noqa: E731
    cost = lambda k: 0.0035 + 0.0001 * k + (rnd(k) if k else 0.0)  # noqa: E731
    half = itertools.cycle([0, 1, 2, 3])
    chosen = _drive(p, clock, 300, lambda k: min(k, next(half)), cost, round_of=rnd)
    assert chosen[0] == 3
    tail = chosen[100:]
    assert tail.count(0) >= len(tail) * 14 // 16, tail
    real = [0.75, 2 / 3, 0.5]
    rate = sum(expected_tokens(real, k) for k in tail) / sum(cost(k) for k in tail)
    assert rate >= 0.98 / cost(0), (rate, 1 / cost(0))  # measured 0.988
    assert p.time(0) == pytest.approx(0.0035, rel=0.1)
    assert p.time(3) == pytest.approx(cost(3), rel=0.1)


@pytest.mark.parametrize(("temperature", "steps"), [(0.0, 400), (1.0, 700)])
def test_it_comes_back_once_probes_show_acceptance(temperature, steps):
    """Under T = 0 the request's own rounds weigh against 4 of its law's, so the second
    burst of probes brings it back (step 329 after the change); under T = 1 against 16
    (``_PRIOR_ROUNDS_SAMPLED``: the law's rounds tell most of a sampled draft's chance), so
    the third (step 585)."""
    clock = Clock()
    p = DepthPolicy(K, clock=clock)
    cost = lambda k: 0.01 + 0.002 * k  # noqa: E731
    law = sampling_law(temperature)
    off = _drive(p, clock, 150, lambda k: 0, cost, law=law)
    assert off[-20:].count(0) >= 18
    # the law changes: every draft is accepted now; only probes can show it
    chosen = _drive(p, clock, steps, lambda k: k, cost, law=law)
    assert chosen[-50:].count(K) >= 45


def test_pinned_modes_are_obeyed():
    clock = Clock()
    for setting, want in ((PolicySetting("fixed", 2), [2] * 12),
                          (PolicySetting("fixed"), [K] * 12),
                          (PolicySetting("off"), [0] * 12),
                          (PolicySetting("schedule", schedule=(3, 0, 1, 2)), [3, 0, 1, 2] * 3)):
        p = DepthPolicy(K, setting, clock=clock)
        assert _drive(p, clock, 12, lambda k: 0, lambda k: 0.01) == want


def _alternate(policy, clock, rounds, pinned):
    """Requests "a" (adaptive, every draft accepted, step 10 ms + 2 ms per draft) and, when
    ``pinned``, "p" (its own setting fixed:1, no draft accepted, step 50 ms) take turns,
    one decode step each, as two streams one after the other would, "p" first (so that
    its first step, whose gap would hold its prefill, is not one of "a"'s). Returns a's
    choices."""
    chosen, state, last = [], {"a": (1, 0), "p": (1, 0)}, "a"
    for _ in range(rounds):
        for req in ("p", "a") if pinned else ("a",):
            sampled, handed = state[req]
            # the step that ends here verified the drafts of the request that chose last
            clock.now += 0.01 + 0.002 * state["a"][1] if last == "a" else 0.05
            last = req
            policy.begin({"a", "p"})  # both live (the same batch-size bucket either way)
            policy.observe(req, sampled, "fixed:1" if req == "p" else None)
            k = policy.depths()[req]
            policy.handed(req, k)
            policy.round_time(None)
            if req == "a":
                chosen.append(k)
            state[req] = (1 + (k if req == "a" else 0), k)
    clock.now += 0.01 + 0.002 * state["a"][1] if last == "a" else 0.05
    policy.begin(set())  # the last step timed too (or not, when "p" took it)
    return chosen


def test_a_request_pinned_by_its_own_setting_is_obeyed_and_teaches_nothing():
    """A pinned request drafts its own depth; the adaptive request beside it chooses exactly
    as it does alone (the pinned request's rejected drafts and slow steps are not learned),
    while the same slow steps taken by an adaptive request would have been."""
    alone_clock, mixed_clock = Clock(), Clock()
    alone = DepthPolicy(K, clock=alone_clock)
    mixed = DepthPolicy(K, clock=mixed_clock)
    a_alone = _alternate(alone, alone_clock, 60, pinned=False)
    a_mixed = _alternate(mixed, mixed_clock, 60, pinned=True)
    assert mixed.chosen[1] >= 60  # "p" drafted its pinned depth every round
    assert a_mixed == a_alone
    assert mixed.acceptance("a") == pytest.approx(alone.acceptance("a"))
    assert mixed._kinds[(2, False)][0].coef == pytest.approx(alone._kinds[(2, False)][0].coef)
    # the control: without the pin, "p"'s rejected drafts pull the pooled acceptance down
    taught = DepthPolicy(K, clock=Clock())
    for _ in range(30):
        taught.begin({"p"})
        taught.observe("p", 1)
        taught.handed("p", taught.depths()["p"])
    assert taught.acceptance("a")[0] < alone.acceptance("a")[0] - 0.2


def test_a_pin_that_does_not_parse_is_logged_and_the_engine_setting_applies(caplog):
    p = DepthPolicy(K, PolicySetting("fixed", 2), clock=Clock())
    p.begin({"x", "y"})
    with caplog.at_level("WARNING", logger="specpair.vllm.depth_policy"):
        p.observe("x", 1, "fixed:9")
    p.observe("y", 1, "off")
    assert p.depths() == {"x": 2, "y": 0}  # the other request's own setting still holds
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert "request x" in line and "specpair_depth_policy='fixed:9'" in line
    assert "\n" not in line


def _requests(policy, clock, law, accept, n_req, rounds, tag, per_draft=0.0015):
    """``n_req`` requests of ``rounds`` decode steps each, one after the other (concurrency
    1), drafted under ``law``; draft j is accepted when the one before it was and
    ``accept[j]`` says so for that round (a deterministic pattern). A step costs 22 ms + 1 ms
    per draft verified, the PROPOSE round 2 ms + ``per_draft`` s per draft. The depths
    chosen."""
    chosen, i = [], 0
    for n in range(n_req):
        req, sampled, handed = f"{tag}{n}", 1, 0
        for _ in range(rounds):
            clock.now += 0.022 + 0.001 * handed + (0.002 + per_draft * handed if handed else 0)
            policy.begin({req})
            policy.observe(req, sampled, law=law)
            k = policy.depths()[req]
            policy.handed(req, k)
            policy.round_time(0.002 + per_draft * k if k else None)
            chosen.append(k)
            acc = 0
            while acc < k and accept[acc](i):
                acc += 1
            i += 1
            sampled, handed = 1 + acc, k
    return chosen


def test_requests_of_another_sampling_law_do_not_inherit_its_acceptance():
    """bench-live's cells in one engine: greedy requests whose drafts are never accepted,
    then sampled ones accepting about 0.7 at every position, drafts costing 6 ms each
    (drafting K pays at 0.7, not at the greedy requests' a_1). With a_1's
    engine-wide counts kept per law, the first sampled request starts from a fresh engine's
    estimate and drafts; sharing one pool (the control), it starts from the greedy a_1 and
    does not draft (the same engine otherwise: the same fits, the same greedy history)."""
    greedy = [lambda i: False] * 3
    sampled = [lambda i: i % 10 < 7] * 3

    def after_greedy(greedy_law, sampled_law):
        clock = Clock()
        p = DepthPolicy(3, clock=clock)
        _requests(p, clock, greedy_law, greedy, 8, 40, "g", per_draft=0.006)
        start = p.acceptance("s0", sampled_law)
        return start, _requests(p, clock, sampled_law, sampled, 8, 40, "s", per_draft=0.006)

    kept_start, kept = after_greedy((True, False), (False, False))
    shared_start, shared = after_greedy((), ())
    assert kept_start == DepthPolicy(3).acceptance("s0", (False, False)) == [0.7] * 3
    assert kept[:15].count(0) <= 1, kept[:15]
    assert shared_start[0] < 0.4  # the control: the greedy a_1, and no drafts
    assert shared[:15].count(0) >= 13, shared[:15]


def _batch_steps(policy, clock, reqs, live, rounds, verify, rnd, accept, law=()):
    """``rounds`` steps of the requests ``reqs`` batched (``live``: the step's live set;
    ``law``: their sampling law); at step n, draft j (0-based) is accepted when
    ``accept(n, j)`` (and the ones before it were); a step costs ``verify(k)`` + ``rnd(k)``
    for its largest depth k. The depths chosen."""
    chosen, state, last = [], {r: (1, 0) for r in reqs}, 0
    for n in range(rounds):
        clock.now += verify(last) + (rnd(last) if last else 0.0)
        policy.begin(live)
        ks = []
        for r in reqs:
            policy.observe(r, state[r][0], law=law)
        for r, k in policy.depths().items():
            policy.handed(r, k)
            acc = 0
            while acc < k and accept(n, acc):
                acc += 1
            state[r] = (1 + acc, k)
            ks.append(k)
        last = max(ks)
        policy.round_time(rnd(last) if last else None)
        chosen += ks
    return chosen


def test_step_costs_are_learned_per_batch_size():
    """bench-live's cells in one engine: four requests at once (a round of 40 ms, a verify of
    30 ms), then one alone (a round of 5 ms + 1 ms per draft, a verify of 22 ms + 1 ms per
    draft), the first draft accepted every other step and no deeper one: alone, one draft
    pays (1.5 tokens in 29 ms against 1 in 22), with the four's 40 ms round none would. Its
    step is another batch size, so its costs are its own and it drafts; timed against the
    four requests' costs (the control: the same request in a step the policy takes for
    four), it does not."""
    four = ["a", "b", "c", "d"]

    def alone_after_four(live_alone):
        clock = Clock()
        accept = lambda n, j: j == 0 and n % 2 == 0  # noqa: E731
        p = DepthPolicy(3, clock=clock)
        _batch_steps(p, clock, four, set(four), 120, lambda k: 0.030 + 0.001 * k,
                     lambda k: 0.040, accept)
        return _batch_steps(p, clock, ["e"], live_alone, 40, lambda k: 0.022 + 0.001 * k,
                            lambda k: 0.005 + 0.001 * k, accept)

    own = alone_after_four({"e"})
    shared = alone_after_four({"e", "x", "y", "z"})  # idle names: the four requests' bucket
    assert own[:15].count(0) <= 1, own
    assert shared[:15].count(0) >= 13, shared  # the control


def test_a_kind_of_step_keeps_its_costs_and_probes_while_another_kind_runs():
    """Top-p steps where drafting loses (a verify of 30 ms without drafts and 60 with, a
    round of 60 ms: even 1 + 3 tokens in 120 ms lose to 1 in 30), then 400 T = 1 steps where
    it pays (30 ms, 35 with drafts and a round of 5, every draft accepted), then top-p again
    with a new request. The top-p steps' fits and probe schedule are theirs, on their own
    steps' clock: the third part drafts nothing in its 100 steps (its burst gap had doubled in
    the first part). The control: one schedule for every kind (as before kinds had clocks),
    whose T = 1 steps, drafting, reset its gap: a burst at K comes at once."""
    def third_part(shared_clock: bool) -> list[int]:
        clock = Clock()
        p = DepthPolicy(3, clock=clock)
        if shared_clock:
            p._kinds = _SharedClock(p._kinds)
        top_p, t1 = sampling_law(1.0, top_p=0.9), sampling_law(1.0)
        verify = lambda k: 0.060 if k else 0.030  # noqa: E731
        first = lambda n, j: j == 0  # noqa: E731
        _batch_steps(p, clock, ["a"], {"a"}, 300, verify, lambda k: 0.060, first, top_p)
        _batch_steps(p, clock, ["b"], {"b"}, 400, lambda k: 0.035 if k else 0.030,
                     lambda k: 0.005, lambda n, j: True, t1)
        return _batch_steps(p, clock, ["c"], {"c"}, 100, verify, lambda k: 0.060, first, top_p)

    own = third_part(shared_clock=False)
    assert not any(own), own
    shared = third_part(shared_clock=True)
    assert sum(k > 0 for k in shared[:16]) >= PROBE_LEN, shared  # the control


class _SharedClock(dict):
    """The control of the test above: every kind's fits and probes on one schedule, the
    first kind's, which counts every adaptive step (the policy before kinds had clocks)."""

    def __getitem__(self, key):
        fit, round_fit, _, catch = super().__getitem__(key)
        return fit, round_fit, next(iter(self.values()))[2], catch


def test_the_step_without_drafts_is_timed_apart_and_not_where_drafting_switches_off():
    """c = 16 under top-p, as the step log read it: the rest of a step jumps once there are
    drafts (30 ms without, 52-56 ms with 1-3, a round of 20 ms), and the first step without
    drafts after drafted ones costs 100 ms (live: about one in three took 70-120 ms). With
    the first draft accepted and no deeper one, 2 tokens in 76 ms lose to 1 in 30: after its
    first rounds the policy drafts only its probe bursts. The policy before (t(0) on the
    line through every depth, the switching step timed as a step without drafts) drafted
    298 of steps 100-400 here."""
    clock = Clock()
    p = DepthPolicy(3, clock=clock)
    chosen, sampled, before, last = [], 1, 0, 0
    for _ in range(400):
        if last == 0:
            clock.now += 0.100 if before else 0.030
        else:
            clock.now += 0.050 + 0.002 * last + 0.020
        p.begin({"r"})
        p.observe("r", sampled)
        k = p.depths()["r"]
        p.handed("r", k)
        p.round_time(0.020 if k else None)
        chosen.append(k)
        sampled, before, last = 1 + min(k, 1), last, k
    assert sum(k > 0 for k in chosen[100:]) <= 2 * PROBE_LEN, chosen
    assert p.time(0) == pytest.approx(0.030)  # the switching steps are not in it


def _top_p_step(p: DepthPolicy, sampled: dict[str, int], rng: random.Random,
                accept: float) -> int:
    """One decode step of 16 top-p requests: each observed with what it committed at the
    last step (``sampled``), its depth asked for and handed, each draft accepted with
    ``accept`` given the ones before it were. Returns the step's largest depth."""
    reqs = [f"r{i}" for i in range(16)]
    p.begin(set(reqs))
    for r in reqs:
        p.observe(r, sampled.get(r, 1), law=sampling_law(1.0, top_p=0.9))
    ds = p.depths()
    for r, d in ds.items():
        p.handed(r, d)
        a = 0
        while a < d and rng.random() < accept:
            a += 1
        sampled[r] = 1 + a
    return max(ds.values())


def test_a_new_kinds_first_step_without_drafts_is_timed_on_more_than_one_step(monkeypatch):
    """A new kind of step, 16 top-p requests, as bench-live's step log read its first cell at
    c = 16: drafted steps of 100 ms (a round of 36), steps without drafts of 37 ms once they
    stay at 0 but 45, 51 and 43 ms in the first three after drafted steps, each draft
    accepted with 0.6: 2.2 tokens a request in 100 ms lose to 1 in 37. After its first zero
    probe (4 steps, 3 timed) the policy drafts only two probe bursts at K in the last 104
    steps. The control, that probe two steps long (as before): t(0) read from its one timed
    step, 51 ms, and the policy drafted 71 of the 104 (all 104 before a batch's MARGIN)."""
    def drafted() -> int:
        clock = Clock()
        p = DepthPolicy(3, clock=clock)
        rng = random.Random(0)
        sampled, last, since, ks = {}, 0, 9, []
        slow = (0.045, 0.051, 0.043)  # the first three steps without drafts after drafted ones
        for _ in range(128):
            since = 0 if last else since + 1
            clock.now += 0.100 if last else slow[since - 1] if since <= 3 else 0.037
            last = _top_p_step(p, sampled, rng, 0.6)
            p.round_time(0.036 if last else None)
            ks.append(last)
        return sum(k > 0 for k in ks[24:])

    assert drafted() <= 2 * PROBE_LEN  # two bursts at K

    def two_steps_first(state, favoured, k_max, every=PROBE_EVERY, zero=True, batch=False):
        d = probe(state, favoured, k_max, every, zero, batch)
        if state.made == 1 and state.depth == 0 and state.left == PROBE_LEN - 1:
            state.left = ZERO_LEN - 1
        return d

    monkeypatch.setattr(depth_policy, "probe", two_steps_first)
    assert drafted() >= 60  # the control


def test_parse_setting_accepts_the_documented_values_and_names_bad_ones():
    assert parse_setting("adaptive", K) == PolicySetting("adaptive")
    assert parse_setting("", K) == PolicySetting("adaptive")
    assert parse_setting("off", K) == PolicySetting("off")
    assert parse_setting("fixed", K) == PolicySetting("fixed", None)
    assert parse_setting("fixed:0", K) == PolicySetting("fixed", 0)
    assert parse_setting("schedule:3,0,1,2", K).schedule == (3, 0, 1, 2)
    for bad in ("fixed:5", "fixed:-1", "fixed:x", "schedule:", "schedule:1,,2", "sometimes",
                "off:2"):
        with pytest.raises(ValueError, match="SPECPAIR_DEPTH_POLICY"):
            parse_setting(bad, K)


def test_from_env_reads_the_variable(monkeypatch):
    monkeypatch.setenv("SPECPAIR_DEPTH_POLICY", "fixed:1")
    assert DepthPolicy.from_env(K).setting == PolicySetting("fixed", 1)
    monkeypatch.delenv("SPECPAIR_DEPTH_POLICY")
    assert DepthPolicy.from_env(K).setting == PolicySetting("adaptive")


def test_choices_use_only_earlier_rounds():
    """Two runs whose verifier outcomes agree before round n and differ from round n on
    (all drafts accepted in one, none in the other) choose alike up to round n included:
    round n's choice is made before its outcome; the runs part later, so the outcomes do
    steer the choices."""
    cost = lambda k: 0.01 + 0.002 * k  # noqa: E731
    n, rounds = 40, 120
    runs = []
    for later in (lambda k: k, lambda k: 0):
        clock, seen = Clock(), itertools.count()
        early = itertools.cycle([0, 1, 2, 0, 3])
        p = DepthPolicy(K, clock=clock)
        runs.append(_drive(p, clock, rounds,
                           lambda k, e=early, i=seen, f=later: (min(k, next(e)) if next(i) < n
                                                                else f(k)), cost))
    a, b = runs
    assert a[: n + 1] == b[: n + 1]
    assert a[n + 1 :] != b[n + 1 :]


def test_finished_requests_are_forgotten_and_the_chosen_depths_are_exported():
    clock = Clock()
    p = DepthPolicy(K, PolicySetting("schedule", schedule=(2, 0)), clock=clock)
    _drive(p, clock, 4, lambda k: k, lambda k: 0.01, req="a")
    p.begin({"b"})
    assert "a" not in p._reqs
    p.handed("a", 3)  # a request the policy was not asked about this step: ignored
    reg = CollectorRegistry()
    m = TargetMetrics(reg)
    m.init_depth(K)
    assert [reg.get_sample_value("specpair_chosen_depth_total", {"depth": str(k)})
            for k in range(K + 1)] == [0.0] * (K + 1)

    class NoSession:
        connected, last_round_s = True, None

        class counters:  # noqa: N801
            rounds = drafted = resync = refused = 0
            missing_by_reason: dict = {}
            draft_tokens_by: dict = {}
            accepted_by: dict = {}

    m.publish(NoSession(), p)
    m.publish(NoSession(), p)  # exported once, not twice
    assert [reg.get_sample_value("specpair_chosen_depth_total", {"depth": str(k)})
            for k in range(K + 1)] == [2.0, 0.0, 2.0, 0.0, 0.0]


def test_a_g_after_a_depth_asks_for_greedy_drafts():
    assert parse_setting("fixed:3g", K) == PolicySetting("fixed", 3, greedy=(True,))
    s = parse_setting("schedule:3,0,2G,1", K)
    assert s.schedule == (3, 0, 2, 1) and s.greedy == (False, False, True, False)
    for bad in ("fixed:3x", "schedule:g", "fixed:3,4"):
        with pytest.raises(ValueError):
            parse_setting(bad, K)


@pytest.mark.parametrize("greedy_items", [True, False])
def test_a_pinned_schedule_sets_the_mode_round_by_round(greedy_items):
    p = DepthPolicy(K, parse_setting("schedule:3,0,2g,1g", K))
    modes = []
    for _ in range(8):
        p.begin({"r"})
        p.observe("r", 1, law=(False, False))
        k = p.depths(greedy_items)["r"]
        modes.append((k, p.greedy("r")))
        p.handed("r", k)
    g = greedy_items
    assert modes == [(3, False), (0, False), (2, g), (1, g)] * 2


def _mode_steps(policy, steps, a1_sampled, a1_greedy, law=(False, False), greedy_items=True):
    """``steps`` steps of one request of ``law``, drafting whatever depth the policy picks in
    whatever mode it picks; the first draft is accepted at the mode's rate (a fixed pattern
    of 10), the rest never; a step costs 1 + 0.1 k s of ``policy.clock`` (a Clock), its
    round 0.1 k. Returns the mode (greedy?) of every step that drafted."""
    modes, sampled, k = [], 1, 0
    for i in range(steps):
        policy.clock.now += 1.0 + 0.1 * k
        policy.begin({"r"})
        policy.observe("r", sampled, law=law)
        k = policy.depths(greedy_items)["r"]
        g = policy.greedy("r")
        if k:
            modes.append(g)
        policy.handed("r", k)
        policy.round_time(0.1 * k if k else None)
        rate = a1_greedy if g else a1_sampled
        sampled = 1 + (1 if k and i % 10 < 10 * rate else 0)
    return modes


def test_adaptive_drafts_in_the_mode_whose_first_draft_is_accepted_more():
    modes = _mode_steps(DepthPolicy(K, PolicySetting("fixed"), clock=Clock()), 50, 0.6, 0.1)
    assert not any(modes)  # pinned to the drafter's mode: never greedy
    sampled_wins = _mode_steps(DepthPolicy(K, clock=Clock()), 600, 0.7, 0.1)
    greedy_wins = _mode_steps(DepthPolicy(K, clock=Clock()), 800, 0.1, 0.7)
    # greedy drafts only as probes, one request's round at gaps doubling from PROBE_EVERY,
    # made at steps that draft (riding on them: the step's depth is decided without it)
    assert 3 <= sum(sampled_wins) <= 6, sum(sampled_wins)
    # greedy takes over once its rounds (5 probes: 4 decayed weigh 3.9 of the 4 needed) beat
    # sampled; then sampled only as probes (at a_1 = 0.1 sampled drafts rarely pay: most
    # steps before are target-only)
    assert len(greedy_wins) >= 150 and sum(greedy_wins[:10]) <= 1, greedy_wins
    assert greedy_wins[-100:].count(False) <= 2, greedy_wins


def test_a_mode_probe_is_made_only_at_a_step_that_drafts():
    """Eight requests at T = 1 whose sampled drafts' first is accepted one time in ten and
    greedy drafts' nine in ten (the rest never), a step of 1 s and a round of 0.5 s: sampled
    drafting never pays, so a step drafts only in probe bursts. The mode probe (one request
    drafting greedy) falls on steps without drafts; it stays due until a step drafts, so
    greedy's rounds are counted, its mode wins and the steps draft (over 600 of 1,500). The
    control, the probe spent at whatever step it falls on (as before): no greedy round is
    ever made and no step drafts greedy."""
    def steps(spent_anywhere: bool) -> str:
        p = DepthPolicy(3, clock=Clock())
        if spent_anywhere:
            due = p._mode_probe_due
            p._mode_probe_due = lambda law, choice: (  # noqa: E731
                due(law, choice) and (p._mode_probed(law) or True))
        reqs = [f"r{i}" for i in range(8)]
        sampled, k, out = dict.fromkeys(reqs, 1), 0, []
        for i in range(1500):
            p.clock.now += 1.0 + (0.5 if k else 0.0)
            p.begin(set(reqs))
            for r in reqs:
                p.observe(r, sampled[r], law=(False, False))
            ds = p.depths(greedy_items=True)
            k = max(ds.values())
            for n, (r, d) in enumerate(ds.items()):
                p.handed(r, d)
                rate = 0.9 if p.greedy(r) else 0.1
                sampled[r] = 1 + (1 if d and (i + n) % 10 < 10 * rate else 0)
            p.round_time(0.5 if k else None)
            out.append("." if not k else "G" if all(p.greedy(r) for r in reqs) else "s")
        return "".join(out)

    assert steps(spent_anywhere=False).count("G") > 600
    assert "G" not in steps(spent_anywhere=True)  # the control


def test_no_mode_choice_at_temperature_zero_or_without_a_drafter_serving_both():
    for kw in ({"law": (True, False)}, {"greedy_items": False}):
        assert not any(_mode_steps(DepthPolicy(K, clock=Clock()), 200, 0.1, 0.9, **kw))


def test_each_mode_learns_from_its_own_rounds_only():
    p = DepthPolicy(K, parse_setting("schedule:2g", K), clock=Clock())
    _mode_steps(p, 30, 0.0, 1.0)  # every round greedy, first drafts always accepted
    assert p._pool((False, False), True).tested[0] == 0  # a pinned request teaches nothing
    q = DepthPolicy(K, clock=Clock())
    _mode_steps(q, 300, 0.05, 0.95)
    greedy, sampled = (q.acceptance("r", greedy=m)[0] for m in (True, False))
    assert greedy > 0.8 and sampled < 0.5, (greedy, sampled)  # not pulled up by greedy rounds


def _reproducible_run(step_cost, others, accepted_of, reproducible=True):
    """Depths chosen for one request "s" (reproducible: its user set its seed) over 60
    steps, beside ``others`` adaptive requests; a step with k drafts costs
    ``step_cost(step, k)`` = (seconds besides the round, the round's seconds); ``accepted_of(k,
    step)`` of its k drafts accepted."""
    clock = Clock()
    p = DepthPolicy(K, clock=clock)
    live = {"s", *(f"o{i}" for i in range(others))}
    chosen, sampled, handed = [], {r: 1 for r in live}, dict.fromkeys(live, 0)
    for step in range(60):
        rest, rnd = step_cost(step, max(handed.values()))
        clock.now += rest + (rnd if max(handed.values()) else 0.0)
        p.begin(live)
        for r in sorted(live):
            p.observe(r, sampled[r], reproducible=reproducible and r == "s")
        depths = p.depths()
        for r, k in depths.items():
            p.handed(r, k)
            sampled[r], handed[r] = 1 + min(k, accepted_of(k, step)), k
        p.round_time(step_cost(step, max(depths.values()))[1] if max(depths.values()) else None)
        chosen.append(depths["s"])
    return chosen


def test_a_reproducible_requests_depths_follow_its_own_history_only():
    """Its depths must be the same in every run: whatever the step timing and whatever runs
    beside it (the verifier's draws follow the depths, so its completion follows them)."""
    accepted = lambda k, step: k if step % 7 else 0  # noqa: E731  (its own history)
    quiet = lambda step, k: (0.01, 0.001)  # noqa: E731
    busy = lambda step, k: (0.01 + 0.02 * (step % 3), 0.5 + 0.01 * k)  # noqa: E731
    assert _reproducible_run(quiet, 0, accepted) == _reproducible_run(busy, 3, accepted)
    assert max(_reproducible_run(quiet, 0, accepted)) == K  # as deep as its acceptance pays
    # one that stops drafting: its probes (bursts at K on its own rounds) are its own too
    late = lambda k, step: 0 if step < 30 else k  # noqa: E731
    assert _reproducible_run(quiet, 0, late) == _reproducible_run(busy, 3, late)
    # the same request unseeded follows the timing (the control: the check has power)
    assert (_reproducible_run(quiet, 0, accepted, False)
            != _reproducible_run(busy, 3, accepted, False))


def test_a_reproducible_request_that_stops_drafting_probes_its_way_back():
    chosen = _reproducible_run(lambda step, k: (0.01, 0.001), 0,
                               lambda k, step: 0 if step < 30 else k)
    assert 0 in chosen[:30]  # nothing accepted: it stops drafting ...
    assert chosen[-1] > 0  # ... and a probe finds the acceptance back


# the trace after bench/results/2026-12-06-live-r8.md (prose, top-p 0.9, c = 16): the
# adaptive requests' steps without drafts, as its step log timed them from the kind's first
# probe on, the slow cluster at the 12th and 13th
TRACE_ZERO_MS = (28.4, 27.9, 28.8, 38.4, 29.6, 28.4, 28.8, 35.6, 28.0, 28.6, 28.1, 117.2, 127.5)


def test_a_cluster_of_two_slow_steps_does_not_switch_drafting_on():
    """16 top-p requests whose drafts are accepted with 0.5: drafted steps of 55, 67 and 77
    ms at 1, 2 and 3 (rounds of 10, 15 and 20), steps without drafts as the trace timed
    them, then 29.9 ms: a token every 36.7, 38.3 or 41.1 ms drafting, every 30 ms not. From
    step 30 on the policy drafts only its probe bursts, t(0) under 40 ms at step 100. Live,
    before ``CLIP``, t(0) read 47 ms after the cluster and the policy drafted at depth 2 until
    its next probe without drafts, 128 steps on; with ``Fit``'s level the cluster moves t(0)
    by LEVEL_GAIN's share of each step (clipped at CLIP) and the steps after it take it
    back. The control: the box slowed for good, the steps without drafts 120 ms from the
    cluster on: the policy drafts, t(0) above 45 ms at step 100 (timed meanwhile by its zero
    probes only)."""
    def drafted(after: float) -> tuple[int, float]:
        clock = Clock()
        p = DepthPolicy(3, clock=clock)
        rng = random.Random(0)
        sampled, last, zeros, ks = {}, 0, 0, []
        t0 = 0.0  # at step 100
        for _ in range(160):
            if last:
                clock.now += (0.055, 0.067, 0.077)[last - 1]
            else:
                timed = zeros < len(TRACE_ZERO_MS)
                clock.now += TRACE_ZERO_MS[zeros] / 1e3 if timed else after
                zeros += 1
            last = _top_p_step(p, sampled, rng, 0.5)
            p.round_time((0.010, 0.015, 0.020)[last - 1] if last else None)
            ks.append(last)
            t0 = p.time(0) if len(ks) == 100 else t0
        return sum(k > 0 for k in ks[30:]), t0

    steps, t0 = drafted(0.0299)
    assert steps <= 2 * PROBE_LEN
    assert t0 < 0.040
    steps, t0 = drafted(0.120)
    assert steps >= 90 and t0 > 0.045, (steps, t0)  # the control
