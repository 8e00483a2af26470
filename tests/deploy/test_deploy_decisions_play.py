"""The decisions reach the real plays: real, short ansible-playbook runs on inventories/local
with no Docker engine needed (test_deploy_decisions.py tests the decisions themselves).

- A rollback through `specpair` (playbooks/rollback.yml, which finds
  playbooks/filter_plugins/ beside it) on records nobody can explain stops at recovery's
  refusal, before anything moves, with the refusal as its one failure.
- playbooks/tasks/recover.yml and tasks/summary.yml, imported by a small play beside the
  filter plugins, with the services off (no container to inspect): a kill during the commit
  phase is rolled forward and one during the move rolled back, each host's record written and
  the recovery line said; the summary's verdict comes from the same records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specpair.cli import main
from specpair.deploy.release import config_hash

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOSTS = ("local-sparkhead", "local-sparkworker", "local-x86host")
ID = "sha256:" + "a" * 64


def _release(name: str) -> dict:
    config = {"depth": 4, "drafter_mode": "sampled"}
    return {"name": name, "profiles": {"target": "cpu", "drafter": "cpu"},
            "images": {"target": ID, "drafter": ID}, "config": config,
            "config_hash": config_hash(config)}


S0, SA, SB, SC = (_release(n) for n in ("s0", "sa", "sb", "sc"))
OLD = {"schema": 1, "current": SA, "previous": S0}
NEW = {"schema": 1, "current": SB, "previous": SA}


def _state(tmp_path: Path, records: dict[str, dict], intent: dict | None = None) -> Path:
    state = tmp_path / "state"
    for host, record in records.items():
        (state / host).mkdir(parents=True)
        (state / host / "release.json").write_text(json.dumps(record))
    if intent is not None:
        (state / "intent.json").write_text(json.dumps(intent))
    return state


def _records(state: Path) -> dict[str, dict]:
    return {h: json.loads((state / h / "release.json").read_text()) for h in HOSTS}


def test_records_nobody_can_explain_stop_a_rollback_before_anything_moves(tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.setenv("SPECPAIR_LOCK_DIR", str(tmp_path / "locks"))
    records = {**dict.fromkeys(HOSTS, OLD), "local-sparkhead": {**OLD, "current": SC}}
    state = _state(tmp_path, records)
    rc = main(["rollback", "-i", "local", "-e", f"specpair_state_root={state}", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["failures"] == [
        "local-sparkhead: Refuse records that disagree with no way to tell which release the "
        "pair agreed on: the hosts' release records disagree and no unfinished move explains "
        "it: {'local-sparkhead': 'sc', 'local-sparkworker': 'sa', 'local-x86host': 'sa'}; copy "
        "the release.json of the host that records the release you want onto the others, then "
        "run restore"], out["failures"]
    assert _records(state) == records


PLAY = """---
- name: Recover, then summarise, as deploy.yml does
  hosts: pair
  gather_facts: false
  vars:
    specpair_deploy_intent_file: "{{{{ specpair_intent_file }}}}"
    specpair_deploy_source: file
    specpair_artifacts_dir: {artifacts}
  tasks:
    - name: Read the release record
      ansible.builtin.import_role:
        name: specpair_release
        tasks_from: read
    - name: Keep the release record as it was before the move
      ansible.builtin.set_fact:
        specpair_deploy_record_before: "{{{{ specpair_release_record }}}}"
    - name: Finish an interrupted move
      ansible.builtin.import_tasks: {root}/playbooks/tasks/recover.yml
    - name: Summarise
      ansible.builtin.import_tasks: {root}/playbooks/tasks/summary.yml
"""


@pytest.mark.parametrize(("phase", "forward"), [("commit", True), ("moving", False)])
def test_recover_and_summary_decide_through_the_filters(tmp_path, phase, forward):
    """A kill after the first record write (sparkhead records sb, the others sa): forward to
    sb when the intent says commit, back to sa when it says moving. No service runs (no
    image ID to compare either): every host counts as running sb, and the summary finds one
    release recorded but no host running it."""
    intent = {"schema": 1, "run": "20261201T134501Z-deploy-4242", "action": "deploy",
              "phase": phase, "since": "2026-12-01T13:45:01Z", "before": OLD, "to": SB}
    state = _state(tmp_path, {**dict.fromkeys(HOSTS, OLD), "local-sparkhead": NEW}, intent)
    play = tmp_path / "play"
    play.mkdir()
    (play / "filter_plugins").symlink_to(ROOT / "playbooks" / "filter_plugins")
    artifacts = tmp_path / "artifacts"
    (play / "recover.yml").write_text(PLAY.format(root=ROOT, artifacts=artifacts))
    off = json.dumps({"specpair_state_root": str(state), "specpair_service_enabled": False,
                      "specpair_image_key": ""})
    run = subprocess.run([str(BIN / "ansible-playbook"), "-i", "inventories/local", "-e", off,
                          str(play / "recover.yml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=False,
                         env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                              "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    want = {"schema": 1, "current": SB, "previous": SA} if forward else OLD
    assert _records(state) == dict.fromkeys(HOSTS, want)
    summary = json.loads((artifacts / "summary.json").read_text())
    done = ("rolled FORWARD to sb on every host: its records were being committed and every "
            "host runs it healthy" if forward
            else "rolled BACK to sa on every host: its records were not being committed yet")
    assert summary["recovery"] == ("found an unfinished deploy (run 20261201T134501Z-deploy-4242"
                                   f", phase {phase}) of release sb from sa: {done}")
    assert summary["checks"]["one_release_recorded"] is True
    assert summary["checks"]["every_host_runs_its_record"] is False
    assert summary["pair_consistent"] is False
    assert summary["recorded_release"] == ["sb" if forward else "sa"]
    assert all(h["matches_record"] is False for h in summary["hosts"].values())
