"""Physical pair qualification: is this the pair the run assumes?

- drafter-pair: one host, exactly two GPUs of the same model, every NVLink of
  both up (same link count), P2P read, write and NVLink OK in both directions,
  one driver, and the host's health is not "fail".
- target-pair: two hosts (two reports), one GPU each, same model, same CUDA
  compute capability, same driver, every NVLink that exists up (GB10 has none:
  the pair talks over its network link, which NVML cannot see), neither host's
  health "fail", two distinct GPUs.

The result records the GPU UUIDs the run is qualified on.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpair.health.model import GpuReport, HostReport, Skipped
from specpair.health.policy import Assessment

__all__ = ["Check", "Qualification", "qualify_drafter_pair", "qualify_target_pair", "PAIRS"]

PAIRS = ("drafter-pair", "target-pair")


@dataclass(frozen=True)
class Check:
    """One invariant of the pair."""

    name: str  # e.g. "same model"
    ok: bool  # the invariant holds
    detail: str  # what was seen


@dataclass(frozen=True)
class Qualification:
    """The verdict on a pair, with what it is qualified on."""

    pair: str  # "drafter-pair" or "target-pair"
    qualified: bool  # every check holds
    uuids: tuple[str, ...]  # the GPU UUIDs, in pair order (host order for target-pair)
    hosts: tuple[str, ...]  # host of each GPU
    drivers: tuple[str, ...]  # driver of each GPU's host
    checks: tuple[Check, ...]  # every invariant checked


def _same(name: str, values: list[object]) -> Check:
    return Check(name, len(set(map(str, values))) == 1, " vs ".join(map(str, values)))


def _links_up(gpus: list[GpuReport], need_links: bool) -> Check:
    counts = [len(g.nvlinks) for g in gpus]
    down = [f"GPU {g.identity.index} link {k.link}" for g in gpus for k in g.nvlinks
            if k.active is not True]
    if need_links and (0 in counts or len(set(counts)) != 1):
        return Check("all NVLinks up", False, f"link counts {counts}")
    if down:
        return Check("all NVLinks up", False, f"down: {', '.join(down)}")
    if not any(counts):
        return Check("all NVLinks up", True, "no NVLink on these GPUs (not applicable)")
    return Check("all NVLinks up", True, f"{counts[0]} links per GPU, all active")


def _health(assessments: list[Assessment], reports: list[HostReport]) -> Check:
    seen = [f"{r.host}: {a.status}" for r, a in zip(reports, assessments, strict=True)]
    return Check("health not failing", all(a.status != "fail" for a in assessments),
                 ", ".join(seen))


def _result(pair: str, gpus: list[GpuReport], hosts: list[HostReport], checks: list[Check]
            ) -> Qualification:
    return Qualification(pair, all(c.ok for c in checks),
                         tuple(str(g.identity.uuid) for g in gpus),
                         tuple(h.host for h in hosts), tuple(h.driver for h in hosts),
                         tuple(checks))


def qualify_drafter_pair(report: HostReport, assessment: Assessment) -> Qualification:
    """The two NVLinked drafter GPUs of one host."""
    gpus = list(report.gpus)
    checks = [Check("two GPUs", len(gpus) == 2, f"{len(gpus)} GPUs on {report.host}")]
    if len(gpus) == 2:
        checks += [
            _same("same model", [g.identity.name for g in gpus]),
            _same("same compute capability", [g.identity.compute_capability for g in gpus]),
            Check("same driver", True, f"{report.driver} (one host)"),
            _links_up(gpus, need_links=True),
        ]
        for pair in report.p2p:
            for cap in ("read", "write", "nvlink"):
                v = getattr(pair, cap)
                ok = v == 0
                detail = ("OK" if ok else f"NOT_SUPPORTED ({v.call}): not verified"
                          if isinstance(v, Skipped) else f"status {v}")
                checks.append(Check(f"P2P {cap} GPU {pair.a} -> GPU {pair.b}", ok, detail))
        checks.append(Check("distinct GPUs", gpus[0].identity.uuid != gpus[1].identity.uuid,
                            " vs ".join(str(g.identity.uuid) for g in gpus)))
    checks.append(_health([assessment], [report]))
    return _result("drafter-pair", gpus, [report] * len(gpus), checks)


def qualify_target_pair(reports: list[HostReport], assessments: list[Assessment]
                        ) -> Qualification:
    """The two target hosts (sparkhead, sparkworker), one GPU each."""
    checks = [Check("two hosts", len(reports) == 2, f"{len(reports)} reports")]
    counts = [len(r.gpus) for r in reports]
    one_each = Check("one GPU per host", all(c == 1 for c in counts),
                     ", ".join(f"{r.host}: {c}" for r, c in zip(reports, counts, strict=True)))
    checks.append(one_each)
    gpus = [r.gpus[0] for r in reports if r.gpus]
    if len(reports) == 2 and one_each.ok:
        checks += [
            _same("same model", [g.identity.name for g in gpus]),
            _same("same compute capability", [g.identity.compute_capability for g in gpus]),
            _same("same driver", [r.driver for r in reports]),
            _links_up(gpus, need_links=False),
            Check("distinct GPUs", gpus[0].identity.uuid != gpus[1].identity.uuid,
                  " vs ".join(str(g.identity.uuid) for g in gpus)),
        ]
    checks.append(_health(assessments, reports))
    return _result("target-pair", gpus, [r for r in reports if r.gpus], checks)
