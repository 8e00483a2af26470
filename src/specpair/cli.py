"""The `specpair` command line.

Each command group lives in its own module that exposes
``add_parser(subparsers)``; the parser it adds sets ``func`` (args -> exit code).
Add a group by appending its module to ``_GROUPS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specpair import __version__

_GROUPS = [
    "specpair.models.cli",  # models make-tiny
    "specpair.drafter.cli",  # drafter serve
    "specpair.gates.cli",  # gate rng
    "specpair.health.cli",  # health
    "specpair.admission.cli",  # admission tie-gate | kl-probe
    "specpair.replay.cli",  # replay
    "specpair.vllm.cli",  # overlay apply | verify | status | manifest | unpack
    "specpair.deploy.cli",  # deploy | rollback | restore | gates | release
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specpair",
        description="Cross-machine sampled speculative decoding: exact core, probability "
        "wire, vLLM 0.32.0 overlay, gates, images and deployment.",
    )
    parser.add_argument("--version", action="version", version=f"specpair {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _GROUPS:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
