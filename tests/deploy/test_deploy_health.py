"""`specpair health --inventory INV --json` carries each host's verdict and findings (a machine
reading it once got summary: null): from a stubbed run's health.json, and from a real
ansible-runner run of playbooks/health.yml on inventories/local (no GPU here: every host
cannot probe, which this inventory skips)."""

from __future__ import annotations

import json

from specpair.cli import main
from specpair.deploy import runner

HOSTS = ("local-sparkhead", "local-sparkworker", "local-x86host")
FINDING = {"check": "temperature", "severity": "warn", "gpu": 0, "message": "84 C"}


def test_each_host_verdict_and_findings_from_the_saved_reports(tmp_path, monkeypatch, capsys):
    saved = {
        "local-sparkhead": {"rc": 2, "status": "warn", "stderr": "", "report": {
            "status": "warn", "exit_code": 2, "role": "sparkhead", "profile": "spark",
            "findings": [FINDING], "report": {}}},
        "local-x86host": {"rc": 3, "status": "skip", "stderr": "", "report": {
            "status": "cannot_probe", "exit_code": 3, "reason": "no NVML"}},
        "local-sparkworker": {"rc": 1, "status": "fail", "stderr": "Traceback: boom\n",
                              "report": None},
    }

    def fake(playbook, inventory, extravars, **kw):  # noqa: ANN001, ANN003, ANN202
        (tmp_path / "reports").mkdir()
        (tmp_path / "reports" / "health.json").write_text(json.dumps(saved))
        return runner.RunResult(playbook, "failed", 2, tmp_path, {}, ["x: probe failed"], None,
                                0.0)

    monkeypatch.setattr(runner, "run_playbook", fake)
    assert main(["health", "--inventory", "local", "--json"]) == 1
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["verdict"] == "fail"
    head = s["hosts"]["local-sparkhead"]
    assert (head["verdict"], head["exit_code"], head["role"], head["findings"]) == (
        "warn", 2, "sparkhead", [FINDING])
    assert s["hosts"]["local-x86host"]["reason"] == "no NVML"
    worker = s["hosts"]["local-sparkworker"]
    assert (worker["verdict"], worker["reason"], worker["findings"]) == (
        "fail", "Traceback: boom", [])


def test_the_real_health_playbook_fills_the_summary(capsys):
    rc = main(["health", "--inventory", "local", "--json"])
    out = json.loads(capsys.readouterr().out)
    s = out["summary"]
    assert s is not None and sorted(s["hosts"]) == list(HOSTS), out
    for h in s["hosts"].values():
        assert h["verdict"] in ("pass", "warn", "skip", "fail")
        assert isinstance(h["findings"], list) and isinstance(h["exit_code"], int)
        if h["verdict"] == "skip":
            assert h["exit_code"] == 3 and h["reason"]
        # every host's service container is reported (each role runs one here; its state is
        # whatever this machine's engine holds: none, absent, or a running pair)
        assert h["service"]["container"].startswith("specpair-local-"), h
        assert h["service"]["status"], h
    assert rc == (1 if s["verdict"] == "fail" else 0)
