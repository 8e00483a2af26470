"""YAML inputs under limits: an alias bomb in `specpair health --policy`
ran unbounded (3.8 GB after 60 s) and its error message's repr expanded it. Now every YAML
input goes through specpair.yamlio: the bomb is refused in well under a second with one line,
an oversized file is refused before it is parsed, and the shipped policy still loads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from specpair.cli import main
from specpair.errors import EXIT_BAD_INPUT
from specpair.health.errors import PolicyError
from specpair.health.policy import DEFAULT_POLICY, load_policy
from specpair.yamlio import MAX_ALIASES, MAX_BYTES, MAX_DEPTH, YamlRefused, excerpt, loads_yaml

SNAPSHOT = Path(__file__).parents[1] / "health" / "snapshots" / "fault_xid79.json"


def billion_laughs(levels: int = 9) -> str:
    """a0 holds nine strings, a_i nine aliases of a_{i-1}: 9^9 strings once expanded."""
    lines = ["version: 1", "roles: {}", "profiles:", '  a0: &a0 ["lol","lol","lol","lol","lol",'
             '"lol","lol","lol","lol"]']
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_billion_laughs_policy_refused_fast_with_one_line(tmp_path: Path, capsys) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(billion_laughs())
    t0 = time.monotonic()
    rc = main(["health", "--snapshot", str(SNAPSHOT), "--policy", str(bomb)])
    assert time.monotonic() - t0 < 1.0
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT
    assert err.count("\n") == 1 and "Traceback" not in err and len(err) < 400
    assert "more than 200000 nodes once aliases are expanded (line " in err


@pytest.mark.parametrize(("doc", "match"), [
    ("a: &a [*a]", "a recursive alias"),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH}"),
    ("a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]",
     f"more than {MAX_ALIASES} aliases"),
    ("a: [1, 2", "not valid YAML: while parsing a flow sequence expected ',' or ']'"),
    ("\x00\x01\x02", "not valid YAML: unacceptable character #x0000"),
    ("a: 1\n---\nb: 2", "expected a single document"),
    ("!!python/object/apply:os.system [true]", "could not determine a constructor"),
])
def test_refusals_name_what_and_where(doc: str, match: str) -> None:
    with pytest.raises(YamlRefused, match=match) as e:
        loads_yaml(doc, "test.yaml")
    assert str(e.value).startswith("test.yaml: ") and "\n" not in str(e.value)


def test_oversized_policy_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_BYTES + b"\n")
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=rf"is {MAX_BYTES + 3} bytes; at most {MAX_BYTES}"):
        load_policy(big)
    assert time.monotonic() - t0 < 1.0


def test_a_policy_that_is_not_a_regular_file_is_refused() -> None:
    with pytest.raises(PolicyError, match="/dev/zero is a character device"):
        load_policy("/dev/zero")


def test_the_shipped_policy_and_ordinary_aliases_still_load() -> None:
    policy = load_policy(DEFAULT_POLICY)
    assert policy.profiles and policy.roles
    assert loads_yaml("base: &b {x: 1}\nuse: {<<: *b, y: 2}", "t") == {
        "base": {"x": 1}, "use": {"x": 1, "y": 2}}


def test_error_messages_quote_bounded_excerpts(tmp_path: Path) -> None:
    raw = DEFAULT_POLICY.read_text().replace("gpu_count: ", "gpu_count: [" + "1, " * 50000 + "] #",
                                             1)
    bad = tmp_path / "p.yaml"
    bad.write_text(raw)
    with pytest.raises(PolicyError, match=r"gpu_count must be <class 'int'>, got \[1, 1, 1") as e:
        load_policy(bad)
    assert len(str(e.value)) < 300
    assert len(excerpt("x" * 10**6)) <= 80
