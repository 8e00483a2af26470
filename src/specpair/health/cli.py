"""`specpair health`: probe the GPUs of this host, judge them, qualify pairs.

Exit codes: 0 pass (or pair qualified), 1 fail (or pair not qualified), 2 warn,
3 cannot probe (no NVML / no driver; one line on stderr), 4 bad input
(policy, snapshot or report file, arguments).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections import Counter
from typing import Any

from specpair.deploy.cli import add_inventory_argument, run_health_inventory
from specpair.errors import EXIT_BAD_INPUT, EXIT_CANNOT_RUN
from specpair.files import FileRefused, read_small
from specpair.health.codec import report_from_dict, to_dict
from specpair.health.errors import CannotProbe, PolicyError, ReportError, SnapshotError
from specpair.health.model import HostReport
from specpair.health.nvml import (
    MAX_SNAPSHOT_BYTES,
    SNAPSHOT_FORMAT,
    LiveNvml,
    NvmlCallError,
    RecordedNvml,
    Recorder,
)
from specpair.health.policy import DEFAULT_POLICY, Assessment, Policy, evaluate, load_policy
from specpair.health.probe import probe
from specpair.health.qualify import PAIRS, qualify_drafter_pair, qualify_target_pair
from specpair.health.textfile import render as render_textfile
from specpair.health.textfile import write as write_textfile

__all__ = ["add_parser", "add_arguments", "run"]

EXIT = {"pass": 0, "fail": 1, "warn": 2}
EXIT_CANNOT_PROBE = EXIT_CANNOT_RUN
MAX_WATCH_S = 3600.0  # the longest --watch window


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of `specpair health` (one place, so new flags slot in cleanly)."""
    p.add_argument("--json", action="store_true", help="print one JSON object (machines)")
    p.add_argument("--policy", metavar="FILE", default=str(DEFAULT_POLICY),
                   help="health policy YAML (default: the shipped %(default)s)")
    p.add_argument("--role", metavar="ROLE",
                   help="host role whose thresholds apply (sparkhead, sparkworker, x86host); "
                        "default: the profile whose GPU name matches")
    p.add_argument("--watch", metavar="SECONDS", type=float, default=5.0,
                   help="watch for Xid critical errors this long, 0..3600 (default "
                        "%(default)s; 0 skips the Xid check)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--snapshot", metavar="FILE",
                     help="run the probe on a recorded NVML snapshot instead of live NVML")
    src.add_argument("--record", metavar="FILE",
                     help="probe live NVML and also write what it answered to FILE "
                          "(a snapshot for post-mortems)")
    p.add_argument("--prometheus-file", metavar="FILE",
                   help="also write the verdict, findings and Xid events as a node_exporter "
                        "textfile (FILE should end in .prom; replaced atomically; written on "
                        "pass, warn, fail and cannot probe)")
    p.add_argument("--qualify", choices=PAIRS,
                   help="check a pair's physical invariants and record its GPU UUIDs")
    # --inventory/--confirm: probe every host of an inventory (specpair.deploy owns the flags).
    add_inventory_argument(p)
    p.add_argument("--input", metavar="FILE", action="append", default=[],
                   help="with --qualify: a snapshot or `specpair health --json` output to "
                        "qualify instead of probing here; target-pair takes two "
                        "(sparkhead, sparkworker)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "health", help="NVML health probe, policy verdict, pair qualification",
        description="Read-only NVML probe of this host's GPUs, judged by a policy of "
                    "thresholds per host role. Exit 0 pass, 1 fail, 2 warn, 3 cannot probe "
                    "(no NVML), 4 bad input. NOT_SUPPORTED readings are listed as skipped.",
        epilog="examples: specpair health --role x86host --json; specpair health --snapshot "
               "post-mortem.json; specpair health --qualify target-pair --input head.json "
               "--input worker.json")
    add_arguments(p)  # usage errors exit 4 (specpair.cli.Parser, every command alike)
    p.set_defaults(func=run)


def _probe_source(source: Any, host: str, watch: float) -> HostReport:
    try:
        return probe(source, host, watch)
    except NvmlCallError as e:  # driver version or device count unreadable
        raise CannotProbe(f"NVML answered {e.name} for a basic query") from e


def _probe_here(args: argparse.Namespace) -> HostReport:
    if args.snapshot:
        src = RecordedNvml.load(args.snapshot)
        return _probe_source(src, str(src.snapshot.get("host", "?")), args.watch)
    live: Any = LiveNvml()
    host = socket.gethostname()
    if args.record:
        live = Recorder(live, host)
    try:
        report = _probe_source(live, host, args.watch)
    finally:
        live.close()
    if args.record:
        live.write(args.record)
    return report


