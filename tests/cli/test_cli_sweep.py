"""The CLI sweep: every `specpair` subcommand, found by walking the parser
tree from specpair.cli.build_parser, given missing, malformed and out-of-range input, exits with
its documented code (docs/cli.md) and at most one line on stderr, never a traceback.

Per subcommand: no arguments at all (when it has required ones), an unknown flag, an invalid
choice for each choices option, for each numeric option "garbage", -1, 2**70, nan, inf and
1e308 (every numeric option of specpair has a bounded range, and the error names it), and for
each input file a missing path, an empty file, garbage bytes, a file of the wrong JSON/YAML
type, a directory and /dev/zero. SPECS says how to call each subcommand; a new subcommand
fails test_every_subcommand_is_swept until it has an entry.

Commands run in-process (specpair.cli.main) with capsys; no case may reach Ansible, Docker or
a model load (stubs fail the test), and the few subprocess runs at the end prove the same
end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specpair.cli import build_parser, leaf_parsers, main
from specpair.errors import EXIT_BAD_INPUT, EXIT_CANNOT_RUN, EXIT_FAILED
from specpair.overlay.cli import EXIT_BAD_OVERLAY
from specpair.replay.format import FORMAT

SNAPSHOT = Path(__file__).parents[1] / "health" / "snapshots" / "fault_xid79.json"
NUMBERS = ["garbage", "-1", str(2**70), "nan", "inf", "1e308"]
BAD = EXIT_BAD_INPUT


@dataclass(frozen=True)
class FileArg:
    """An input file argument: what it holds, and the code a bad one gets."""

    kind: str  # json | yaml | safetensors | key | dir | inventory | outdir
    code: int = BAD  # exit code for a bad file (admission: NOT QUALIFIED, 1)
    base: tuple[str, ...] | None = None  # argv for this file's cases instead of Spec.base


@dataclass(frozen=True)
class Spec:
    """How to call one subcommand: ``base`` is a call that reaches its checks ({name}s are the
    fixture's files); ``files`` maps a {placeholder} of base, or an option, to a FileArg."""

    base: tuple[str, ...]
    files: dict[str, FileArg] = field(default_factory=dict)
    extra: tuple[tuple[tuple[str, ...], int], ...] = ()  # more bad calls: (argv, code)


_DEPLOY = ("-i", "local", "-e", "specpair_state_root={state}")
_DEPLOY_EXTRA = ((("-i", "local", "-e", "oops"), BAD),
                 (("-i", "local", "-e", "k=[unclosed"), BAD),
                 (("-i", "local", "-e", "specpair_state_root={damaged_state}"), BAD))
SPECS: dict[tuple[str, ...], Spec] = {
    ("models", "make-tiny"): Spec(("--out", "{tmp}/never"), {"--out": FileArg("outdir")}),
    # --pinned is read by the full preset only (before any training); PINNED without its files
    # is "this host lacks what the command needs" (3)
    ("models", "train-pair"): Spec(
        ("--out", "{tmp}/never", "--preset", "smoke"),
        {"--out": FileArg("outdir"),
         "--pinned": FileArg("dir", code=EXIT_CANNOT_RUN, base=("--out", "{tmp}/never"))},
        ((("--out", "{tmp}/never", "--preset", "smoke", "--check"), BAD),)),
    ("drafter", "serve"): Spec(
        ("--model", "{model}", "--key-file", "{key}", "--listen", "127.0.0.1:0"),
        {"--key-file": FileArg("key"), "--model": FileArg("dir")},
        ((("--model", "{model}", "--key-file", "{key}", "--listen", "127.0.0.1:99999"), BAD),
         (("--model", "{model}", "--key-file", "{key}", "--listen", "nocolon"), BAD))),
    ("gate", "rng"): Spec((), extra=((("--config", "no-such-config"), BAD),)),
    ("health",): Spec(
        ("--snapshot", "{snapshot}", "--watch", "0"),
        {"--policy": FileArg("yaml"), "--snapshot": FileArg("json"),
         "--input": FileArg("json", base=("--qualify", "drafter-pair", "--watch", "0")),
         "--inventory": FileArg("inventory", base=())},
        ((("--snapshot", "{snapshot}", "--input", "{snapshot}"), BAD),
         (("--snapshot", "{snapshot}", "--role", "no-such-role"), BAD))),
    ("admission", "tie-gate"): Spec(("{evidence}",), {"{evidence}": FileArg("json", EXIT_FAILED)}),
    ("admission", "kl-probe"): Spec(("{probe}",), {"{probe}": FileArg("safetensors", EXIT_FAILED)}),
    ("replay",): Spec(
        ("{recording}",), {"{recording}": FileArg("safetensors")},
        ((("{tmp}/out.safetensors", "--from-models", "{tmp}/nope", "{tmp}/nope", "--depth", "2"),
          BAD),)),
    ("overlay", "apply"): Spec(("--site-packages", "{tmp}/site"),
                               {"--site-packages": FileArg("dir"),
                                "--overlay": FileArg("dir", EXIT_BAD_OVERLAY)}),
    ("overlay", "verify"): Spec(("--site-packages", "{tmp}/site"),
                                {"--site-packages": FileArg("dir"),
                                 "--overlay": FileArg("dir", EXIT_BAD_OVERLAY)}),
    ("overlay", "status"): Spec(("--site-packages", "{tmp}/site"),
                                {"--site-packages": FileArg("dir"),
                                 "--overlay": FileArg("dir", EXIT_BAD_OVERLAY)}),
    # Never with the default --overlay: it would rewrite overlays/vllm/0.32.0/manifest.json.
    ("overlay", "manifest"): Spec(("--overlay", "{tmp}/no-overlay"), {"--overlay": FileArg("dir")}),
    ("overlay", "unpack"): Spec(("--variant", "no-such-variant", "--dest", "{tmp}/unpacked"),
                                extra=((("--variant", "no-such-variant", "--dest", "{tmp}/u"),
                                        BAD),)),
    ("deploy",): Spec((*_DEPLOY, "--release", "{release}"),
                      {"--inventory": FileArg("inventory"), "{release}": FileArg("yaml")},
                      ((("-i", "local", "--release", "nosuchname"), BAD),
                       (("-i", "local", "--release", "{date_release}"), BAD),
                       *(((*argv, "--release", "{release}"), code)
                         for argv, code in _DEPLOY_EXTRA))),
    ("rollback",): Spec(_DEPLOY, {"--inventory": FileArg("inventory")}, _DEPLOY_EXTRA),
    ("restore",): Spec(_DEPLOY, {"--inventory": FileArg("inventory")}, _DEPLOY_EXTRA),
    ("gates",): Spec(_DEPLOY, {"--inventory": FileArg("inventory")}, _DEPLOY_EXTRA),
    ("release", "new"): Spec(
        ("r1", "--target", "t", "--drafter", "d", "--dir", "{tmp}/releases"),
        extra=((("Bad Name", "--target", "t", "--drafter", "d"), BAD),
               (("r1", "--target", "t", "--drafter", "d", "--set", "x=.nan"), BAD),
               (("r1", "--target", "t", "--drafter", "d", "--set", "when=2024-01-01"), BAD),
               (("r1", "--target", "t", "--drafter", "d", "--set", "oops"), BAD))),
    ("release", "show"): Spec(("{release}",), {"{release}": FileArg("yaml")},
                              ((("{date_release}",), BAD),)),
}

ID = "sha256:" + "a" * 64
RELEASE = {"name": "r1", "profiles": {"target": "cpu", "drafter": "cpu"},
           "images": {"target": ID, "drafter": ID},
           "config": {"depth": 4, "drafter_mode": "sampled"}}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The {placeholders} of SPECS, and one bad file of each sort."""
    d = tmp_path_factory.mktemp("sweep")
    (d / "model").mkdir()
    key = d / "wire.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    t = torch.randn(4, 3, 8)
    save_file({"target_logits": t, "draft_logits": t[:, :2].contiguous()},
              str(d / "rec.safetensors"),
              metadata={"format": FORMAT, "temperature": "1.0", "top_k": "0", "top_p": "1.0"})
    (d / "evidence.json").write_text("{}")
    save_file({"logits": torch.zeros(1, 4)}, str(d / "probe.safetensors"))
    rel = d / "rel"
    rel.mkdir()
    (rel / "r1.yml").write_text(json.dumps(RELEASE))
    dated = d / "dated"
    dated.mkdir()
    (dated / "r1.yml").write_text(json.dumps(RELEASE)[:-2] + ', "when": 2024-01-01}}')
    (d / "state").mkdir()
    (d / "damaged" / "local-x86host").mkdir(parents=True)
    (d / "damaged" / "local-x86host" / "release.json").write_text('{"current": nul')
    bad = d / "bad"
    bad.mkdir()
    (bad / "empty.yml").write_bytes(b"")
    (bad / "garbage.yml").write_bytes(b"\x00\xff\x89PNG garbage \x01")
    (bad / "list.yml").write_text("[1, 2]\n")
    (bad / "bomb.yml").write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True)))
    (bad / "emptydir").mkdir()
    (bad / "open.key").write_text("k" * 32)  # mode 0644: others may read it
    return {"tmp": str(d), "model": str(d / "model"), "key": str(key),
            "snapshot": str(SNAPSHOT), "recording": str(d / "rec.safetensors"),
            "evidence": str(d / "evidence.json"), "probe": str(d / "probe.safetensors"),
            "release": str(rel / "r1.yml"), "date_release": str(dated / "r1.yml"),
            "state": str(d / "state"), "damaged_state": str(d / "damaged"), "bad": str(bad)}


def bad_files(kind: str, bad: str) -> list[str]:
    """Paths of bad inputs for an argument of this kind."""
    b = Path(bad)
    common = [str(b / "missing.yml"), str(b / "empty.yml"), str(b / "garbage.yml")]
    return {
        "json": [*common, str(b / "list.yml"), str(b / "emptydir"), "/dev/zero"],
        "yaml": [*common, str(b / "list.yml"), str(b / "emptydir"), "/dev/zero",
                 str(b / "bomb.yml")],
        "safetensors": [*common, str(b / "list.yml"), str(b / "emptydir"), "/dev/zero"],
        "key": [str(b / "missing.key"), str(b / "empty.yml"), str(b / "open.key"),
                str(b / "emptydir"), "/dev/zero"],
        "dir": [str(b / "missing"), str(b / "garbage.yml"), str(b / "emptydir")],
        "inventory": ["no-such-inventory", *common[1:], str(b / "list.yml"), str(b / "emptydir"),
                      str(b / "bomb.yml")],
        "outdir": [str(b / "garbage.yml")],
    }[kind]


@pytest.fixture(autouse=True)
def nothing_heavy_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ansible, Docker and the gate must never be reached by a bad call."""
    from specpair.deploy import cli as deploy_cli
    from specpair.deploy import runner
    from specpair.gates import cli as gates_cli

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("a bad call reached work it should have been refused before")

    monkeypatch.setattr(runner, "run_playbook", refuse)
    monkeypatch.setattr(deploy_cli, "resolve_image", refuse)
    monkeypatch.setattr(gates_cli, "run_gate", refuse)


def _fill(argv: tuple[str, ...], files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in argv]


def run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse: usage errors, --help
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def check(argv: list[str], code: int, capsys: pytest.CaptureFixture, names: str = "") -> None:
    """Exit ``code``, no traceback, at most one line on stderr (one exactly unless admission,
    whose refusal is its NOT QUALIFIED report on stdout), naming ``names`` if given."""
    rc, out, err = run(argv, capsys)
    where = f"specpair {' '.join(argv)}"
    assert "Traceback" not in err + out, f"{where}: {err}"
    assert rc == code, f"{where}: exit {rc}, want {code}; stderr {err!r}"
    lines = err.splitlines()
    if argv[:1] == ["admission"] and code == EXIT_FAILED:
        assert not lines and "NOT QUALIFIED" in out, f"{where}: {err!r} {out!r}"
    else:
        assert len(lines) == 1 and len(lines[0]) <= 500, f"{where}: stderr {err!r}"
    if names:
        text = (err + out).replace("_", "-")
        assert names.lstrip("-") in text, f"{where}: stderr does not name {names}: {err!r}"


def test_every_subcommand_is_swept(parser) -> None:
    assert {path for path, _ in leaf_parsers(parser)} == set(SPECS)


@pytest.mark.parametrize("argv", [[], ["no-such-command"], ["gate"], ["overlay"],
                                  ["--no-such-flag"]])
def test_the_top_level(argv, capsys) -> None:
    check(argv, BAD, capsys)


def _leaf(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    return dict(leaf_parsers(parser))[path]


def _options(leaf: argparse.ArgumentParser, want: str) -> list[argparse.Action]:
    acts = [a for a in leaf._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]
    if want == "numeric":
        return [a for a in acts if a.type in (int, float)]
    return [a for a in acts if a.choices]


@pytest.mark.parametrize("path", list(SPECS), ids=" ".join)
def test_missing_arguments_and_unknown_flags(path, parser, files, capsys) -> None:
    leaf = _leaf(parser, path)
    required = [a for a in leaf._actions if a.required]
    if required:
        check(list(path), BAD, capsys, names="required")
        for a in (a for a in required if a.option_strings):  # each left out on its own
            argv = _fill(SPECS[path].base, files)
            i = next(i for i, x in enumerate(argv) if x in a.option_strings)
            check([*path, *argv[:i], *argv[i + 2:]], BAD, capsys, names="required")
    check([*path, *_fill(SPECS[path].base, files), "--no-such-flag"], BAD, capsys)


@pytest.mark.parametrize("path", list(SPECS), ids=" ".join)
def test_invalid_choices_and_out_of_range_numbers(path, parser, files, capsys) -> None:
    leaf = _leaf(parser, path)
    base = _fill(SPECS[path].base, files)
    for a in _options(leaf, "choices"):
        check([*path, *base, a.option_strings[0], "no-such-choice"], BAD, capsys,
              names="invalid choice")
    for a in _options(leaf, "numeric"):
        for value in NUMBERS:  # int options: nan, inf, 1e308 are argparse's own refusal
            check([*path, *base, a.option_strings[0], value], BAD, capsys,
                  names=a.option_strings[0])


@pytest.mark.parametrize("path", [p for p, s in SPECS.items() if s.files], ids=" ".join)
def test_bad_input_files(path, files, capsys) -> None:
    spec = SPECS[path]
    for arg, f in spec.files.items():
        base = _fill(spec.base if f.base is None else f.base, files)
        for bad in bad_files(f.kind, files["bad"]):
            if arg.startswith("{"):
                argv = [bad if x == arg.format(**files) else x for x in base]
            elif arg in base:
                i = base.index(arg)
                argv = [*base[:i + 1], bad, *base[i + 2:]]
            else:
                argv = [*base, arg, bad]
            check([*path, *argv], f.code, capsys)


@pytest.mark.parametrize("path", [p for p, s in SPECS.items() if s.extra], ids=" ".join)
def test_further_bad_calls(path, files, capsys) -> None:
    for argv, code in SPECS[path].extra:
        check([*path, *_fill(argv, files)], code, capsys)


@pytest.mark.parametrize("argv", [
    ["replay", "{recording}", "--top-k", str(2**70)],
    ["drafter", "serve", "--model", "{model}", "--key-file", "/dev/zero"],
    ["deploy", "-i", "local", "--release", "nosuchname"],
    ["health", "--snapshot", "{snapshot}", "--policy", "{bad}/bomb.yml"],
])
def test_end_to_end_one_line_and_no_traceback(argv, files) -> None:
    """The same through `python -m specpair`, a fresh interpreter each."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "specpair", *_fill(tuple(argv), files)],
                         capture_output=True, text=True, timeout=120, env=env,
                         stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == BAD, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
