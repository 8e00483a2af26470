"""The guard's digest (specpair.vllm.drafting.digest): what it tells apart and what it does not.

A digest covers each part's kind, dtype, shape and bytes, in order; a tensor counts by its
values, whatever its strides (views of one element keep any stride, and a step's slices of a
batch are such views: a digest that failed on them would stop the engine at depth 1).
"""

from __future__ import annotations

import torch

from specpair.vllm.drafting import digest


def test_values_not_layout_count() -> None:
    table = torch.arange(40, dtype=torch.int64).view(4, 10)
    column = table[:, 3]  # stride 10
    one = table[2:3, 3]  # one element, stride 10: contiguous() leaves it as is
    assert digest(column) == digest(column.clone())
    assert digest(one) == digest(torch.tensor([23]))
    assert digest(table.t()) == digest(table.t().contiguous())


def test_order_dtype_shape_and_kind_count() -> None:
    a = torch.tensor([1, 2], dtype=torch.int64)
    assert digest("r1", "r2") != digest("r2", "r1")
    assert digest(a) != digest(a.to(torch.int32))
    assert digest(a) != digest(a.view(1, 2))
    assert digest(1) != digest("1") != digest(None)
    assert digest(a, torch.tensor([3.0])) != digest(a, torch.tensor([3.0 + 1e-6]))
