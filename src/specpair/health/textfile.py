"""`specpair health --prometheus-file FILE`: the verdict as a node_exporter textfile.

node_exporter's textfile collector (``--collector.textfile.directory``) reads
every ``*.prom`` file of a directory on each scrape; a cron job or systemd
timer runs ``specpair health --prometheus-file DIR/specpair_health.prom`` and
the alert rules of ``deploy/prometheus/`` judge what it wrote. The file is
replaced atomically (written beside it under a name node_exporter ignores,
then renamed), so a scrape never reads half of it.

Series (all gauges; docs/operations.md lists them with their alerts):

- ``specpair_health_verdict{verdict}``: 1 for the verdict of the last probe
  (pass, warn, fail, cannot_probe), 0 for the other three.
- ``specpair_health_findings{level, check}``: findings of the last probe.
- ``specpair_health_xid_events{gpu, xid, level}``: Xid events seen during the
  last probe's watch window, with the level the policy gave them.
- ``specpair_health_xid_watch_seconds``: that window's length (0: not watched).
- ``specpair_health_gpus``: GPUs the last probe saw.
- ``specpair_health_info{role, profile, driver}``: 1, what the probe judged.
- ``specpair_health_last_run_timestamp_seconds``: when the file was written.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

from specpair.health.model import HostReport
from specpair.health.policy import Assessment, Policy, select_profile

__all__ = ["VERDICTS", "render", "write"]

VERDICTS = ("pass", "warn", "fail", "cannot_probe")


def _labels(**kv: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def _num(v: float) -> str:
    v = float(v)
    return str(int(v)) if v.is_integer() else repr(v)


def _family(name: str, help_: str, samples: list[tuple[str, float]]) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} gauge",
            *(f"{name}{labels} {_num(value)}" for labels, value in samples)]


def render(verdict: str, report: HostReport | None = None, assessment: Assessment | None = None,
           policy: Policy | None = None, now: float | None = None) -> str:
    """The textfile for one probe. ``report`` and ``assessment`` are None when it could not
    probe (verdict ``cannot_probe``); ``policy`` gives the Xid levels."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    p = "specpair_health_"
    lines = _family(f"{p}verdict", "Verdict of the last specpair health probe on this host "
                    "(1: the verdict given, 0: the others).",
                    [(_labels(verdict=v), float(v == verdict)) for v in VERDICTS])
    if report is not None and assessment is not None:
        counts = Counter((f.level, f.check) for f in assessment.findings)
        lines += _family(f"{p}findings", "Findings of the last probe, by level and check.",
                         [(_labels(level=lv, check=c), n) for (lv, c), n in sorted(counts.items())])
        profile = select_profile(policy, report, assessment.role) if policy else None
        xids = Counter((e.gpu, e.xid) for e in report.xid.events)
        lines += _family(f"{p}xid_events", "Xid critical-error events during the last probe's "
                         "watch window, by GPU, Xid and the level the policy gives it.",
                         [(_labels(gpu=g, xid=x, level=_xid_level(profile, x)), n)
                          for (g, x), n in sorted(xids.items())])
        lines += _family(f"{p}xid_watch_seconds", "Length of the last probe's Xid watch "
                         "window (0: not watched).", [("", report.xid.seconds)])
        lines += _family(f"{p}gpus", "GPUs the last probe saw.", [("", len(report.gpus))])
        lines += _family(f"{p}info", "What the last probe judged (always 1).",
                         [(_labels(role=assessment.role or "", profile=assessment.profile,
                                   driver=report.driver), 1)])
    lines += _family(f"{p}last_run_timestamp_seconds", "Unix time the last probe wrote this "
                     "file.", [("", round(time.time() if now is None else now, 3))])
    return "\n".join(lines) + "\n"


def _xid_level(profile, xid: int) -> str:  # noqa: ANN001
    if profile is None:
        return "unknown"
    return "fail" if xid in profile.xid_fail else profile.xid_other


def write(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a temporary file beside it, then a rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # not *.prom: never collected
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
