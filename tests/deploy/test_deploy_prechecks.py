"""What `specpair deploy | rollback | restore | gates | release` refuse before Ansible starts,
in one line naming what is wrong, where Ansible's own failure said little: an unknown release
name (it said only "Unknown error", exit 1), a damaged release record on a host this machine
reaches locally (it surfaced Ansible's filter text), a garbage inventory file, and a release
config holding a date, binary data, a non-string key or NaN (a TypeError, or NaN hashed). No
Docker; the playbook is never started (run_playbook is replaced by a stub that fails the
test), except in the last test, which runs the real read of the release record and stops
there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from specpair.cli import main
from specpair.deploy import runner
from specpair.deploy.release import config_hash
from specpair.errors import EXIT_BAD_INPUT

ROOT = Path(__file__).resolve().parents[2]
ID = "sha256:" + "a" * 64
HOSTS = ("local-sparkhead", "local-sparkworker", "local-x86host")


def _release(name: str = "r1", **config) -> dict:
    return {"name": name, "profiles": {"target": "cpu", "drafter": "cpu"},
            "images": {"target": ID, "drafter": ID},
            "config": {"depth": 4, "drafter_mode": "sampled", **config}}


def _entry(name: str = "r1") -> dict:
    r = _release(name)
    return {**r, "config_hash": config_hash(r["config"])}


@pytest.fixture
def no_ansible(monkeypatch: pytest.MonkeyPatch) -> list:
    """run_playbook replaced: a call is recorded (and returns a failed run)."""
    calls: list = []

    def fake(playbook, inventory, extravars, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append((playbook, extravars))
        return runner.RunResult(playbook, "failed", 2, Path("/nonexistent"), {}, ["stub"], None,
                                0.0)

    monkeypatch.setattr(runner, "run_playbook", fake)
    return calls


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout with releases a and b (SPECPAIR_REPO), inventories/local copied."""
    root = tmp_path / "repo"
    (root / "playbooks").mkdir(parents=True)
    (root / "playbooks" / "deploy.yml").write_text("---\n")
    shutil.copytree(ROOT / "inventories" / "local", root / "inventories" / "local")
    (root / "releases").mkdir()
    for name in ("a", "b"):
        (root / "releases" / f"{name}.yml").write_text(yaml.safe_dump(_release(name)))
    monkeypatch.setenv("SPECPAIR_REPO", str(root))
    return root


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_an_unknown_release_name_is_refused_with_the_known_ones(repo, no_ansible, capsys):
    assert main(["deploy", "-i", "local", "--release", "nosuchname"]) == EXIT_BAD_INPUT
    err = _one_line(capsys)
    assert "unknown release 'nosuchname'" in err and "known releases: a, b" in err
    assert no_ansible == []


def test_no_release_files_yet_says_how_to_make_one(repo, no_ansible, capsys):
    for p in (repo / "releases").iterdir():
        p.unlink()
    assert main(["deploy", "-i", "local", "--release", "a"]) == EXIT_BAD_INPUT
    assert "known releases: none yet (make one: specpair release new)" in _one_line(capsys)


def test_a_known_release_name_reaches_the_playbook(repo, no_ansible, tmp_path):
    main(["deploy", "-i", "local", "--release", "b", "-e", f"specpair_state_root={tmp_path}"])
    assert [(p, e["release"]) for p, e in no_ansible] == [("deploy.yml", "b")]


def _state(tmp_path: Path, record: str | None, host: str = "local-sparkworker") -> Path:
    state = tmp_path / "state"
    for h in HOSTS:
        (state / h).mkdir(parents=True, exist_ok=True)
        (state / h / "release.json").write_text(json.dumps(
            {"schema": 1, "current": _entry("b"), "previous": _entry("a")}))
    if record is not None:
        (state / host / "release.json").write_text(record)
    return state


@pytest.mark.parametrize(("record", "what"), [
    ('{"current": nul', "not JSON"),
    ("\x00\xff garbage", "not JSON"),
    ("", "not JSON"),
    ("[1, 2]", "it must be a JSON object with current and previous"),
    ('{"current": null}', "it must be a JSON object with current and previous"),
    ('{"current": 5, "previous": null}', "current must be a release or null, got 5"),
    (json.dumps({"current": {**_entry("b"), "images": {"target": "latest"}}, "previous": None}),
     "current: images must map exactly"),
    (json.dumps({"current": {**_entry("b"), "config_hash": "0" * 64}, "previous": None}),
     "current.config_hash is '0000"),
])
@pytest.mark.parametrize("action", ["rollback", "restore", "gates", "deploy"])
def test_a_damaged_release_record_is_refused_with_its_path(repo, no_ansible, tmp_path, capsys,
                                                           record, what, action):
    state = _state(tmp_path, record)
    extra = ["--release", "a"] if action == "deploy" else []
    argv = [action, "-i", "local", *extra, "-e", f"specpair_state_root={state}"]
    assert main(argv) == EXIT_BAD_INPUT
    err = _one_line(capsys)
    assert f"release record {state}/local-sparkworker/release.json is damaged: {what}" in err
    assert "restore it from a backup, or remove it" in err
    assert no_ansible == []


