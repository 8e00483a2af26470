"""Human summary of a playbook run: per host what is recorded and running, checks, failures."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from specpair.deploy.runner import RunResult

__all__ = ["print_summary", "junit_outcome", "host_reports", "health_summary"]


def junit_outcome(path: Path) -> dict[str, Any]:
    """{tests, failures, errors, skipped, failed: [test ids]} of a pytest JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out: dict[str, Any] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": []}
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            out[k] += int(s.get(k, 0))
        for case in s.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                out["failed"].append(f"{case.get('classname')}::{case.get('name')}")
    return out


def host_reports(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Per host: the health report status and the gate JUnit outcome fetched to the controller."""
    out: dict[str, dict[str, Any]] = {}
    reports = run_dir / "reports"
    if not reports.is_dir():
        return out
    if (reports / "health.json").is_file():
        for host, saved in json.loads((reports / "health.json").read_text()).items():
            out.setdefault(host, {})["health"] = saved["status"]
    for junit in sorted(reports.glob("*/gates-junit.xml")):
        out.setdefault(junit.parent.name, {})["gates"] = junit_outcome(junit)
    return dict(sorted(out.items()))


_ORDER = ("fail", "warn", "skip", "pass")  # the worst first


def health_summary(run_dir: Path) -> dict[str, Any] | None:
    """`specpair health --inventory INV --json`'s summary: per host its verdict (pass, warn,
    skip: cannot probe and skipped by the inventory, fail), the probe's exit code, role,
    findings and reason, and its service container (status, health, restarts, release; None
    where the host runs none), from reports/health.json; the verdict of the pair is the
    worst probe's (the services are reported, not judged)."""
    path = run_dir / "reports" / "health.json"
    if not path.is_file():
        return None
    hosts: dict[str, Any] = {}
    for host, saved in sorted(json.loads(path.read_text()).items()):
        report = saved.get("report") if isinstance(saved.get("report"), dict) else {}
        hosts[host] = {"verdict": saved.get("status"), "exit_code": int(saved.get("rc", -1)),
                       "probe_status": report.get("status"), "role": report.get("role"),
                       "profile": report.get("profile"),
                       "findings": report.get("findings", []),
                       "reason": report.get("reason") or (None if report else
                                                          (saved.get("stderr") or "").strip()[-400:]
                                                          or None),
                       "service": saved.get("service")}
    verdicts = [h["verdict"] for h in hosts.values()]
    worst = next((v for v in _ORDER if v in verdicts), None)
    return {"action": "health", "verdict": worst, "hosts": hosts}


def _yes(v: Any) -> str:
    return "yes" if v else "NO"


def print_summary(action: str, r: RunResult) -> None:
    ok = r.rc == 0
    s = r.summary
    release = (s or {}).get("requested") or {}
    head = f"specpair {action}: {'OK' if ok else 'FAILED'}"
    if release:
        head += f" (release {release.get('name')})"
    print(f"{head}; {r.elapsed_s:.1f} s, changed={r.changed}, status {r.status}")
    reports = host_reports(r.run_dir)
    if s and action == "health":
        for host, h in s["hosts"].items():
            why = f": {h['reason']}" if h.get("reason") else ""
            print(f"  {host:20s} health {h['verdict']} (exit {h['exit_code']}, "
                  f"{len(h['findings'])} findings){why[:200]}")
            if h.get("service"):
                sv = h["service"]
                print(f"    service {sv['container']}: {sv['status']}"
                      + (f", {sv['health']}" if sv.get("health") else "")
                      + (f", release {sv['release']}" if sv.get("release") else "")
                      + (f", {sv['restarts']} restarts" if sv.get("restarts") else ""))
            for f in h["findings"][:20]:
                print(f"    {json.dumps(f)[:200]}")
        print(f"  verdict: {s['verdict']}")
    elif s:
        if s.get("recovery"):
            print(f"  recovery: {s['recovery']}")
        print(f"  {'host':20s} {'role':14s} {'recorded':10s} {'running':10s} {'matches':7s} "
              f"{'health':7s} gates")
        for host, h in sorted(s["hosts"].items()):
            g = h.get("gates") or {}
            gates = ("-" if not g else ("passed" if int(g.get("rc", 1)) == 0
                                        else "FAILED " + ",".join(g.get("failed", []))))
            print(f"  {host:20s} {h['role']:14s} {str(h['record_current']):10s} "
                  f"{str(h['running_release'] if h['container'] else '(none)'):10s} "
                  f"{_yes(h['matches_record']):7s} {str(h['health']):7s} {gates}")
        c = s.get("completion")
        if c:
            print(f"  completion: {c['completion_tokens']} tokens {c['text'][:60]!r}")
        print(f"  pair consistent: {_yes(s['pair_consistent'])}; recorded release "
              f"{', '.join(map(str, s['recorded_release']))}; digests "
              f"{json.dumps(s.get('digests', {}))}")
        if action == "restore":
            print(f"  pair_restored: {str(s['pair_restored']).lower()}")
    elif reports:
        for host, e in reports.items():
            g = e.get("gates")
            gates = ""
            if g is not None:
                passed = g["tests"] - g["failures"] - g["errors"]
                gates = f" gates {passed}/{g['tests']} passed"
                if g["failed"]:
                    gates += f", FAILED {', '.join(g['failed'])}"
            health = f" health {e['health']}" if "health" in e else ""
            print(f"  {host:20s}{health}{gates}")
    failures = r.failures or (s or {}).get("failures") or []  # every failed task, in order
    for f in failures:
        print(f"  failure: {f}")
    print(f"  artifacts: {r.run_dir}")
