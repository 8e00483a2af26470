"""The alert rules (deploy/prometheus/), their promtool unit tests, the dashboard, the contract.

`promtool check rules` and `promtool test rules` run for real (skipped, saying so, only where
promtool is absent). Must-fail control: each mutation below breaks one alert the way a careless
edit would (threshold, window, duration, label, guard); the unit tests must then fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "specpair-alerts.yml"
UNIT = PROM / "tests" / "specpair-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "specpair-pair.json"
OPERATIONS = ROOT / "docs" / "operations.md"

# (what it breaks, text in the rules, its replacement)
MUTATIONS = [
    ("disconnect waits 1 min", "for: 30s", "for: 1m"),
    ("rank mismatch read as a level", "increase(specpair_rank_mismatch_total[10m]) > 0",
     "specpair_rank_mismatch_total > 0"),
    ("a restart read as a level", "(resets(vllm:request_success_total[15m])) > 0",
     "(vllm:request_success_total) < 1"),
    ("missing threshold 10 %", "ratio_rate2m > 0.05", "ratio_rate2m > 0.10"),
    ("missing counts every outcome", 'rate(specpair_items_total{outcome="missing"}[2m])',
     "rate(specpair_items_total[2m])"),
    ("collapse at a tenth", "< 0.5 * specpair", "< 0.1 * specpair"),
    ("baseline over 5 min", 'mode) (rate(specpair_accepted_drafts_total[1h]))',
     'mode) (rate(specpair_accepted_drafts_total[5m]))'),
    ("modes pooled", "sum by (job, instance, mode) (rate(specpair_accepted_drafts_total[5m]))",
     "sum by (job, instance) (rate(specpair_accepted_drafts_total[5m]))"),
    ("no traffic guard", "specpair:draft_tokens:rate5m > 1", "specpair:draft_tokens:rate5m > 0"),
    ("health fail never matches", 'verdict="fail"} == 1', 'verdict="fail"} == 2'),
    ("Xid only while the file has it", "max_over_time(specpair_health_xid_events[10m])",
     "specpair_health_xid_events"),
    ("cannot-probe at once", 'verdict="cannot_probe"} == 1\n        for: 10m',
     'verdict="cannot_probe"} == 1\n        for: 0m'),
    ("stale after 30 min", "> 600", "> 1800"),
]


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules(promtool: str) -> None:
    out = _promtool(promtool, "check", "rules", str(RULES), cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in out.stdout


def test_promtool_rule_unit_tests_pass(promtool: str) -> None:
    out = _promtool(promtool, "test", "rules", UNIT.name, cwd=UNIT.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_shown_firing_and_not_firing() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert alerts == {"SpecpairDrafterDisconnected", "SpecpairDraftsMissing",
                      "SpecpairRankMismatch", "SpecpairTargetRestarted",
                      "SpecpairAcceptanceCollapsed", "SpecpairHealthFailed", "SpecpairGpuXid",
                      "SpecpairHealthCannotProbe", "SpecpairHealthStale"}
    cases = [c for t in yaml.safe_load(UNIT.read_text())["tests"]
             for c in t.get("alert_rule_test", [])]
    for name in alerts:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name} is never shown firing"
        assert any(not c["exp_alerts"] for c in mine), f"{name} is never shown not firing"


@pytest.mark.parametrize("what, old, new", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_broken_rules_fail_their_unit_tests(promtool: str, tmp_path: Path, what: str, old: str,
                                            new: str) -> None:
    text = RULES.read_text()
    assert text.count(old) == 1, f"mutation {what!r} no longer applies: update it"
    (tmp_path / "tests").mkdir()
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(UNIT, tmp_path / "tests" / UNIT.name)
    assert _promtool(promtool, "check", "rules", RULES.name, cwd=tmp_path).returncode == 0
    out = _promtool(promtool, "test", "rules", UNIT.name, cwd=tmp_path / "tests")
    assert out.returncode != 0, f"the unit tests pass with the rules broken ({what})"


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    """Each panel query, Grafana's variables filled in, as a recording rule promtool parses."""
    def fill(e: str) -> str:
        return e.replace("$__rate_interval", "5m").replace("$job", ".*").replace("$instance", ".*")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": fill(e)}
        for i, e in enumerate(_dashboard_exprs())]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = _promtool(promtool, "check", "rules", str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_contract_documents_every_series_used() -> None:
    """Every specpair series the rules and the dashboard read is in docs/operations.md."""
    doc = OPERATIONS.read_text()
    exprs = [r["expr"] for r in _rules()] + _dashboard_exprs()
    names = {n for e in exprs for n in re.findall(r"specpair[a-z0-9_:]*[a-z0-9]", e)}
    names = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith("_seconds_bucket") else n
             for n in names}
    recorded = {r["record"] for r in _rules() if "record" in r}
    assert recorded <= names
    missing = sorted(n for n in names if f"`{n}`" not in doc and f"`{n}{{" not in doc)
    assert not missing, f"docs/operations.md does not document {missing}"
