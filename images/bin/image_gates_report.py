#!/usr/bin/env python3
"""Summarise one image's gate run (pytest JUnit XML) and decide pass/fail.

Usage: images/bin/image_gates_report.py XML --exit-code RC
         [--expect-fail REGEX [--must-fail REGEX]...]
  Normal mode: exit 0 only if pytest exited 0, at least one gate ran, and none failed or errored.
  --expect-fail REGEX: the power check of a gate (an image built WITHOUT a fix): exit 0 only if
  at least one test failed and every failed/errored test id matches REGEX; each --must-fail
  REGEX must also match at least one failed test (the gate that has to catch the bug).
  --host-gpus "DEVICES": the NVIDIA devices the runner found on the host
  (images/bin/image-gates.sh); the report names the case, and where there are any, a skipped
  NVML gate is a failure (a gate that cannot see its hardware on the hardware must not pass).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Case:
    """One test case of the JUnit XML."""

    id: str  # "classname::name", e.g. "tests.gates.test_rng_gate::test_rng_gate[stress16]"
    outcome: str  # passed | failed | error | skipped
    message: str  # failure or skip message (first line), "" when passed
    seconds: float  # the test's wall time


def read_cases(path: str) -> list[Case]:
    """Every test case in the JUnit XML at `path` (pytest's --junitxml format)."""
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = tc.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or node.text or "").strip().splitlines()[:1]
                message = message[0] if message else ""
                break
        cases.append(Case(f"{tc.get('classname', '')}::{tc.get('name', '')}", outcome, message,
                          float(tc.get("time", 0.0))))
    return cases


def gpu_case(host_gpus: str) -> str:
    """One line naming the GPU case of the run."""
    if host_gpus.strip():
        return (f"host NVIDIA devices: {host_gpus.strip()} (gates ran with --gpus all; "
                "an NVML gate that finds no GPU fails)")
    return "host NVIDIA devices: none (no /dev/nvidia<N>, no /proc/driver/nvidia): NVML gates skip"


def verdict(cases: list[Case], exit_code: int, expect_fail: str | None,
            must_fail: tuple[str, ...] = (), host_gpus: str = "") -> tuple[bool, str]:
    """(ok, reason) for a gate run."""
    failed = [c for c in cases if c.outcome in ("failed", "error")]
    ran = [c for c in cases if c.outcome != "skipped"]
    blind = [c.id for c in cases if c.outcome == "skipped" and "nvml" in c.id.lower()]
    if host_gpus.strip() and blind:
        return False, f"NVML gate(s) skipped on a host with NVIDIA devices: {blind}"
    if expect_fail is None:
        if not ran:
            return False, "no gate ran (all skipped or none collected)"
        if failed or exit_code != 0:
            return False, f"{len(failed)} gate(s) failed (pytest exit {exit_code})"
        return True, f"{len(ran)} gate(s) passed"
    if not failed:
        return False, f"expected a failure matching {expect_fail!r}, but no gate failed"
    stray = [c.id for c in failed if not re.search(expect_fail, c.id)]
    if stray:
        return False, f"failures outside {expect_fail!r}: {stray}"
    missed = [r for r in must_fail if not any(re.search(r, c.id) for c in failed)]
    if missed:
        return False, f"no failure matches {missed}: those gates missed the bug"
    return True, f"failed as expected: {[c.id for c in failed]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", help="pytest --junitxml output")
    parser.add_argument("--exit-code", type=int, required=True, help="pytest's exit status")
    parser.add_argument("--expect-fail", metavar="REGEX", default=None,
                        help="power check: pass only if the failures all match REGEX")
    parser.add_argument("--must-fail", metavar="REGEX", action="append", default=[],
                        help="with --expect-fail: some failed test must match REGEX (repeatable)")
    parser.add_argument("--host-gpus", metavar="DEVICES", default="",
                        help="NVIDIA devices found on the host, space-separated ('' = none)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    cases = read_cases(args.xml)
    if args.must_fail and args.expect_fail is None:
        parser.error("--must-fail needs --expect-fail")
    ok, reason = verdict(cases, args.exit_code, args.expect_fail, tuple(args.must_fail),
                         args.host_gpus)
    if args.json:
        print(json.dumps({"ok": ok, "reason": reason, "gpus": gpu_case(args.host_gpus),
                          "cases": [asdict(c) for c in cases]}, indent=2))
    else:
        print(f"   {gpu_case(args.host_gpus)}")
        for c in cases:
            tail = f"  ({c.message})" if c.message else ""
            print(f"   {c.outcome:7s} {c.seconds:7.1f}s  {c.id}{tail}")
        print(f"   => {'OK' if ok else 'FAIL'}: {reason}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
