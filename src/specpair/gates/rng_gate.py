"""The verifier-RNG gate: the REAL speculator and verifier on registered stress
configurations, with a must-fail control.

What it tests. For each configuration the target and draft logits of every
position are fixed (they do not depend on the prefix), so the token emitted at
position j, given that position j is reached, must follow the processed target
law p_j exactly (Leviathan et al. 2023, Theorem 1), and the draft at j must be
accepted with probability sum(min(p_j, q_j)) (p_j(argmax q_j) for a greedy
drafter). The gate checks both at EVERY position:

- chi-square goodness of fit of emitted tokens vs p_j (bins: ``gates.stats``),
  threshold ``chi2.isf(alpha / m, df)``;
- an exact two-sided binomial test of the acceptance count, at ``alpha / m``;
- for temperature 0, exact argmax identity of every emitted token.

alpha = 1e-6 family-wise (Bonferroni over the m main checks), so a correct
verifier fails a run with probability <= 1e-6.

The control. The same harness with the verifier's RECOVER draws taken from
the drafter's DRAFT stream (the coupling bug: recovery reusing the noise that
picked the rejected draft). Its acceptance rate is unchanged — only the
distribution moves — so it must fail a chi-square check. A gate whose control
passes has no power and reports itself BROKEN.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from specpair.draft import DraftMode, propose
from specpair.gates.stats import binomial_p_value, chi_square
from specpair.rng import Stream
from specpair.sampling import SamplingParams
from specpair.verify import VerifierStreams, verify

__all__ = ["StressConfig", "CONFIGS", "Check", "GateReport", "run_gate"]

ALPHA = 1e-6  # family-wise false-failure rate of the gate
CHUNK_ELEMENTS = 16_000_000  # target-logit elements per verify call (memory bound)
COUPLED = VerifierStreams(recover=Stream.DRAFT)  # the control's deliberate bug

Size = Literal["quick", "full"]


@dataclass(frozen=True)
class StressConfig:
    """A registered stress configuration (never change one; add a new name)."""

    name: str  # registration id
    vocab: int  # V
    depth: int  # K
    temperature: float  # request temperature, applied to p and q
    shape: Literal["anti", "realistic"]  # anti: draft = -target; realistic: Zipf + noisy draft
    trials: tuple[int, int]  # (quick, full) number of proposals verified
    draft_top_k: int = 0  # drafter's own truncation (SPARSE q)
    top_k: int = 0  # request top-k, applied to p and q
    mode: DraftMode = DraftMode.SAMPLED  # GREEDY: declared greedy drafter, POINT_MASS q
    control: bool = False  # also run the coupled-noise control here
    seed: int = 0  # logits seed
    scale: float = 1.0  # anti: target logits ~ N(0, scale**2)


def _realistic(k: int, t: float, trials: tuple[int, int]) -> StressConfig:
    return StressConfig(f"v129280-top64-k{k}-t{t}", 129_280, k, t, "realistic", trials,
                        draft_top_k=64, seed=k)


CONFIGS: tuple[StressConfig, ...] = (
    StressConfig("anti8-k3-t1.0", 8, 3, 1.0, "anti", (30_000, 200_000), control=True, seed=1),
    StressConfig("anti16-k5-t0.6", 16, 5, 0.6, "anti", (30_000, 200_000), control=True, seed=2,
                 scale=0.5),
    StressConfig("anti16-k1-t1.0-topk12", 16, 1, 1.0, "anti", (20_000, 100_000), top_k=12,
                 seed=3),
    StressConfig("anti16-k1-t1.0-greedy-drafter", 16, 1, 1.0, "anti", (20_000, 100_000),
                 mode=DraftMode.GREEDY, seed=4, scale=0.5),
    *(_realistic(k, t, (1_500, 12_000)) for k in (1, 3, 5) for t in (0.6, 1.0)),
    StressConfig("v129280-k3-t0", 129_280, 3, 0.0, "realistic", (40, 200), seed=5),
)


def make_logits(cfg: StressConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic (target [K+1, V], draft [K, V]) fp32 logits of a configuration."""
    g = torch.Generator().manual_seed(cfg.seed)
    k, v = cfg.depth, cfg.vocab
    if cfg.shape == "anti":
        target = torch.randn(k + 1, v, generator=g) * cfg.scale
        return target, -target[:k].clone()
    # Zipf(1.3)-like ranks in a random order per position, plus jitter; the
    # drafter sees the target's logits through independent noise.
    ranks = torch.stack([torch.randperm(v, generator=g) for _ in range(k + 1)]) + 1
    target = -1.3 * ranks.float().log() + 0.5 * torch.randn(k + 1, v, generator=g)
    draft = target[:k] + 0.5 * torch.randn(k, v, generator=g)
    return target, draft


