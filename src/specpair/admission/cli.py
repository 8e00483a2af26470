"""`specpair admission`: gates that must pass before a measurement; a failure is a STOP.

Exit codes: 0 QUALIFIED / passed, 1 NOT QUALIFIED / failed (STOP). Unreadable
or malformed input is refused: NOT QUALIFIED, exit 1, with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from specpair.admission.evidence import MalformedEvidence, parse_evidence
from specpair.admission.kl_probe import KL_MAX, LOG_RATIO_MAX, KlVerdict, kl_probe
from specpair.admission.tie_gate import CEILING_NATS, MAX_DIVERGENT, REGISTRATION, judge
from specpair.files import FileRefused, read_small, require_regular
from specpair.sampling import SamplingParams

__all__ = ["add_parser", "load_kl_input"]

MAX_INPUT_BYTES = 64 << 20  # the largest evidence JSON read


def add_parser(sub: Any) -> None:
    p = sub.add_parser("admission", help="admission gates (greedy near-tie, KL probe)",
                       description="Admission gates with JSON verdicts. Every failure is a "
                                   "STOP before measurement (exit 1).")
    gates = p.add_subparsers(dest="gate", metavar="GATE", required=True)
    t = gates.add_parser(
        "tie-gate", help=f"greedy near-tie gate, registration {REGISTRATION}",
        description=f"Greedy near-tie gate {REGISTRATION} (PP4 Round 12): top-20 evidence "
                    "for both compared tokens, experiment token at the top, smallest positive "
                    "top-20 gap a power of two <= 1, every gap an integer multiple within FP32 "
                    f"subtraction error, at most one step, margin <= {CEILING_NATS} nats, equal "
                    f"token lengths, at most {MAX_DIVERGENT} divergent prompts. Input format: "
                    "docs/health.md.")
    t.add_argument("evidence", metavar="FILE", help="the window's evidence JSON")
    t.add_argument("--json", action="store_true", help="print the verdict as JSON")
    t.set_defaults(func=_tie_gate)
    k = gates.add_parser(
        "kl-probe", help="shipped q vs q recomputed from the same logits and params",
        description=f"KL probe: per row KL(q_recomputed || q_shipped) <= {KL_MAX:g} and max "
                    f"|log ratio| <= {LOG_RATIO_MAX:g}. Input: a safetensors file (format in "
                    "docs/health.md).")
    k.add_argument("probe", metavar="FILE", help="safetensors file of logits, params and q")
    k.add_argument("--json", action="store_true", help="print the verdict as JSON")
    k.set_defaults(func=_kl_probe)


def _refused(gate: str, reason: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"gate": gate, "verdict": "NOT QUALIFIED", "stop": True,
                          "reasons": [reason]}, indent=1))
    else:
        print(f"{gate}: NOT QUALIFIED (STOP)\n  {reason}")
    return 1


def _tie_gate(args: argparse.Namespace) -> int:
    try:
        data = json.loads(read_small(args.evidence, MAX_INPUT_BYTES, "evidence file"))
        verdict = judge(parse_evidence(data))
    except (FileRefused, ValueError, MalformedEvidence) as e:  # ValueError: JSON, UTF-8
        return _refused(REGISTRATION, f"malformed evidence refused: {e}", args.json)
    if args.json:
        out = dataclasses.asdict(verdict)
        out.update(verdict=verdict.verdict, stop=not verdict.qualified,
                   ceiling_nats=CEILING_NATS, max_divergent_prompts=MAX_DIVERGENT)
        print(json.dumps(out, indent=1))
    else:
        print(f"{REGISTRATION}: {verdict.verdict}{'' if verdict.qualified else ' (STOP)'}")
        for p in verdict.prompts:
            if p.divergent and p.step is not None:
                print(f"  prompt {p.prompt}: step {p.step}, experiment-to-top gap "
                      f"{p.experiment_to_top_gap}, margin {p.margin_nats} nats "
                      f"({p.margin_steps} steps), max residual/tolerance "
                      f"{p.max_residual_over_tolerance}")
        for r in verdict.reasons:
            print(f"  {r}")
    return 0 if verdict.qualified else 1


def load_kl_input(path: str) -> tuple[Any, SamplingParams, Any, Any, int]:
    """(logits, params, q_logp, q_ids or None, draft_top_k) from a probe file."""
    require_regular(path, "probe file")  # a FIFO would block safetensors' open
    with safe_open(path, framework="pt") as f:
        names = set(f.keys())
        need = {"logits", "temperature", "top_k", "top_p", "q_logp"}
        if not need <= names or not names <= need | {"q_ids"}:
            raise ValueError(f"{path}: tensors {sorted(names)}; need {sorted(need)} "
                             "(+ optional q_ids)")
        t = {n: f.get_tensor(n) for n in names}
        meta = f.metadata() or {}
    n = t["logits"].shape[0]
    params = SamplingParams(t["temperature"].float(), t["top_k"].long(), t["top_p"].float(),
                            torch.zeros(n, dtype=torch.int64))
    return (t["logits"], params, t["q_logp"].float(), t.get("q_ids"),
            int(meta.get("draft_top_k", "0")))


def _finite_json(x: Any) -> Any:
    """JSON has no infinities: write them as the strings "inf" / "-inf"."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite_json(v) for v in x]
    return x


def _kl_probe(args: argparse.Namespace) -> int:
    gate = "kl-probe"
    try:
        logits, params, q_logp, q_ids, dtk = load_kl_input(args.probe)
        v: KlVerdict = kl_probe(logits, params, q_logp, q_ids, dtk)
    except (OSError, ValueError, AssertionError, RuntimeError, SafetensorError,
            FileRefused) as e:
        return _refused(gate, f"malformed probe input refused: {e}", args.json)
    if args.json:
        out = dataclasses.asdict(v)
        out.update(gate=gate, verdict="QUALIFIED" if v.passed else "NOT QUALIFIED",
                   stop=not v.passed)
        print(json.dumps(_finite_json(out), indent=1))
    else:
        print(f"{gate}: {'QUALIFIED' if v.passed else 'NOT QUALIFIED (STOP)'}: {len(v.rows)} "
              f"rows, worst KL {v.worst_kl:.3g} (max {v.kl_max:g}), worst max |log ratio| "
              f"{v.worst_log_ratio:.3g} (max {v.log_ratio_max:g})")
        for r in v.reasons[:20]:
            print(f"  {r}")
    return 0 if v.passed else 1

