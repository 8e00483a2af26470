"""Health policy: YAML thresholds per host role, turning a report into pass / warn / fail.

The shipped default is ``default_policy.yaml`` beside this module (see
docs/health.md). NOT_SUPPORTED readings become "skipped" findings and never
change the verdict; any other NVML error fails (a GPU that cannot be read is
not known to be healthy).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpair.health.errors import PolicyError
from specpair.health.model import (
    CLOCK_EVENT_REASONS,
    Failed,
    GpuReport,
    HostReport,
    Skipped,
    reason_names,
)
from specpair.yamlio import YamlRefused, excerpt, load_yaml

__all__ = ["DEFAULT_POLICY", "Profile", "Policy", "Finding", "Assessment", "load_policy",
           "evaluate"]

DEFAULT_POLICY = Path(__file__).with_name("default_policy.yaml")
_LEVELS = ("fail", "warn", "info")


@dataclass(frozen=True)
class Profile:
    """Thresholds for one kind of GPU (keys of a profile in the policy YAML)."""

    name: str  # profile name (key under `profiles`)
    description: str  # what hardware this is
    name_contains: str  # substring of the NVML device name that identifies it
    gpu_count: int  # GPUs the host must show
    compute_capability: list[int]  # [major, minor]
    driver_major: list[int]  # allowed driver major versions
    temperature_warn_c: float  # warn at or above
    temperature_fail_c: float  # fail at or above (also at the GPU's own slowdown threshold)
    power_warn_fraction: float  # warn when usage / limit reaches this
    clock_reasons_warn: list[str]  # clock-event reasons that warn
    clock_reasons_fail: list[str]  # clock-event reasons that fail
    ecc_volatile_uncorrected_fail: int  # fail at or above
    ecc_aggregate_uncorrected_warn: int  # warn at or above
    ecc_volatile_corrected_warn: int  # warn at or above
    retired_pages_pending: str  # level when a page retirement is pending
    retired_pages_double_bit_warn: int  # warn at or above
    row_remap_failure: str  # level on a row-remap failure
    row_remap_pending: str  # level on a pending remap
    row_remap_uncorrectable_warn: int  # warn at or above
    xid_fail: list[int]  # Xids that fail
    xid_other: str  # level for any other Xid
    pcie_width_below_max: str  # level when the link runs with fewer lanes than its maximum
    pcie_gen_below_max: str  # level when the link runs below its maximum generation
    nvlink_min_active: int  # fail below this many active links per GPU
    nvlink_all_active: bool  # fail on any inactive link
    nvlink_replay_warn: int  # warn at or above (per link)
    nvlink_recovery_warn: int  # warn at or above (per link)
    nvlink_crc_flit_warn: int  # warn at or above (per link)
    nvlink_crc_data_fail: int  # fail at or above (per link)
    p2p_required: bool  # read, write and NVLink P2P must be OK between every pair
    memory_available_warn_fraction: float  # warn when available / total is below


@dataclass(frozen=True)
class Policy:
    """A loaded policy file."""

    path: str  # where it was read from
    roles: dict[str, str]  # host role -> profile name
    profiles: dict[str, Profile]  # profile name -> thresholds


@dataclass(frozen=True)
class Finding:
    """One observation of the policy about one GPU (or the host)."""

    level: str  # fail | warn | info | skipped
    gpu: int | None  # device index, None for the host
    check: str  # which check, e.g. "xid", "nvlink", "temperature"
    message: str  # what was seen, against which threshold


@dataclass(frozen=True)
class Assessment:
    """The verdict of a policy on a report."""

    status: str  # pass | warn | fail
    role: str | None  # the host role asked for (None: profile inferred from the GPU name)
    profile: str  # the profile applied
    findings: tuple[Finding, ...]  # everything seen, fails first


def _check_type(tp: Any, v: Any) -> bool:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return isinstance(v, list) and all(_check_type(item, x) for x in v)
    if tp is float:
        return isinstance(v, int | float) and not isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, tp)


def _profile(name: str, raw: Any, where: str) -> Profile:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: profile {excerpt(name)} must be a mapping")
    hints = typing.get_type_hints(Profile)
    fields = [f.name for f in dataclasses.fields(Profile) if f.name != "name"]
    missing = [f for f in fields if f not in raw]
    unknown = [k for k in raw if k not in fields]
    if missing or unknown:
        raise PolicyError(f"{where}: profile {excerpt(name)}: missing keys {excerpt(missing)}, "
                          f"unknown keys {excerpt(unknown)}")
    for f in fields:
        if not _check_type(hints[f], raw[f]):
            raise PolicyError(f"{where}: profile {excerpt(name)}: {f} must be {hints[f]}, got "
                              f"{excerpt(raw[f])}")
    for f in ("retired_pages_pending", "row_remap_failure", "row_remap_pending", "xid_other",
              "pcie_width_below_max", "pcie_gen_below_max"):
        if raw[f] not in _LEVELS:
            raise PolicyError(f"{where}: profile {excerpt(name)}: {f} must be one of {_LEVELS}")
    for f in ("clock_reasons_warn", "clock_reasons_fail"):
        bad = [r for r in raw[f] if r not in CLOCK_EVENT_REASONS]
        if bad:
            raise PolicyError(f"{where}: profile {excerpt(name)}: unknown clock reasons "
                              f"{excerpt(bad)}; known: {sorted(CLOCK_EVENT_REASONS)}")
    if len(raw["compute_capability"]) != 2:
        raise PolicyError(f"{where}: profile {excerpt(name)}: compute_capability is [major, minor]")
    return Profile(name=name, **{f: raw[f] for f in fields})


def load_policy(path: str | Path = DEFAULT_POLICY) -> Policy:
    """Read and validate a policy file; errors name the file and the key."""
    try:
        raw = load_yaml(path, "policy")
    except YamlRefused as e:
        raise PolicyError(str(e)) from None
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise PolicyError(f"{path}: not a version 1 health policy")
    if set(raw) != {"version", "roles", "profiles"}:
        raise PolicyError(f"{path}: top-level keys must be version, roles, profiles")
    if not isinstance(raw["profiles"], dict) or not isinstance(raw["roles"], dict):
        raise PolicyError(f"{path}: roles and profiles must be mappings")
    profiles = {n: _profile(n, p, str(path)) for n, p in raw["profiles"].items()}
    for role, prof in raw["roles"].items():
        if not isinstance(prof, str) or prof not in profiles:
            raise PolicyError(f"{path}: role {excerpt(role)} names unknown profile "
                              f"{excerpt(prof)}")
    return Policy(str(path), dict(raw["roles"]), profiles)


def select_profile(policy: Policy, report: HostReport, role: str | None) -> Profile:
    """The profile of ``role``, or (role None) the one whose name matches every GPU."""
    if role is not None:
        if role not in policy.roles:
            raise PolicyError(f"{policy.path}: no role {role!r}; roles: {sorted(policy.roles)}")
        return policy.profiles[policy.roles[role]]
    names = {g.identity.name for g in report.gpus if isinstance(g.identity.name, str)}
    fits = [p for p in policy.profiles.values()
            if names and all(p.name_contains in n for n in names)]
    if len(fits) != 1:
        raise PolicyError(f"cannot infer the profile from GPU names {sorted(names)} "
                          f"({len(fits)} profiles match); pass --role "
                          f"{'|'.join(sorted(policy.roles))}")
    return fits[0]


class _Findings:
    def __init__(self) -> None:
        self.items: list[Finding] = []

    def add(self, level: str, gpu: int | None, check: str, message: str) -> None:
        self.items.append(Finding(level, gpu, check, message))

    def value(self, gpu: int | None, check: str, v: Any, what: str) -> bool:
        """True when ``v`` is a value; records skipped / failed markers otherwise."""
        if isinstance(v, Skipped):
            self.add("skipped", gpu, check, f"{what}: {v.reason} ({v.call})")
            return False
        if isinstance(v, Failed):
            self.add("fail", gpu, check, f"{what}: NVML query {v.call} failed with {v.error}")
            return False
        return True

    def at_least(self, level: str, gpu: int | None, check: str, v: Any, limit: float,
                 what: str) -> None:
        if self.value(gpu, check, v, what) and v >= limit:
            self.add(level, gpu, check, f"{what} = {v} (threshold {limit})")


def _gpu(f: _Findings, p: Profile, g: GpuReport) -> None:
    i = g.identity.index
    ident = g.identity
    if f.value(i, "identity", ident.name, "name") and p.name_contains not in ident.name:
        f.add("fail", i, "identity", f"GPU is {ident.name!r}; profile {p.name} expects "
              f"{p.name_contains!r}")
    f.value(i, "identity", ident.uuid, "UUID")
    cc = ident.compute_capability
    if f.value(i, "identity", cc, "CUDA compute capability") and list(cc) != p.compute_capability:
        f.add("fail", i, "identity", f"compute capability sm_{cc[0]}{cc[1]}; profile {p.name} "
              f"expects sm_{p.compute_capability[0]}{p.compute_capability[1]}")
    t = g.thermal
    if f.value(i, "temperature", t.gpu_c, "GPU temperature"):
        slow = t.slowdown_c if isinstance(t.slowdown_c, int) else None
        if t.gpu_c >= p.temperature_fail_c or (slow is not None and t.gpu_c >= slow):
            f.add("fail", i, "temperature", f"GPU at {t.gpu_c} C (fail at {p.temperature_fail_c}"
                  f" C; slowdown threshold {slow} C)")
        elif t.gpu_c >= p.temperature_warn_c:
            f.add("warn", i, "temperature", f"GPU at {t.gpu_c} C (warn at "
                  f"{p.temperature_warn_c} C)")
    f.value(i, "temperature", t.slowdown_c, "slowdown threshold")
    f.value(i, "temperature", t.shutdown_c, "shutdown threshold")
    pw = g.power
    if (f.value(i, "power", pw.usage_w, "power usage")
            and f.value(i, "power", pw.limit_w, "power limit")
            and pw.limit_w > 0 and pw.usage_w / pw.limit_w >= p.power_warn_fraction):
        f.add("warn", i, "power", f"{pw.usage_w:.1f} W of a {pw.limit_w:.1f} W limit "
              f"(warn at {p.power_warn_fraction:.0%})")
    c = g.clocks
    for name in ("sm_mhz", "sm_max_mhz", "mem_mhz", "mem_max_mhz"):
        f.value(i, "clocks", getattr(c, name), name)
    if f.value(i, "clocks", c.event_reasons, "clock event reasons"):
        active = reason_names(c.event_reasons)
        for level, names in (("fail", p.clock_reasons_fail), ("warn", p.clock_reasons_warn)):
            hit = [r for r in active if r in names]
            if hit:
                f.add(level, i, "throttle", f"clocks held down by {', '.join(hit)} "
                      f"(SM {c.sm_mhz} of {c.sm_max_mhz} MHz)")
    e = g.ecc
    f.at_least("fail", i, "ecc", e.volatile_uncorrected, p.ecc_volatile_uncorrected_fail,
               "volatile uncorrected ECC errors")
    f.at_least("warn", i, "ecc", e.aggregate_uncorrected, p.ecc_aggregate_uncorrected_warn,
               "aggregate uncorrected ECC errors")
    f.at_least("warn", i, "ecc", e.volatile_corrected, p.ecc_volatile_corrected_warn,
               "volatile corrected ECC errors")
    f.value(i, "ecc", e.aggregate_corrected, "aggregate corrected ECC errors")
    rp = g.retired_pages
    f.value(i, "retired_pages", rp.single_bit, "pages retired (single-bit)")
    f.at_least("warn", i, "retired_pages", rp.double_bit, p.retired_pages_double_bit_warn,
               "pages retired (double-bit)")
    if f.value(i, "retired_pages", rp.pending, "page retirement pending") and rp.pending:
        f.add(p.retired_pages_pending, i, "retired_pages", "a page retirement is pending "
              "(driver reload needed)")
    rr = g.row_remap
    if f.value(i, "row_remap", rr.failure, "row remap failure") and rr.failure:
        f.add(p.row_remap_failure, i, "row_remap", "row remapping FAILED: the GPU needs service")
    if not isinstance(rr.failure, Skipped | Failed):
        if rr.pending:
            f.add(p.row_remap_pending, i, "row_remap", "a row remap is pending (GPU reset needed)")
        f.at_least("warn", i, "row_remap", rr.uncorrectable, p.row_remap_uncorrectable_warn,
                   "rows remapped for uncorrectable errors")
    x = g.pcie
    if (f.value(i, "pcie", x.width, "PCIe width")
            and f.value(i, "pcie", x.max_width, "PCIe max width") and x.width < x.max_width):
        f.add(p.pcie_width_below_max, i, "pcie", f"PCIe link x{x.width} of x{x.max_width}")
    if (f.value(i, "pcie", x.gen, "PCIe generation")
            and f.value(i, "pcie", x.max_gen, "PCIe max generation") and x.gen < x.max_gen):
        f.add(p.pcie_gen_below_max, i, "pcie", f"PCIe gen {x.gen} of {x.max_gen}")
    _nvlink(f, p, g)
    m = g.memory
    if (f.value(i, "memory", m.total_bytes, f"memory total ({m.source})")
            and f.value(i, "memory", m.available_bytes, f"memory available ({m.source})")
            and m.total_bytes > 0
            and m.available_bytes / m.total_bytes < p.memory_available_warn_fraction):
        f.add("warn", i, "memory", f"{m.available_bytes / 2**30:.1f} GiB of "
              f"{m.total_bytes / 2**30:.1f} GiB available ({m.source})")


def _nvlink(f: _Findings, p: Profile, g: GpuReport) -> None:
    i = g.identity.index
    if not g.nvlinks:
        if p.nvlink_min_active > 0:
            f.add("fail", i, "nvlink", f"no NVLink on this GPU; profile {p.name} needs "
                  f"{p.nvlink_min_active} active links")
        else:
            f.add("skipped", i, "nvlink", "no NVLink on this GPU (NOT_SUPPORTED)")
        return
    active = 0
    for link in g.nvlinks:
        if not f.value(i, "nvlink", link.active, f"NVLink {link.link} state"):
            continue
        active += bool(link.active)
        if not link.active and p.nvlink_all_active:
            f.add("fail", i, "nvlink", f"NVLink {link.link} is down")
        for name, level, limit in (("replay", "warn", p.nvlink_replay_warn),
                                   ("recovery", "warn", p.nvlink_recovery_warn),
                                   ("crc_flit", "warn", p.nvlink_crc_flit_warn),
                                   ("crc_data", "fail", p.nvlink_crc_data_fail)):
            f.at_least(level, i, "nvlink", getattr(link, name), limit,
                       f"NVLink {link.link} {name} errors")
    if active < p.nvlink_min_active:
        f.add("fail", i, "nvlink", f"{active} NVLinks active; profile {p.name} needs "
              f"{p.nvlink_min_active}")


def _host(f: _Findings, p: Profile, r: HostReport) -> None:
    if len(r.gpus) != p.gpu_count:
        f.add("fail", None, "identity", f"{len(r.gpus)} GPUs; profile {p.name} expects "
              f"{p.gpu_count}")
    major = r.driver.split(".")[0]
    if not major.isdigit() or int(major) not in p.driver_major:
        f.add("fail", None, "driver", f"driver {r.driver}; profile {p.name} allows major "
              f"{p.driver_major}")
    for pair in r.p2p:
        for cap in ("read", "write", "nvlink"):
            v = getattr(pair, cap)
            what = f"P2P {cap} GPU {pair.a} -> GPU {pair.b}"
            if f.value(None, "p2p", v, what) and v != 0 and p.p2p_required:
                f.add("fail", None, "p2p", f"{what}: status {v} (0 = OK)")
    x = r.xid
    if x.seconds <= 0:
        f.add("skipped", None, "xid", "no watch window (--watch 0): Xid events not observed")
    for gpu, reg in enumerate(x.registration):
        if reg is not None:
            f.value(gpu, "xid", reg, "Xid event registration")
    for ev in x.events:
        level = "fail" if ev.xid in p.xid_fail else p.xid_other
        f.add(level, ev.gpu, "xid", f"Xid {ev.xid} at +{ev.t_s:.1f} s of the "
              f"{x.seconds:g} s watch")


def evaluate(report: HostReport, policy: Policy, role: str | None = None) -> Assessment:
    """Apply the profile of ``role`` (inferred from the GPU name when None)."""
    profile = select_profile(policy, report, role)
    f = _Findings()
    _host(f, profile, report)
    for g in report.gpus:
        _gpu(f, profile, g)
    order = {"fail": 0, "warn": 1, "info": 2, "skipped": 3}
    findings = tuple(sorted(f.items, key=lambda x: order[x.level]))
    levels = {x.level for x in findings}
    status = "fail" if "fail" in levels else "warn" if "warn" in levels else "pass"
    return Assessment(status, role, profile.name, findings)