def _law(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """[N, V] float64 probabilities, computed independently of specpair.sampling."""
    x = logits.double() / (temperature or 1.0)
    if top_k:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    return torch.softmax(x, dim=-1)


def run_trials(cfg: StressConfig, n: int, streams: VerifierStreams = VerifierStreams()  # noqa: B008
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Propose + verify n independent requests; (num_accepted [n], tokens [n, K+1])."""
    target, draft = make_logits(cfg)
    k, v = cfg.depth, cfg.vocab
    chunk = max(1, CHUNK_ELEMENTS // ((k + 1) * v))
    accepted, tokens = [], []
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        ids = torch.arange(start, start + b)
        params = SamplingParams.make(b, cfg.temperature, cfg.top_k,
                                     seed=((cfg.seed << 40) + ids).tolist())
        pos = 1000 + ids % 7
        prop = propose(draft[0].expand(b, v), lambda d, j, b=b: draft[j].expand(b, v), params, pos,
                       k, mode=cfg.mode, draft_top_k=cfg.draft_top_k)
        out = verify(target.expand(b, k + 1, v), prop, params, pos, streams=streams)
        accepted.append(out.num_accepted)
        tokens.append(out.tokens)
    return torch.cat(accepted), torch.cat(tokens)


@dataclass(frozen=True)
class Check:
    """One check of the gate (a chi-square, an acceptance test or a greedy identity)."""

    config: str  # registered configuration
    kind: Literal["chi2", "acceptance", "greedy"]  # what was tested
    position: int  # draft position j (0-based; K = bonus); greedy: drafts accepted
    n: int  # observations (requests that reached position j; greedy: tokens)
    passed: bool  # verdict at alpha / m
    df: int | None = None  # chi-square degrees of freedom
    chi2: float | None = None  # chi-square statistic
    threshold: float | None = None  # chi2.isf(alpha / m, df)
    acceptance: float | None = None  # observed acceptance rate at j
    expected_acceptance: float | None = None  # sum(min(p_j, q_j)) (or p_j(argmax q_j))
    p_value: float | None = None  # binomial test p-value
    mismatches: int | None = None  # greedy: emitted tokens != target argmax


def _expected(cfg: StressConfig) -> tuple[torch.Tensor, torch.Tensor]:
    target, draft = make_logits(cfg)
    p = _law(target, cfg.temperature, cfg.top_k)
    if cfg.mode == DraftMode.GREEDY:
        alpha = p[:-1].gather(1, draft.argmax(-1, keepdim=True)).squeeze(1)
    else:
        qk = min(k for k in (cfg.top_k, cfg.draft_top_k, cfg.vocab) if k)
        q = _law(draft, cfg.temperature, qk if qk < cfg.vocab else 0)
        alpha = torch.minimum(p[:-1], q).sum(-1)
    return p, alpha


def _checks(cfg: StressConfig, accepted: torch.Tensor, tokens: torch.Tensor,
            alpha_per_check: float, with_acceptance: bool = True) -> list[Check]:
    checks: list[Check] = []
    if cfg.temperature == 0:  # one check: every decision and token is the target argmax
        target, draft = make_logits(cfg)
        agree = (draft.argmax(-1) == target[:-1].argmax(-1)).to(torch.int64)
        want_acc = int(agree.cumprod(0).sum())
        emitted = tokens[:, : want_acc + 1]
        bad = int((accepted != want_acc).sum()) + int(
            (emitted != target[: want_acc + 1].argmax(-1)).sum())
        return [Check(cfg.name, "greedy", want_acc, emitted.numel(), bad == 0, mismatches=bad)]
    p, alpha = _expected(cfg)
    for j in range(cfg.depth + 1):
        reached = accepted >= j
        n = int(reached.sum())
        cs = chi_square(tokens[reached, j], p[j], alpha_per_check)
        checks.append(Check(cfg.name, "chi2", j, n, cs.passed, df=cs.df, chi2=cs.chi2,
                            threshold=cs.threshold))
        if with_acceptance and j < cfg.depth:
            acc = int((accepted[reached] > j).sum())
            pv = binomial_p_value(acc, n, float(alpha[j]))
            checks.append(Check(cfg.name, "acceptance", j, n, pv >= alpha_per_check,
                                acceptance=acc / n, expected_acceptance=float(alpha[j]),
                                p_value=pv))
    return checks


def count_checks(configs: tuple[StressConfig, ...]) -> int:
    """m: the number of main checks (Bonferroni denominator)."""
    return sum(1 if c.temperature == 0 else 2 * c.depth + 1 for c in configs)


@dataclass(frozen=True)
class GateReport:
    """The gate's verdict with every check and the control's checks."""

    size: str  # quick or full
    alpha: float  # family-wise false-failure rate
    m: int  # number of main checks
    checks: tuple[Check, ...]  # main checks
    control: tuple[Check, ...] = field(default=())  # coupled-noise control (must fail)

    @property
    def checks_passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def control_failed(self) -> bool:
        return any(not c.passed for c in self.control if c.kind == "chi2")

    @property
    def status(self) -> Literal["PASS", "FAIL", "BROKEN"]:
        if not self.control_failed:
            return "BROKEN"  # the control did not fail: the gate has no power
        return "PASS" if self.checks_passed else "FAIL"

    def to_json(self) -> dict:
        return {"gate": "verifier-rng", "status": self.status, "size": self.size,
                "alpha": self.alpha, "m": self.m, "control_failed": self.control_failed,
                "checks": [asdict(c) for c in self.checks],
                "control": [asdict(c) for c in self.control]}


def run_gate(size: Size = "quick", names: list[str] | None = None, alpha: float = ALPHA,
             progress: bool = False) -> GateReport:
    """Run the registered configurations (or the named ones) and the control."""
    configs = CONFIGS if not names else tuple(c for c in CONFIGS if c.name in names)
    unknown = set(names or ()) - {c.name for c in CONFIGS}
    if unknown:
        raise ValueError(f"unknown configuration(s): {sorted(unknown)}")
    if not any(c.control for c in configs):
        configs = (*[c for c in CONFIGS if c.control][:1], *configs)
    m = count_checks(configs)
    per_check = alpha / m
    checks, control = [], []
    for cfg in configs:
        n = cfg.trials[0 if size == "quick" else 1]
        accepted, tokens = run_trials(cfg, n)
        checks += _checks(cfg, accepted, tokens, per_check)
        line = f"{cfg.name}: n={n}"
        if cfg.control:
            c_acc, c_tok = run_trials(cfg, n, COUPLED)
            ctl = _checks(cfg, c_acc, c_tok, per_check)
            control += ctl
            worst = max(c.chi2 / c.threshold for c in ctl if c.kind == "chi2")
            line += f", control max chi2/threshold={worst:.1f}"
        if progress:
            print(line, file=sys.stderr, flush=True)
    return GateReport(size, alpha, m, tuple(checks), tuple(control))
