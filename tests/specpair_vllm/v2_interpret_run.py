"""Run vLLM's Model Runner V2 Triton verifier on the CPU (TRITON_INTERPRET=1); print JSON.

Run as a subprocess with PYTHONPATH = triton 3.9.0 : the CUDA wheel's unpacked
sources : specpair's src. Three groups of requests in one call of vLLM's own
``rejection_sample`` (K = 1, V = 8, T = 0.5, q far from p):

- "remote": q written by specpair.vllm.v2.write_draft_logits (T * log q);
- "control": log q stored WITHOUT the factor T (wrong: the verifier divides by T);
- "invalid": drafts -1 (what merge_invalid_drafts makes of a MISSING q).

Two shims make vLLM accept the interpreter on a machine without a GPU: the
CUDA driver reports itself active (vLLM's Triton detection wants one active
driver), and libdevice's log1p (not available to the interpreter) is computed
as log(1 + x), a rounding difference only; nothing else of the verifier changes.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from triton.backends.nvidia.driver import CudaDriver  # noqa: E402

CudaDriver.is_active = staticmethod(lambda: True)

from vllm.triton_utils import tl  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils as rsu  # noqa: E402

from specpair.proposal import QKind  # noqa: E402
from specpair.qlaw import Drafts  # noqa: E402
from specpair.vllm.v2 import write_draft_logits  # noqa: E402

rsu.tldevice = SimpleNamespace(log1p=lambda x: tl.log(1.0 + x))

V, K, T = 8, 1, 0.5


def main() -> int:
    n_remote, n_control, n_invalid = (int(x) for x in sys.argv[1:4])
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(V, generator=g) * 1.5 * T  # p = softmax(raw / T)
    lq = torch.log_softmax(torch.randn(V, generator=g) * 1.5, -1).view(1, V)
    r = n_remote + n_control + n_invalid
    drafts = torch.multinomial(lq.exp()[0], r, replacement=True, generator=g)
    buf = torch.full((r, K, V), float("-inf"))
    write_draft_logits(buf, list(range(n_remote)),
                       [Drafts(drafts[i : i + 1], QKind.DENSE, lq, None) for i in range(n_remote)],
                       [T] * n_remote)
    buf[n_remote : n_remote + n_control, 0] = lq[0]  # the control: no factor T
    ds = torch.zeros(r, K + 1, dtype=torch.int64)
    ds[:, 1] = drafts
    ds[n_remote + n_control :, 1] = -1
    n = K + 1
    out, num = rsu.rejection_sample(
        (raw / T).repeat(r * n, 1).contiguous(), buf, ds.view(-1),
        torch.arange(0, r * n + 1, n, dtype=torch.int32),
        torch.arange(n, dtype=torch.int64).repeat(r) + 50,
        torch.arange(r, dtype=torch.int32),
        torch.arange(r, dtype=torch.int32).repeat_interleave(n),
        torch.arange(n, dtype=torch.int32).repeat(r),
        torch.full((r,), T), torch.arange(r, dtype=torch.int64) + 12345, K)
    p = torch.softmax(raw / T, -1)
    q = lq.exp()[0]
    print(json.dumps({"p": p.tolist(), "q": q.tolist(), "first": out[:, 0].tolist(),
                      "num": num.tolist(), "drafts": drafts.tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
