"""Two-sample chi-square homogeneity test of token ids (vLLM sampling gates and e2e tests).

Given token ids drawn by two samplers, build the 2 x B contingency table over
the tokens either drew, pool every token whose expected count (under the
pooled law, for the smaller sample) is below 5 into one "rest" bin, and
compare Pearson's statistic with ``scipy.stats.chi2.isf(alpha, df)``. Under
equal laws the test fails with probability ~alpha (the caller divides its
alpha by the number of checks: Bonferroni).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2, chi2_contingency

__all__ = ["TwoSample", "per_index", "two_sample_chi2"]


@dataclass(frozen=True)
class TwoSample:
    """One homogeneity check."""

    statistic: float  # Pearson chi-square
    df: int  # degrees of freedom (bins - 1)
    threshold: float  # chi2.isf(alpha, df)
    alpha: float  # false-failure rate of this check
    n_a: int  # size of sample a
    n_b: int  # size of sample b

    @property
    def passed(self) -> bool:
        return self.statistic <= self.threshold


def two_sample_chi2(a: np.ndarray, b: np.ndarray, alpha: float) -> TwoSample:
    """Do token ids ``a`` [n_a] and ``b`` [n_b] come from the same law?"""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("both samples need at least one token")
    toks = np.union1d(a, b)
    ca = np.searchsorted(toks, a)
    cb = np.searchsorted(toks, b)
    ca = np.bincount(ca, minlength=toks.size)
    cb = np.bincount(cb, minlength=toks.size)
    pooled = (ca + cb) / (a.size + b.size)
    keep = pooled * min(a.size, b.size) >= 5
    ta, tb = list(ca[keep]), list(cb[keep])
    if (~keep).any():
        ta.append(int(ca[~keep].sum()))
        tb.append(int(cb[~keep].sum()))
    if len(ta) < 2:  # one bin: both samples are the same constant token
        return TwoSample(0.0, 0, 0.0, alpha, a.size, b.size)
    stat, _, df, _ = chi2_contingency(np.vstack([ta, tb]), correction=False)
    return TwoSample(float(stat), int(df), float(chi2.isf(alpha, df)), alpha, a.size, b.size)


def per_index(a: np.ndarray, b: np.ndarray, indices: tuple[int, ...],
              alpha: float) -> list[TwoSample]:
    """The check at each generated-token index of two [requests, tokens] samples, family-wise
    ``alpha`` (Bonferroni over ``indices``)."""
    a, b = np.asarray(a), np.asarray(b)
    return [two_sample_chi2(a[:, i], b[:, i], alpha / len(indices)) for i in indices]
