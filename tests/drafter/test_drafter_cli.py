"""`specpair drafter serve` refuses bad input with a clear message, before serving."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specpair.drafter import cli
from specpair.models.tiny import TinyPair


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["drafter", "serve", *argv])
    return args.func(args)


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.1:99999", ":7070", "host:port"])
def test_bad_listen_address(listen: str, tmp_path: Path, capsys) -> None:
    assert _run(["--model", str(tmp_path), "--key-file", "k", "--listen", listen]) == 2
    assert "--listen must be HOST:PORT" in capsys.readouterr().err


def test_short_or_missing_key_file(tiny_pair: TinyPair, tmp_path: Path, capsys) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    assert _run(["--model", str(tiny_pair.draft), "--key-file", str(short)]) == 2
    assert "at least 16 bytes" in capsys.readouterr().err
    assert _run(["--model", str(tiny_pair.draft), "--key-file", str(tmp_path / "nope")]) == 2
    assert "cannot read the key file" in capsys.readouterr().err


def test_model_directory_without_a_model(tmp_path: Path, capsys) -> None:
    key = tmp_path / "k"
    key.write_text("x" * 32)
    assert _run(["--model", str(tmp_path), "--key-file", str(key), "--listen",
                 "127.0.0.1:0"]) == 2
    assert "no tokenizer files" in capsys.readouterr().err
