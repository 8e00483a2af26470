"""The core refuses sampling params outside docs/core.md's domain at SamplingParams construction
(temperature 1e-40 once divided logits to inf and every row to NaN).

The batch check is the same bounds as ``check_params_domain`` in one tensor pass; on every edge
value (each as the fp32 a tensor holds) the two agree.
"""

from __future__ import annotations

import math

import pytest
import torch

from specpair.errors import BadSamplingParams
from specpair.sampling import (
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    SamplingParams,
    check_params_domain,
    process_logits,
)

_NEXT = [math.nextafter(x, d) for x in (MIN_TEMPERATURE, MAX_TEMPERATURE) for d in (0, 1e9)]
TEMPS = [0.0, -0.0, 1e-40, 1e-6, MIN_TEMPERATURE, 1.0, MAX_TEMPERATURE, 100.001, 1e30,
         float("inf"), float("nan"), -1.0, *_NEXT]
TOP_PS = [1.0, 0.5, 1e-30, 1e-46, 0.0, -0.1, 1.0000001, float("nan")]


def _scalar_ok(t: float, k: int, p: float) -> bool:
    try:
        check_params_domain(t, k, p)
        return True
    except BadSamplingParams:
        return False


@pytest.mark.parametrize("t", TEMPS)
@pytest.mark.parametrize("p", TOP_PS)
def test_the_batch_check_agrees_with_check_params_domain(t: float, p: float) -> None:
    t32, p32 = float(torch.tensor(t, dtype=torch.float32)), float(torch.tensor(p))
    ok = _scalar_ok(t32, 3, p32)
    if ok:
        SamplingParams.make(2, t, 3, p)
    else:
        with pytest.raises(BadSamplingParams):
            SamplingParams.make(2, t, 3, p)


def test_one_row_outside_the_domain_is_named() -> None:
    with pytest.raises(BadSamplingParams, match="row 1: temperature"):
        SamplingParams(torch.tensor([1.0, 1e-40]), torch.zeros(2, dtype=torch.int64),
                       torch.ones(2), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(BadSamplingParams, match="row 0: top_k"):
        SamplingParams(torch.tensor([1.0]), torch.tensor([-1]), torch.ones(1),
                       torch.zeros(1, dtype=torch.int64))


def test_inside_the_domain_every_law_is_finite() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 30
    for t in (MIN_TEMPERATURE, MAX_TEMPERATURE):
        lp = process_logits(logits, SamplingParams.make(4, t))
        assert not bool(lp.isnan().any()) and bool(torch.isfinite(lp).any(dim=-1).all())