def _load_input(path: str) -> HostReport:
    try:
        data = json.loads(read_small(path, MAX_SNAPSHOT_BYTES, "input"))
    except (FileRefused, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ReportError(f"cannot read {path}: {e}") from None
    if isinstance(data, dict) and data.get("format") == SNAPSHOT_FORMAT:
        src = RecordedNvml(data, f"snapshot {path}")
        return _probe_source(src, str(data.get("host", "?")), 0.0)
    if isinstance(data, dict) and "report" in data:
        return report_from_dict(data["report"])
    raise ReportError(f"{path} is neither a {SNAPSHOT_FORMAT} snapshot nor "
                      "`specpair health --json` output")


def _summary(report: HostReport, a: Assessment) -> str:
    lines = [f"specpair health: {a.status.upper()} ({report.host}, role {a.role or 'inferred'}, "
             f"profile {a.profile}, {report.source}, {len(report.gpus)} GPU(s), driver "
             f"{report.driver})"]
    for g in report.gpus:
        i = g.identity
        cc = i.compute_capability
        cc_s = f"sm_{cc[0]}{cc[1]}" if isinstance(cc, tuple) else "sm_?"
        up = sum(1 for k in g.nvlinks if k.active is True)
        lines.append(f"  GPU {i.index}: {i.name} {i.uuid} {cc_s}, {g.thermal.gpu_c} C, "
                     f"NVLink {up}/{len(g.nvlinks)} up, memory via {g.memory.source}")
    for f in a.findings:
        if f.level != "skipped":
            where = "host" if f.gpu is None else f"GPU {f.gpu}"
            lines.append(f"  {f.level.upper():5} {where} {f.check}: {f.message}")
    skipped = Counter(f.check for f in a.findings if f.level == "skipped")
    if skipped:
        lines.append("  skipped (not supported or not measured): "
                     + ", ".join(f"{k} x{n}" for k, n in sorted(skipped.items())))
    return "\n".join(lines)


def _qualify(args: argparse.Namespace, policy: Policy) -> int:
    if args.qualify == "target-pair":
        if len(args.input) != 2:
            raise ReportError("--qualify target-pair needs two --input files (sparkhead, "
                              "sparkworker): snapshots or `specpair health --json` outputs")
        reports = [_load_input(x) for x in args.input]
    elif args.input:
        if len(args.input) != 1:
            raise ReportError("--qualify drafter-pair takes at most one --input file")
        reports = [_load_input(args.input[0])]
    else:
        reports = [_probe_here(args)]
    assessments = [evaluate(r, policy, args.role) for r in reports]
    q = (qualify_target_pair(reports, assessments) if args.qualify == "target-pair"
         else qualify_drafter_pair(reports[0], assessments[0]))
    if args.json:
        print(json.dumps({"qualification": to_dict(q),
                          "health": [to_dict(a) for a in assessments]}, indent=1))
    else:
        print(f"specpair health --qualify {q.pair}: "
              f"{'QUALIFIED' if q.qualified else 'NOT QUALIFIED'}")
        for c in q.checks:
            print(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        print(f"  GPUs: {', '.join(f'{h}:{u}' for h, u in zip(q.hosts, q.uuids, strict=True))}")
    return 0 if q.qualified else 1


def _write_textfile(path: str, text: str) -> bool:
    try:
        write_textfile(path, text)
    except OSError as e:
        print(f"specpair health: bad input: cannot write --prometheus-file {path}: {e}",
              file=sys.stderr)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    prom = getattr(args, "prometheus_file", None)
    if prom and (getattr(args, "inventory", None) or args.qualify or args.input):
        print("specpair health: bad input: --prometheus-file is for the probe of this host "
              "(not with --inventory, --qualify or --input)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if getattr(args, "inventory", None):
        return run_health_inventory(args)
    try:
        if not 0 <= args.watch <= MAX_WATCH_S:  # False for NaN
            raise ReportError(f"--watch must lie in 0..{MAX_WATCH_S:g} seconds, got {args.watch}")
        policy = load_policy(args.policy)
        if args.qualify:
            return _qualify(args, policy)
        if args.input:
            raise ReportError("--input is only used with --qualify")
        report = _probe_here(args)
        a = evaluate(report, policy, args.role)
    except CannotProbe as e:
        print(f"specpair health: cannot probe: {e}", file=sys.stderr)
        if prom and not _write_textfile(prom, render_textfile("cannot_probe")):
            return EXIT_BAD_INPUT
        if args.json:
            print(json.dumps({"status": "cannot_probe", "exit_code": EXIT_CANNOT_PROBE,
                              "reason": str(e)}))
        return EXIT_CANNOT_PROBE
    except (PolicyError, SnapshotError, ReportError) as e:
        print(f"specpair health: bad input: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if prom and not _write_textfile(prom, render_textfile(a.status, report, a, policy)):
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps({"status": a.status, "exit_code": EXIT[a.status], "role": a.role,
                          "profile": a.profile, "policy": policy.path,
                          "findings": to_dict(a.findings), "report": to_dict(report)}, indent=1))
    else:
        print(_summary(report, a))
    return EXIT[a.status]

