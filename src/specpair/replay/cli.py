"""`specpair replay FILE`: accepted drafts per round, greedy vs sampled drafting.

Exit codes: 0 done, 4 bad input (file or arguments; ranges in docs/cli.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from specpair.cli import one_line
from specpair.errors import EXIT_BAD_INPUT, BadInput, BadSamplingParams
from specpair.replay.compute import MAX_BOOTSTRAP, MAX_TRIALS, Comparison, ReplayResult, replay
from specpair.replay.format import ReplayFormatError, load_recording, save_recording
from specpair.sampling import check_params_domain

# Ranges of the numeric arguments (docs/cli.md); the recording's own limits are compute's.
_RANGES = {"depth": (1, 64),  # 64: with --from-models; else the recording's depth bounds it
           "bootstrap": (100, MAX_BOOTSTRAP), "seed": (0, 2**32 - 1),
           "monte_carlo": (0, MAX_TRIALS), "prompts": (1, 4096), "tokens": (1, 8192)}

__all__ = ["add_parser", "format_table"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "replay", help="offline replay: greedy vs sampled drafting on recorded distributions",
        description="From recorded per-round target/draft logits (docs/replay-format.md), the "
                    "accepted drafts and committed tokens per round at a fixed depth for greedy "
                    "drafting (p(argmax q)) vs sampled drafting (sum min(p, q)), with seeded "
                    "bootstrap 95% intervals on the difference. Exit 0, or 4 on bad input.")
    p.add_argument("recording", metavar="FILE", help="replay file (safetensors)")
    p.add_argument("--depth", type=int, help="draft depth K (default: the recorded depth)")
    p.add_argument("--bootstrap", type=int, default=10_000, metavar="N",
                   help="bootstrap resamples over rounds (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap / Monte Carlo seed")
    p.add_argument("--monte-carlo", type=int, default=0, metavar="TRIALS",
                   help="instead of the exact expectations, run the core's propose/verify "
                        "TRIALS times per round")
    p.add_argument("--plot", metavar="PNG", help="write acceptance by position to this PNG")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    rec = p.add_argument_group(
        "recording", "write FILE first from a local model pair (teacher-forced on sequences "
                     "sampled from the target), then replay it")
    rec.add_argument("--from-models", nargs=2, metavar=("TARGET_DIR", "DRAFT_DIR"),
                     help="HF causal-LM directories sharing a vocabulary")
    rec.add_argument("--prompts", type=int, default=16, help="sequences (default %(default)s)")
    rec.add_argument("--tokens", type=int, default=64,
                     help="tokens sampled per sequence (default %(default)s)")
    rec.add_argument("--temperature", type=float, default=1.0, help="default %(default)s")
    rec.add_argument("--top-k", type=int, default=0, help="default %(default)s (none)")
    rec.add_argument("--top-p", type=float, default=1.0, help="default %(default)s (none)")
    p.set_defaults(func=run)


def _row(name: str, c: Comparison) -> str:
    return (f"{name:24} {c.greedy:8.3f} {c.sampled:8.3f}   {c.diff:+.3f} [{c.diff_ci[0]:+.3f}, "
            f"{c.diff_ci[1]:+.3f}]   {c.rel_pct:+.1f}% [{c.rel_ci_pct[0]:+.1f}%, "
            f"{c.rel_ci_pct[1]:+.1f}%]")


def format_table(r: ReplayResult, source: str) -> str:
    """The human-readable result."""
    how = "exact expectations" if r.method == "exact" else f"Monte Carlo, {r.trials} trials/round"
    lines = [
        f"replay of {source}: {r.rounds} rounds, depth {r.depth}, V={r.vocab}, "
        f"T={r.params['temperature']:g} top_k={r.params['top_k']} top_p={r.params['top_p']:g} "
        f"({how})",
        f"{'per round':24} {'greedy':>8} {'sampled':>8}   difference [95% bootstrap, "
        f"{r.bootstrap} resamples, seed {r.seed}]   relative",
        _row("accepted drafts", r.accepted),
        _row("committed tokens", r.committed),
        "",
        "by position (exact expectations in every mode):",
        f"{'position k':>10} {'P(acc) greedy':>14} {'P(acc) sampled':>15} {'a_k greedy':>11} "
        f"{'a_k sampled':>12}",
    ]
    for k in range(r.depth):
        lines.append(f"{k + 1:>10} {r.reach_greedy[k]:14.3f} {r.reach_sampled[k]:15.3f} "
                     f"{r.alpha_greedy[k]:11.3f} {r.alpha_sampled[k]:12.3f}")
    return "\n".join(lines)


def _record(args: argparse.Namespace) -> None:
    from specpair.replay.record import record_from_models

    if args.depth is None:
        raise ValueError("--from-models needs --depth K")
    rec = record_from_models(*args.from_models, prompts=args.prompts, tokens=args.tokens,
                             depth=args.depth, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, seed=args.seed)
    save_recording(args.recording, rec)
    print(f"recorded {rec.rounds} rounds of depth {rec.depth} to {args.recording}",
          file=sys.stderr)


def check_args(args: argparse.Namespace) -> None:
    """Refuse out-of-range arguments before anything is loaded (BadInput names the flag)."""
    for name, (lo, hi) in _RANGES.items():
        value = getattr(args, name)
        if name == "depth" and not args.from_models:
            hi = max(hi, value or 0)  # replay checks it against the recorded depth
        if value is not None and not lo <= value <= hi:
            raise BadInput(f"--{name.replace('_', '-')} must lie in {lo}..{hi}, got {value}")
    try:
        check_params_domain(args.temperature, args.top_k, args.top_p,
                            where="--temperature/--top-k/--top-p")
    except BadSamplingParams as e:
        raise BadInput(str(e)) from None
    if args.temperature == 0:
        raise BadInput("--temperature must be > 0 (greedy targets have no sampled acceptance "
                       "law)")
    for model in args.from_models or ():
        if not Path(model).is_dir():
            raise BadInput(f"--from-models {model}: not a directory")


def run(args: argparse.Namespace) -> int:
    try:
        check_args(args)
        if args.from_models:
            _record(args)
        rec = load_recording(args.recording)
        result = replay(rec, args.depth, args.bootstrap, args.seed, args.monte_carlo)
    except (ReplayFormatError, ValueError) as e:
        print(f"specpair replay: bad input: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.plot:
        from specpair.replay.plot import plot  # matplotlib only when a plot is asked for

        plot(result, args.plot, f"specpair replay: {args.recording}")
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=1))
    else:
        print(format_table(result, args.recording))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
