"""What the depth policy (``specpair.vllm.depth_policy``) estimates from and how it keeps
measuring: a round's expected tokens, acceptance counts that fade, the step-time fits, the
probe schedule, and the estimates a step's choice was made from (the /metrics gauges). Their
reasoning is docs/performance.md's, "Adaptive policy"; the constants carry the names used
there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpair.vllm.policy_setting import PROBE_EVERY

__all__ = ["CLIP", "DECAY", "LEVEL_AGE", "LEVEL_GAIN", "PRIOR_A", "POOL_PRIOR",
           "PROBE_LEN", "PROBE_MAX", "SHAPE_STEPS", "SLOPE_WEIGHT", "ZERO_EVERY", "ZERO_LEN",
           "Counts", "Estimates", "Fit", "Mean", "Probes", "count", "expected_each",
           "expected_tokens", "first", "probe"]

PROBE_LEN = 4  # while at d = 0: a probe is a burst of this many steps at K ...
PROBE_MAX = 256  # ... PROBE_LEN * PROBE_EVERY steps apart, doubling up to this
DECAY = 0.98  # weight kept by older observations per new one (engine-wide counts, cost fit)
CLIP = 2.0  # a step time counts at most this many times its depth's decayed mean so far
PRIOR_A = 0.7  # a_j before anything is seen (optimistic: a new engine drafts K)
POOL_PRIOR = 8.0  # ... worth this many rounds in a law's engine-wide counts of a_1
SLOPE_WEIGHT = 0.1  # depths' worth of that prior slope in the fit (a depth weighs at most 1)
# the step times' level (``Fit``): a depth observed this many times in a row (or after this
# many adaptive steps without an observation) leads the level, which follows this share of
# each of its steps' ratio to the prediction (a box twice as slow followed in about 10 steps)
SHAPE_STEPS, LEVEL_AGE, LEVEL_GAIN = 4, 16, 0.1
ZERO_EVERY = 8  # while drafting: one probe in this many drafts nothing (the rest at d = 0)
ZERO_LEN = 2  # ... for this many steps (the first after drafted steps is not timed)


def expected_tokens(accept: list[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j: tokens one round commits with k drafts."""
    return expected_each(accept, k)[k]


def expected_each(accept: list[float], k: int) -> list[float]:
    """[E(0), ..., E(k)] in one pass (a position beyond ``accept`` adds nothing)."""
    out, total, run = [1.0], 1.0, 1.0
    for j in range(k):
        if j < len(accept):
            run *= accept[j]
            total += run
        out.append(total)
    return out


@dataclass
class Counts:
    tested: list[float]  # per position j: rounds whose draft j was verified (1..j-1 accepted)
    accepted: list[float]  # of those, rounds whose draft j was accepted

    @classmethod
    def empty(cls, k_max: int) -> Counts:
        return cls([0.0] * k_max, [0.0] * k_max)


@dataclass
class Mean:
    """A mean of observations fading by DECAY per new one (0 until one is seen)."""

    w: float = 0.0
    total: float = 0.0

    def add(self, y: float) -> None:
        self.w, self.total = DECAY * self.w + 1.0, DECAY * self.total + y

    @property
    def value(self) -> float:
        return self.total / self.w if self.w else 0.0


def first(pool: Counts, prior: float = PRIOR_A) -> float:
    """a_1 of a law's engine-wide counts, shrunk towards ``prior``."""
    return (pool.accepted[0] + POOL_PRIOR * prior) / (pool.tested[0] + POOL_PRIOR)


@dataclass
class Probes:
    """A probe schedule's state: the engine's (its adaptive steps), or a reproducible
    request's own (its rounds)."""

    steps: int = 0  # steps decided
    gap: int = PROBE_EVERY  # steps from the start of one probe to the next
    due: int = PROBE_EVERY  # the step at which the next probe starts
    left: int = 0  # steps left in the current burst
    depth: int = 0  # the burst's depth
    made: int = 0  # probes made while drafting
    run: int = 0  # ... in this drafting stretch (``batch``)
    on: bool = False  # the estimates favoured drafting at the last step


