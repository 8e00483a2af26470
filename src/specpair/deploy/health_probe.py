"""`python -m specpair.deploy.health_probe ARGS` = `specpair health ARGS`, loading only the
health group: the `specpair` entry point imports every command group (torch, transformers,
vLLM glue), ~10 s per call on a busy 2-core box, which the playbooks pay once per host per run.
The parser, the probe and the exit codes are specpair.health.cli's own.
"""

from __future__ import annotations

import argparse
import sys

from specpair.health.cli import add_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specpair")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["health", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