def test_sound_or_absent_records_reach_the_playbook(repo, no_ansible, tmp_path):
    state = _state(tmp_path, None)
    (state / "local-x86host" / "release.json").unlink()  # nothing deployed there yet
    (state / "local-sparkhead" / "release.json").write_text(
        json.dumps({"schema": 1, "current": _entry("b"), "previous": None}))
    main(["rollback", "-i", "local", "-e", f"specpair_state_root={state}"])
    assert [p for p, _ in no_ansible] == ["rollback.yml"]


@pytest.mark.parametrize(("text", "what"), [
    ("\x00garbage", "not valid YAML"), ("[1, 2]\n", "must be a mapping, got list"),
    ("a: &a [*a]\n", "a recursive alias")])
def test_a_garbage_inventory_file_is_refused(repo, no_ansible, capsys, text, what):
    (repo / "inventories" / "local" / "group_vars" / "x86host.yml").write_text(text)
    assert main(["rollback", "-i", "local"]) == EXIT_BAD_INPUT
    assert what in _one_line(capsys)
    assert no_ansible == []


def _release_file(tmp_path: Path, config_yaml: str) -> Path:
    path = tmp_path / "r1.yml"
    path.write_text(yaml.safe_dump(_release(), sort_keys=False) + "".join(
        f"  {line}\n" for line in config_yaml.splitlines()))
    return path


@pytest.mark.parametrize(("config", "what"), [
    ("when: 2024-01-01", "config.when is a date (datetime.date(2024, 1, 1)); config values "
                         "must be strings, numbers, booleans, null, lists or mappings (quote it"),
    ("blob: !!binary aGVsbG8=", "config.blob is binary data"),
    ("1: one", "config has the key 1 (int); config keys must be strings"),
    ("x: .nan", "config.x is nan; config numbers must be finite"),
    ("x: {y: [1, -.inf]}", "config.x.y[1] is -inf; config numbers must be finite"),
])
@pytest.mark.parametrize("command", ["show", "deploy"])
def test_a_config_without_an_exact_json_form_is_refused_by_key_path(
        tmp_path, no_ansible, capsys, config, what, command):
    path = _release_file(tmp_path, config)
    argv = (["release", "show", str(path)] if command == "show"
            else ["deploy", "-i", "local", "--release", str(path)])
    assert main(argv) == EXIT_BAD_INPUT
    assert what in _one_line(capsys)
    assert no_ansible == []


def test_release_new_checks_the_config_before_asking_docker(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker: it must not be needed to refuse
    argv = ["release", "new", "r1", "--target", "t", "--drafter", "d", "--dir", str(tmp_path)]
    assert main([*argv, "--depth", "99"]) == EXIT_BAD_INPUT
    assert "config.depth must be an integer in 1..16, got 99" in _one_line(capsys)
    assert main([*argv, "--set", "x=.nan"]) == EXIT_BAD_INPUT
    assert "config.x is nan" in _one_line(capsys)
    assert main(argv) == 3  # a sound release, but no Docker engine to resolve images
    assert "no docker command on this host" in _one_line(capsys)


def test_the_playbook_itself_names_a_damaged_record(tmp_path, monkeypatch, capsys):
    """Hosts whose records the controller cannot read: the play's own read fails as cleanly
    (roles/specpair_release/tasks/read.yml), before anything moves, and the run's failures
    hold only that line (a real, short Ansible run: it stops at the read)."""
    from specpair.deploy import records

    monkeypatch.setattr(records, "check_local_records", lambda *a: None)  # as for a remote host
    state = _state(tmp_path, '{"current": nul', host="local-sparkhead")
    rc = main(["rollback", "-i", "local", "-e", f"specpair_state_root={state}", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["failures"] == [
        f"local-sparkhead: Fail on a release record that is not JSON: release record {state}/"
        "local-sparkhead/release.json on local-sparkhead is damaged: not JSON; restore it from "
        "a backup, or remove it to start with no recorded release"], out["failures"]
    assert out["stats"]["local-sparkworker"]["failures"] == 0


@pytest.mark.parametrize(("key", "value", "what"), [
    ("SPECPAIR_DEPTH_POLICY", "fastest",
     "SPECPAIR_DEPTH_POLICY='fastest': expected adaptive, off, fixed"),
    ("SPECPAIR_DEPTH_POLICY", "fixed:9", "depths must be integers in 0..4"),  # release depth 4
    ("SPECPAIR_DRAFT_DEADLINE_MS", "soon", "SPECPAIR_DRAFT_DEADLINE_MS='soon': expected ms"),
])
def test_a_bad_target_setting_in_the_inventory_is_refused(repo, no_ansible, capsys, key, value,
                                                          what):
    path = repo / "inventories" / "local" / "group_vars" / "sparkhead.yml"
    data = yaml.safe_load(path.read_text())
    data["specpair_service_env"][key] = value
    path.write_text(yaml.safe_dump(data))
    assert main(["deploy", "-i", "local", "--release", "a"]) == EXIT_BAD_INPUT
    err = _one_line(capsys)
    assert f"inventory file {path}: specpair_service_env: " in err
    assert what.replace("expected ms", "expected milliseconds") in err
    assert no_ansible == []