def probe(state: Probes, favoured: int, k_max: int, every: int = PROBE_EVERY,
          zero: bool = True, batch: bool = False) -> int:
    """The depth to draft at this step, given the depth the estimates favour: that one, or a
    probe's. A deterministic function of the schedule's own past (its step count and the
    favoured depths it was given), nothing else.

    While drafting (favoured > 0): one step every ``every`` drafts one depth off (one more,
    or K - 1 from K), and with ``zero`` the first of every ZERO_EVERY of those probes drafts
    nothing instead, for ZERO_LEN steps: the step without drafts is then timed, not
    extrapolated from K and K - 1 (at c = 16 the verify of 1 + K tokens a request costs
    twice the step without drafts), and timed first: a new kind of step (``DepthPolicy``'s
    batch size and law) drafts K from the prior until its t(0) is known. Two steps: the
    first step without drafts after drafted ones is not timed (live at c = 16 about one in
    three such steps took 70-120 ms against 30-35). The schedule's first one lasts PROBE_LEN
    steps: its t(0) stands alone until the next, 128 steps on, and live at c = 16 one timed
    step of 51 ms (the kind's steps without drafts: median 36.7) kept a new top-p kind
    drafting its first 115 steps at about 100 ms. While not (favoured = 0): a burst of
    PROBE_LEN steps drafts K, the bursts PROBE_LEN * ``every`` steps apart, doubling up to
    PROBE_MAX while each finds drafting still does not pay; a burst ends early once the
    estimates favour its depth.
    A burst, not a single step: a request's first round after steps without drafts carries
    the tokens committed meanwhile (the drafter's catch-up, not a depth's cost: not timed),
    so only the burst's later rounds time the round and the deeper positions. So while
    drafting, at most ZERO_EVERY + ZERO_LEN - 1 adaptive steps in ZERO_EVERY * ``every``
    draft a depth the estimates do not favour (9 in 128; 11 in the first 128), and while
    drafting is off, never fewer than PROBE_LEN in PROBE_MAX (1 in 64).
    In a ``batch`` (more than one request a step), a drafting stretch that begins from d = 0
    is probed from its start, ``every`` steps in, and its first probe drafts nothing: it
    began on a t(0) timed at depth 0 against times of d > 0 timed by the bursts, at other
    moments of the box (``Fit``'s level follows it; their ratio is measured only where the
    depths meet). Without it the stretch kept the bursts' due step, up to PROBE_MAX away, and
    then waited for the ZERO_EVERY-th probe: in the policy simulator's slowdown at c = 16
    (``slowdown``), no step without drafts for 390 steps after the box recovered."""
    state.steps += 1
    if batch and favoured and not state.on:  # a drafting stretch begins: probed from here
        state.due, state.run = min(state.due, state.steps + every), 0
    state.on = favoured > 0
    if state.left:
        state.left -= 1
        if favoured != state.depth:
            return state.depth
        state.left = 0  # the estimates favour it now: not a probe any more
        return favoured
    if state.steps < state.due or k_max == 0:
        return favoured
    if favoured == 0:
        state.gap = max(PROBE_LEN * every, min(2 * state.gap, PROBE_MAX))
        state.depth, state.left = k_max, PROBE_LEN - 1
        state.due = state.steps + state.gap
        return k_max
    state.gap = every
    state.due = state.steps + every
    state.made += 1
    state.run += 1
    if zero and (state.made % ZERO_EVERY == 1 or (batch and state.run == 1)):
        state.depth, state.left = 0, (PROBE_LEN if state.made == 1 else ZERO_LEN) - 1
        return 0
    return favoured + 1 if favoured < k_max else favoured - 1


@dataclass(frozen=True)
class Estimates:
    """What the last adaptive step's depth was chosen from (the /metrics gauges): per depth
    d = 0..K the fitted step time, split into the PROPOSE round and the rest (seconds; 0
    until a step was timed), and the expected tokens per second; a_1..a_K, the mean of the
    step's adaptive requests' estimates; the depth they favoured and the one drafted (a
    probe's, when one ran)."""

    requests: int
    favoured: int
    chosen: int
    rest_seconds: tuple[float, ...]
    round_seconds: tuple[float, ...]
    rates: tuple[float, ...]
    accept: tuple[float, ...]


