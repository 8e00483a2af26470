"""The drafter engine on CUDA drafts what it drafts on CPU (same laws, near-same tokens).

Logits differ by float rounding between devices, so a draw whose uniform falls
within that rounding of a CDF step, or a near-tie in the top-k order, may pick
another token: laws are compared to 1e-4 and tokens must agree at >= 90% of
positions (rounding flips are rare; a broken cache or position would disagree
almost everywhere).
"""

from __future__ import annotations

import pytest
import torch

from specpair.drafter.engine import DrafterEngine
from specpair.drafter.model import HFDraftModel
from specpair.models.tiny import TinyPair
from specpair.wire.frames import Propose, ProposeItem, RequestParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _dense(item) -> torch.Tensor:
    p = torch.zeros(item.tokens.numel(), 512, dtype=torch.float64)
    valid = item.q_ids >= 0
    rows = torch.arange(p.shape[0]).unsqueeze(1).expand_as(item.q_ids)
    p[rows[valid], item.q_ids[valid]] = torch.softmax(item.q_logp.double(), dim=-1)[valid]
    return p


def test_cuda_engine_matches_cpu_engine(tiny_pair: TinyPair) -> None:
    engines = [DrafterEngine(HFDraftModel(tiny_pair.draft, dev), tokenizer_fingerprint=bytes(32),
                             wire_version=1) for dev in ("cpu", "cuda")]
    hist = {r: [1, 40 + r, 50 + r, 60 + r] for r in range(4)}
    new = {r: list(h) for r, h in hist.items()}
    same = total = 0
    for rnd in range(4):
        items = tuple(ProposeItem(r, torch.tensor(new[r]), 1, len(hist[r]), 3,
                                  RequestParams(1.0, 40, 1.0, r), None) for r in hist)
        cpu, cuda = (e.handle(Propose(rnd, items)) for e in engines)
        for a, b in zip(cpu.items, cuda.items, strict=True):
            torch.testing.assert_close(_dense(a), _dense(b), atol=1e-4, rtol=1e-3)
            same += int((a.tokens == b.tokens).sum())
            total += a.tokens.numel()
            new[a.request_id] = a.tokens[:1].tolist() + [7]
            hist[a.request_id] += new[a.request_id]
    assert same >= 0.9 * total, (same, total)
