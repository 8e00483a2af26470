"""Model Runner V2 on the CPU: vLLM's own Triton verifier under TRITON_INTERPRET=1.

The CUDA wheel's sources (pinned, unpacked) and triton 3.9.0 (pinned, the
version torch 2.13.0's CUDA builds use) run in a subprocess
(``v2_interpret_run.py``) at a tiny size: V = 8, K = 1, T = 0.5, q far from p.
Statistic: chi-square of the first emitted token of N_REMOTE requests whose q
was written by ``write_draft_logits`` against the exact target law p,
threshold chi2.isf(1e-6, 7). Control (must fail): q stored as log q without
the factor T; its exact output law is off by a chi-square noncentrality of
~0.28 per request (~139 at N = 500, threshold 42: power ~1). Invalid (-1)
drafts must emit exactly one token. The interpreter is slow (~50 ms per
request), hence the small N.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from scipy.stats import chi2

from specpair.overlay.manifest import Wheel
from specpair.overlay.wheels import cache_dir, ensure_wheel, unpack

TRITON = Wheel("triton", "triton-3.9.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
               "1622118a038b0c6e16fa4a0305da62c8b3c15904ee1cc4d4e65846a25969e41e")
N_REMOTE, N_CONTROL, N_INVALID = 500, 500, 50
HERE = Path(__file__).resolve().parent


def _triton_dir() -> Path:
    dest = cache_dir() / "triton-3.9.0-unpacked"
    if not (dest / ".complete").is_file():
        unpack(ensure_wheel(TRITON), dest, python_only=False, package="triton")
        (dest / ".complete").touch()
    return dest


def _chi2(tokens, p) -> tuple[float, float]:
    counts = torch.bincount(torch.tensor(tokens), minlength=len(p)).double()
    exp = torch.tensor(p, dtype=torch.float64) * len(tokens)
    return float(((counts - exp) ** 2 / exp).sum()), float(chi2.isf(1e-6, len(p) - 1))


def test_vllm_v2_verifier_keeps_p_with_remote_q_and_its_control_fails(unpacked):
    src = HERE.parents[1] / "src"
    path = os.pathsep.join([str(_triton_dir()), str(unpacked["cuda"]), str(src)])
    run = subprocess.run([sys.executable, str(HERE / "v2_interpret_run.py"), str(N_REMOTE),
                          str(N_CONTROL), str(N_INVALID)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""},
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    first, p = r["first"], r["p"]
    stat, thr = _chi2(first[:N_REMOTE], p)
    print(f"remote q: chi2 {stat:.1f} threshold {thr:.1f}")
    assert stat <= thr
    accepted = sum(n == 2 for n in r["num"][:N_REMOTE]) / N_REMOTE
    assert 0.05 < accepted < 1.0  # drafts were really verified, not all rejected
    stat_c, _ = _chi2(first[N_REMOTE : N_REMOTE + N_CONTROL], p)
    print(f"control (no factor T): chi2 {stat_c:.1f} threshold {thr:.1f}")
    assert stat_c > thr
    assert all(n == 1 for n in r["num"][N_REMOTE + N_CONTROL :])