@dataclass
class Fit:
    """t(k) = a + b*k through each depth's decayed mean seconds, each depth weighing at most
    one point (the depth drafted at nearly every step and one probed every 128th step count
    alike: the rare one is what places the line's other end), the slope b ridged towards
    ``prior`` * a. With ``jump``, t(0) is depth 0's own mean once another depth is timed too,
    and the line goes through the other depths only: the verify jumps once there are drafts
    (at c = 16 the rest of a step without drafts is 33 ms under top-p, 50-53 at 2 and 56-59
    at 3), and a line through all of them puts t(0) high, the more so the less depth 0 weighs.
    An observation counts at most CLIP times its depth's mean so far: a depth observed a dozen
    times is moved by a cluster of two slow steps by a fifth, not by half (live at c = 16, a
    new top-p kind's t(0) went from 30 to 47 ms on two steps of 117 and 127 ms; clipped, 36).
    The box's speed is kept apart from the depths' shape: t(k) is a ``level`` times that fit,
    and the means are of seconds over the level at their observation. The depth observed
    SHAPE_STEPS times in a row (the one drafted) leads: its steps move the level only, by
    LEVEL_GAIN of their ratio to the prediction less one (a step counted at most CLIP times
    the prediction, as the means count it: so the level and the means are means alike, slow
    steps included), so that every depth's time follows the box; any other depth's steps (a
    probe, a zero probe, a stretch's first steps) are placed against the level the lead just
    measured. A fit not observed for LEVEL_AGE adaptive steps has its level set again by the
    next observation of a depth it knows. Live at c = 16 under top-p (r32) the box slowed for
    about 6 s: the steps without drafts rose from 21 to 30-50 ms, the depths drafted only by
    the probes kept their times from before, drafting paid on those estimates and went on
    for 318 steps after the box recovered."""

    prior: float  # b / a before the data show a slope
    coef: tuple[float, float]  # (a, b); until timed, in relative units; over the level
    step: int | None = None  # the policy's adaptive step of the last observation
    # per depth: [decayed weight, decayed sum of seconds over the level at each]
    sums: dict[int, list[float]] = field(default_factory=dict)
    jump: bool = False  # t(0) apart from the line
    zero: float | None = None  # t(0) apart (``jump``): depth 0's mean, once another depth's
    level: float = 1.0  # the box's speed now against the means' (t(k) = level * the fit)
    run: tuple[int, int] = (-1, 0)  # the depth of the last observations, how many in a row
    lead: int = -1  # the depth whose observations move the level (-1: none yet)

    def add(self, x: int, y: float, step: int | None = None) -> None:
        """One observation; ``step``: the policy's adaptive steps so far (LEVEL_AGE's clock).
        The lead's observations move the level; the others fade the means' older
        observations by DECAY each and join their depth's mean."""
        age = 1 if step is None or self.step is None else max(1, step - self.step)
        self.step = step
        self.run = (x, self.run[1] + 1 if self.run[0] == x else 1)
        s = self.sums.get(x)
        known = s is not None and s[0] > 0 and y > 0
        if known and (age > LEVEL_AGE or self.run[1] > SHAPE_STEPS):
            self.lead = x
        if known and x == self.lead:
            ratio = y / self.time(x)
            if age > LEVEL_AGE:
                self.level *= ratio
            else:
                self.level *= 1.0 + LEVEL_GAIN * (min(ratio, CLIP) - 1.0)
            return
        for s in self.sums.values():
            s[0], s[1] = DECAY * s[0], DECAY * s[1]
        s = self.sums.setdefault(x, [0.0, 0.0])
        y /= self.level
        if s[0] > 0:
            y = min(y, CLIP * s[1] / s[0])
        s[0], s[1] = s[0] + 1, s[1] + y
        points = [(k, min(1.0, w), sy / w) for k, (w, sy) in self.sums.items() if w > 0]
        self.zero = None
        if self.jump and len(points) > 1 and any(k == 0 for k, _, _ in points):
            self.zero = max(next(m for k, _, m in points if k == 0), 1e-9)
            points = [p for p in points if p[0]]
        weight = sum(v for _, v, _ in points)
        mean_x = sum(v * k for k, v, _ in points) / weight
        mean_y = sum(v * m for _, v, m in points) / weight
        var = sum(v * (k - mean_x) ** 2 for k, v, _ in points)
        cov = sum(v * (k - mean_x) * (m - mean_y) for k, v, m in points)
        # ridge towards the prior slope, so one timed depth still gives a slope; a second
        # depth's mean takes over
        a0 = mean_y / (1 + self.prior * mean_x)
        b = (cov + SLOPE_WEIGHT * self.prior * a0) / (var + SLOPE_WEIGHT)
        if b < 0:
            # falling with the depth: more drafts do not cost less, so a rarely drafted
            # depth's few observations are off (one slow step weighs as much as the drafted
            # depth's mean): flat through the most observed depth's mean
            most = max((k for k, _, _ in points), key=lambda k: self.sums[k][0])
            w, sy = self.sums[most]
            self.coef = (max(sy / w, 1e-9), 0.0)
        else:
            self.coef = (max(mean_y - b * mean_x, 1e-9), b)

    @property
    def w(self) -> float:
        """The decayed observations' weight, every depth's."""
        return sum(w for w, _ in self.sums.values())

    def time(self, k: int) -> float:
        a, b = self.coef
        if self.zero is None:
            return self.level * (a + b * k)
        # apart, but never below it: a verify of more tokens does not cost less
        return self.level * (self.zero if k == 0 else max(a + b * k, self.zero))


def count(counts: tuple[Counts, ...], handed: int, accepted: int,
           decay: float = DECAY) -> None:
    """Draft j was verified for j <= accepted + 1 (and <= handed), accepted for
    j <= accepted."""
    for c in counts:  # older rounds fade
        c.tested[:] = [decay * t for t in c.tested]
        c.accepted[:] = [decay * a for a in c.accepted]
        for j in range(min(accepted + 1, handed, len(c.tested))):
            c.tested[j] += 1.0
            c.accepted[j] += 1.0 if j < accepted else 0.0
