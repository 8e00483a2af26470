"""The `specpair` command line.

Each command group lives in its own module that exposes
``add_parser(subparsers)``; the parser it adds sets ``func`` (args -> exit code).
Add a group by mapping its command names to its module in ``_COMMANDS``. A call
naming a command imports only that command's module (some import torch,
transformers or Ansible); `specpair --help` imports them all.

Exit codes (docs/cli.md, specpair.errors): 0 ok, 1 a check failed, 2 warn / gate broken,
3 cannot run on this host, 4 bad input, 130 interrupted. Bad input never shows a traceback:
a usage error, a ``SpecpairError`` (its ``exit_code``) or an ``OSError`` reaching ``main``
becomes ONE line on stderr, ``specpair COMMAND: what was wrong``. Any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator

from specpair import __version__
from specpair.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, SpecpairError

__all__ = ["Parser", "build_parser", "leaf_parsers", "main", "one_line"]

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
_MAX_MESSAGE = 400  # characters of an error line; longer messages are cut with "..."


def one_line(text: object, limit: int = _MAX_MESSAGE) -> str:
    """``text`` on one line (whitespace runs collapsed), at most ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit 4 (bad input).

    Subparsers inherit the class, so every `specpair` command reports usage errors alike.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {one_line(message)} "
                                  f"(see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or only for ``command``'s group."""
    parser = Parser(
        prog="specpair",
        description="Cross-machine sampled speculative decoding: exact core, probability "
        "wire, vLLM 0.32.0 overlay, gates, images and deployment.",
        epilog="exit codes: 0 ok, 1 check failed, 2 warn or gate broken, 3 cannot run on this "
        "host, 4 bad input (docs/cli.md)",
    )
    parser.add_argument("--version", action="version", version=f"specpair {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = [_COMMANDS[command]] if command in _COMMANDS else dict.fromkeys(_COMMANDS.values())
    for name in modules:
        importlib.import_module(name).add_parser(sub)
    for path, leaf in leaf_parsers(parser):
        leaf.set_defaults(prog_=" ".join(["specpair", *path]))
    return parser


def leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                 ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable (sub)command under ``parser``: (command words, its parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) not in seen:  # aliases share one parser
                seen.add(id(child))
                yield from leaf_parsers(child, (*path, name))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)  # usage errors: one line, exit 4
    prog = getattr(args, "prog_", "specpair")
    try:
        return int(args.func(args) or 0)
    except SpecpairError as e:
        print(f"{prog}: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a file named on the command line: missing, unreadable, a directory
        print(f"{prog}: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
