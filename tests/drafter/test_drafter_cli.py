"""`specpair drafter serve` refuses bad input with a clear message, before serving."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specpair.drafter import cli
from specpair.errors import EXIT_BAD_INPUT
from specpair.models.tiny import TinyPair


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["drafter", "serve", *argv])
    return args.func(args)


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.1:99999", ":7070", "host:port"])
def test_bad_listen_address(listen: str, tmp_path: Path, capsys) -> None:
    assert _run(["--model", str(tmp_path), "--key-file", "k", "--listen", listen]) == EXIT_BAD_INPUT
    assert "--listen must be HOST:PORT" in capsys.readouterr().err


def test_short_or_missing_key_file(tiny_pair: TinyPair, tmp_path: Path, capsys) -> None:
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    short.chmod(0o600)
    assert _run(["--model", str(tiny_pair.draft), "--key-file", str(short)]) == EXIT_BAD_INPUT
    assert "at least 16 bytes" in capsys.readouterr().err
    missing = str(tmp_path / "nope")
    assert _run(["--model", str(tiny_pair.draft), "--key-file", missing]) == EXIT_BAD_INPUT
    assert "cannot read the key file" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [
    ("--metrics-port", "-1"), ("--metrics-port", "65536"), ("--draft-top-k", "-1"),
    ("--draft-top-k", str(2**70)), ("--max-depth", "0"), ("--max-depth", "33"),
    ("--threads", "-1"), ("--threads", str(2**70)), ("--max-requests", "0"),
    ("--max-requests", str(2**70)), ("--max-requests-per-connection", "0"),
    ("--max-history", "0"), ("--max-frame-mib", "257"), ("--chunk-items", "0"),
    ("--chunk-items", "1025"), ("--chunk-tokens", "0"), ("--idle-timeout-s", "0"),
    ("--idle-timeout-s", "nan"), ("--frame-timeout-s", "inf"), ("--frame-timeout-s", "-1")])
def test_out_of_range_numbers_refused_before_the_model_loads(flag: str, value: str,
                                                             tmp_path: Path, capsys) -> None:
    key = tmp_path / "k"
    key.write_text("x" * 32)
    key.chmod(0o600)
    assert _run(["--model", str(tmp_path), "--key-file", str(key), flag, value]) == EXIT_BAD_INPUT
    assert f"{flag} must lie in" in capsys.readouterr().err


@pytest.mark.parametrize(("cpus", "message"), [
    ("a", "--cpus must be a comma-separated list of CPU numbers, got 'a'"),
    ("0,,1", "--cpus must be a comma-separated list"), ("-1", "--cpus must be a comma"),
    ("99999", "--cpus 99999: CPU 99999 is not one this process may run on")])
def test_cpus_outside_the_processes_own_are_refused_before_the_model_loads(
        cpus: str, message: str, tmp_path: Path, capsys) -> None:
    key = tmp_path / "k"
    key.write_text("x" * 32)
    key.chmod(0o600)
    assert _run(["--model", str(tmp_path), "--key-file", str(key), "--cpus", cpus]) \
        == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_model_directory_without_a_model(tmp_path: Path, capsys) -> None:
    key = tmp_path / "k"
    key.write_text("x" * 32)
    key.chmod(0o600)
    assert _run(["--model", str(tmp_path), "--key-file", str(key), "--listen",
                 "127.0.0.1:0"]) == EXIT_BAD_INPUT
    assert "no tokenizer files" in capsys.readouterr().err
