"""`python -m specpair.deploy.health_probe ARGS` = `specpair health ARGS`, loading only the
health group: the `specpair` entry point imports every command group for `--help` (torch,
transformers, vLLM glue), ~10 s per call on a busy 2-core box, which the playbooks pay once per
host per run. The parser, the probe and the exit codes are `specpair health`'s own
(specpair.cli.main builds only the named command's group).
"""

from __future__ import annotations

import sys

from specpair.cli import main as _main


def main(argv: list[str] | None = None) -> int:
    return _main(["health", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
