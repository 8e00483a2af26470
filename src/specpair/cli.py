"""The `specpair` command line.

Each command group lives in its own module that exposes
``add_parser(subparsers)``; the parser it adds sets ``func`` (args -> exit code).
Add a group by mapping its command names to its module in ``_COMMANDS``. A call
naming a command imports only that command's module (some import torch,
transformers or Ansible); `specpair --help` imports them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specpair import __version__

_COMMANDS = {
    "models": "specpair.models.cli",  # models make-tiny
    "drafter": "specpair.drafter.cli",  # drafter serve
    "gate": "specpair.gates.cli",  # gate rng
    "health": "specpair.health.cli",  # health
    "admission": "specpair.admission.cli",  # admission tie-gate | kl-probe
    "replay": "specpair.replay.cli",  # replay
    "overlay": "specpair.overlay.cli",  # overlay apply | verify | status | manifest | unpack
    **dict.fromkeys(["deploy", "rollback", "restore", "gates", "release"], "specpair.deploy.cli"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or only for ``command``'s group."""
    parser = argparse.ArgumentParser(
        prog="specpair",
        description="Cross-machine sampled speculative decoding: exact core, probability "
        "wire, vLLM 0.32.0 overlay, gates, images and deployment.",
    )
    parser.add_argument("--version", action="version", version=f"specpair {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [_COMMANDS[command]] if command in _COMMANDS else dict.fromkeys(_COMMANDS.values())
    for name in modules:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
