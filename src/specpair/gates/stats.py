"""Statistics of the gates: chi-square goodness of fit and a binomial rate check.

Thresholds follow docs/facts.md section 4: ``scipy.stats.chi2.isf(alpha / m, df)`` with a
documented family-wise alpha and m checks (Bonferroni), not a sigma rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy import stats

__all__ = ["ChiSquare", "chi_square", "binomial_p_value"]

MIN_EXPECTED = 5.0  # smallest expected count of a chi-square bin
MAX_BINS = 512  # bins kept individually before the tail is pooled


@dataclass(frozen=True)
class ChiSquare:
    """One chi-square goodness-of-fit result."""

    n: int  # observations
    df: int  # degrees of freedom (bins - 1)
    chi2: float  # statistic
    threshold: float  # chi2.isf(alpha_per_check, df)

    @property
    def passed(self) -> bool:
        return self.chi2 <= self.threshold


def chi_square(tokens: torch.Tensor, expected: torch.Tensor, alpha_per_check: float) -> ChiSquare:
    """Test observed token ids against an expected law over the vocabulary.

    tokens: [n] int64 observed ids; expected: [V] probabilities (float64).
    Bins: the most likely tokens, each alone while its expected count is at
    least MIN_EXPECTED (at most MAX_BINS of them), then one bin pooling the
    rest of the vocabulary (merged into the last bin if it is too small).
    """
    n = tokens.numel()
    expected = expected.double() / expected.double().sum()
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    order = expected.argsort(descending=True)
    e_sorted = expected[order] * n
    keep = int(((e_sorted >= MIN_EXPECTED).cumprod(0)).sum().clamp(max=MAX_BINS))
    if keep == 0:
        raise ValueError(f"too few observations ({n}) for any chi-square bin")
    obs = counts[order]
    exp_bins = [*e_sorted[:keep].tolist(), float(e_sorted[keep:].sum())]
    obs_bins = [*obs[:keep].tolist(), float(obs[keep:].sum())]
    if exp_bins[-1] < MIN_EXPECTED:  # pool a thin tail into the last kept bin
        exp_bins[-2] += exp_bins.pop()
        obs_bins[-2] += obs_bins.pop()
    if len(exp_bins) < 2:
        raise ValueError("chi-square needs at least two bins")
    e = torch.tensor(exp_bins, dtype=torch.float64)
    o = torch.tensor(obs_bins, dtype=torch.float64)
    chi2 = float(((o - e) ** 2 / e).sum())
    df = len(exp_bins) - 1
    return ChiSquare(n=n, df=df, chi2=chi2, threshold=float(stats.chi2.isf(alpha_per_check, df)))


def binomial_p_value(successes: int, trials: int, rate: float) -> float:
    """Two-sided exact binomial test of ``successes`` out of ``trials`` at ``rate``."""
    return float(stats.binomtest(successes, trials, min(max(rate, 0.0), 1.0)).pvalue)
