"""vLLM sampling gate: the environment's own vLLM + overlay, remote speculation vs target-only.

Runs the installed vLLM (inside the target image: the image's) on the tiny pair
(`specpair models make-tiny`, generated here), each run a subprocess of
``tests/vllm_checks/probe.py``, the drafter engine in-process
(SPECPAIR_DRAFTER=inproc:..., so no network is needed):

- greedy: token ids of a fixed prompt set identical to target-only vLLM;
- temperature 1: for generated-token indices 1..3 (decided by the first
  verification step, K=3) of N seeded requests, a two-sample chi-square
  homogeneity test against target-only (``vllm_checks.twosample``), threshold
  chi2.isf(1e-6 / 3, df): a correct stack fails with probability <= 1e-6;
  N = 600 (quick, `make test`) or 3000 (SPECPAIR_GATE_SIZE=full, `make gates`);
- acceptance materially above zero;
- must-fail control (CPU build): the same test on a private copy of this vLLM
  with the CPU expand fix (patch 0003) reversed fails.

Skips (with the reason) where vLLM or the overlay is not installed, unless
SPECPAIR_REQUIRE_OVERLAY=1 (the target image), where that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specpair.models.tiny import make_tiny
from specpair.overlay.manifest import load_manifest
from specpair.overlay.shadow_copy import shadow_copy
from specpair.overlay.status import status
from specpair.overlay.unified_diff import apply_file_patch, reverse
from vllm_checks.probe import PROBE, RESULT_MARK
from vllm_checks.twosample import per_index

FULL = os.environ.get("SPECPAIR_GATE_SIZE", "quick") == "full"
N = 3000 if FULL else 600
N_CONTROL = 300
ALPHA = 1e-6
INDICES = (1, 2, 3)
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26, 27]]



def _probe(tmp: Path, name: str, model: Path, env: dict, pythonpath: Path | None = None,
           **opts) -> dict:
    args = [sys.executable, PROBE, "--model", str(model)]
    for k, v in opts.items():
        args += [f"--{k.replace('_', '-')}", v if isinstance(v, str) else json.dumps(v)]
    env = {**os.environ, **env}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    with open(tmp / f"{name}.log", "w") as log:
        run = subprocess.run(args, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                             timeout=1200)
    lines = [x for x in run.stdout.splitlines() if x.startswith(RESULT_MARK)]
    assert run.returncode == 0 and lines, f"probe {name} failed; see {tmp / name}.log"
    return json.loads(lines[-1][len(RESULT_MARK):])


def _checks(a, b):
    return per_index(a, b, INDICES, ALPHA)


@pytest.mark.gate
@pytest.mark.slow
def test_remote_speculation_keeps_vllms_output_law(overlaid_site, tmp_path):
    site = overlaid_site
    pair = make_tiny(tmp_path / "tiny")
    # drafts every round: the law is tested where drafts meet the verifier; the adaptive
    # policy rightly stops drafting on the tiny pair (in the image: 9 drafts in all), and
    # a gate without drafts has no power (docs/performance.md, "Adaptive policy")
    remote = {"SPECPAIR_DRAFTER": f"inproc:{pair.draft}", "SPECPAIR_DEPTH_POLICY": "fixed"}
    common = dict(prompts=PROMPTS, greedy_tokens=16, samples=N, sample_tokens=4)
    spec = _probe(tmp_path, "spec", pair.target, remote, spec="remote", **common)
    ref = _probe(tmp_path, "ref", pair.target, {}, spec="none", seed_base=1_000_000,
                 **common)  # disjoint seeds: independent samples
    assert spec["greedy"] == ref["greedy"]
    checks = _checks(spec["samples"], ref["samples"])
    assert all(c.passed for c in checks), checks
    m = spec["spec_metrics"]
    assert m["vllm:spec_decode_num_accepted_tokens"] > 0.2 * m[
        "vllm:spec_decode_num_draft_tokens"]

    man = load_manifest()
    if status(site, man).variant != "cpu":
        return  # the control reproduces the CPU build's bug; CUDA builds never run that code
    control = shadow_copy(site, tmp_path / "control")
    (fp,) = next(s for s in man.series if s.patch_id == "0003").files
    target = control / fp.path
    text = apply_file_patch(target.read_text(), reverse(fp), "reverse 0003")
    target.unlink()
    target.write_text(text)
    bad = _probe(tmp_path, "control", pair.target, remote, pythonpath=control, spec="remote",
                 prompts=PROMPTS, samples=N_CONTROL, sample_tokens=4)
    assert str(control) in bad["vllm_file"]
    assert not all(c.passed for c in _checks(bad["samples"], ref["samples"][:N_CONTROL]))
