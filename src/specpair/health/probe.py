"""The probe: NVML readings of every GPU on a host, typed (see ``model``).

It only reads. The same code runs on live NVML and on a recorded snapshot
(``specpair.health.nvml``); every query goes through ``source.call``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specpair.health.model import (
    P2P,
    Clocks,
    Ecc,
    Failed,
    GpuReport,
    HostReport,
    Identity,
    Memory,
    NvLink,
    Pcie,
    Power,
    RetiredPages,
    RowRemap,
    Skipped,
    Thermal,
    XidEvent,
    XidWatch,
)
from specpair.health.nvml import NOT_SUPPORTED, NVML_ERROR_NAMES, NvmlCallError, call_key

__all__ = ["probe", "NVLINK_MAX_LINKS"]

# Links asked per GPU: NVML_NVLINK_MAX_LINKS of nvml.h up to driver 580 (the GPUs in scope
# have at most 4: RTX 3090 has 4, GB10 answers NOT_SUPPORTED).
NVLINK_MAX_LINKS = 18
# enum codes (nvml.h)
TEMPERATURE_GPU = 0
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 1
CLOCK_SM, CLOCK_MEM = 1, 2
ERR_CORRECTED, ERR_UNCORRECTED = 0, 1
VOLATILE_ECC, AGGREGATE_ECC = 0, 1
RETIRE_SBE, RETIRE_DBE = 0, 1
NVLINK_ERRORS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
# An absent link answers NOT_SUPPORTED or INVALID_ARGUMENT: it is not a link of this GPU.
_NO_LINK = (NOT_SUPPORTED, 2)


def _read(source: Any, name: str, *args: int, convert: Callable[[Any], Any] = lambda v: v
          ) -> Any:
    """The value of one query, or Skipped (NOT_SUPPORTED) / Failed (other errors)."""
    try:
        return convert(source.call(name, *args))
    except NvmlCallError as e:
        key = call_key(name, args)
        if e.code == NOT_SUPPORTED:
            return Skipped("NOT_SUPPORTED", key)
        return Failed(NVML_ERROR_NAMES.get(e.code, str(e.code)), e.code, key)


def _watts(mw: int) -> float:
    return mw / 1000.0


def _nvlinks(source: Any, i: int) -> tuple[NvLink, ...]:
    links = []
    for link in range(NVLINK_MAX_LINKS):
        try:
            state: bool | Failed = source.call("nvmlDeviceGetNvLinkState", i, link) == 1
        except NvmlCallError as e:
            if e.code in _NO_LINK:
                continue
            state = Failed(NVML_ERROR_NAMES.get(e.code, str(e.code)), e.code,
                           call_key("nvmlDeviceGetNvLinkState", (i, link)))
        errors = {n: _read(source, "nvmlDeviceGetNvLinkErrorCounter", i, link, c)
                  for n, c in NVLINK_ERRORS.items()}
        links.append(NvLink(link=link, active=state, **errors))
    return tuple(links)


def _memory(source: Any, i: int, meminfo: dict[str, int]) -> Memory:
    m = _read(source, "nvmlDeviceGetMemoryInfo", i)
    if isinstance(m, Skipped):  # GB10 unified memory: the host's memory is the GPU's
        return Memory("/proc/meminfo", meminfo.get("MemTotal", m),
                      meminfo.get("MemAvailable", m))
    if isinstance(m, Failed):
        return Memory("nvml", m, m)
    return Memory("nvml", m["total"], m["free"])


def _gpu(source: Any, i: int, meminfo: dict[str, int]) -> GpuReport:
    def r(name: str, *args: int, convert: Callable[[Any], Any] = lambda v: v) -> Any:
        return _read(source, name, i, *args, convert=convert)

    remap = r("nvmlDeviceGetRemappedRows")
    if isinstance(remap, list):
        row_remap = RowRemap(remap[0], remap[1], bool(remap[2]), bool(remap[3]))
    else:
        row_remap = RowRemap(remap, remap, remap, remap)
    return GpuReport(
        identity=Identity(
            index=i, name=r("nvmlDeviceGetName"), uuid=r("nvmlDeviceGetUUID"),
            serial=r("nvmlDeviceGetSerial"),
            compute_capability=r("nvmlDeviceGetCudaComputeCapability", convert=tuple)),
        thermal=Thermal(r("nvmlDeviceGetTemperature", TEMPERATURE_GPU),
                        r("nvmlDeviceGetTemperatureThreshold", THRESHOLD_SLOWDOWN),
                        r("nvmlDeviceGetTemperatureThreshold", THRESHOLD_SHUTDOWN)),
        power=Power(r("nvmlDeviceGetPowerUsage", convert=_watts),
                    r("nvmlDeviceGetEnforcedPowerLimit", convert=_watts)),
        clocks=Clocks(r("nvmlDeviceGetClockInfo", CLOCK_SM),
                      r("nvmlDeviceGetMaxClockInfo", CLOCK_SM),
                      r("nvmlDeviceGetClockInfo", CLOCK_MEM),
                      r("nvmlDeviceGetMaxClockInfo", CLOCK_MEM),
                      r("nvmlDeviceGetCurrentClocksEventReasons")),
        ecc=Ecc(r("nvmlDeviceGetTotalEccErrors", ERR_CORRECTED, VOLATILE_ECC),
                r("nvmlDeviceGetTotalEccErrors", ERR_UNCORRECTED, VOLATILE_ECC),
                r("nvmlDeviceGetTotalEccErrors", ERR_CORRECTED, AGGREGATE_ECC),
                r("nvmlDeviceGetTotalEccErrors", ERR_UNCORRECTED, AGGREGATE_ECC)),
        retired_pages=RetiredPages(r("nvmlDeviceGetRetiredPages", RETIRE_SBE, convert=len),
                                   r("nvmlDeviceGetRetiredPages", RETIRE_DBE, convert=len),
                                   r("nvmlDeviceGetRetiredPagesPendingStatus", convert=bool)),
        row_remap=row_remap,
        pcie=Pcie(r("nvmlDeviceGetCurrPcieLinkGeneration"), r("nvmlDeviceGetMaxPcieLinkGeneration"),
                  r("nvmlDeviceGetCurrPcieLinkWidth"), r("nvmlDeviceGetMaxPcieLinkWidth")),
        nvlinks=_nvlinks(source, i),
        memory=_memory(source, i, meminfo),
    )


def _xid(raw: dict[str, Any], count: int) -> XidWatch:
    reg: list[None | Skipped | Failed] = []
    for i in range(count):
        entry = raw["registration"].get(str(i))
        key = call_key("nvmlDeviceRegisterEvents", (i, 0x8))
        if entry is None:
            reg.append(None)
        elif entry["nvml_error"] == NOT_SUPPORTED:
            reg.append(Skipped("NOT_SUPPORTED", key))
        else:
            code = entry["nvml_error"]
            reg.append(Failed(NVML_ERROR_NAMES.get(code, str(code)), code, key))
    events = tuple(XidEvent(int(e["gpu"]), int(e["xid"]), float(e["t_s"])) for e in raw["events"])
    return XidWatch(float(raw["seconds"]), tuple(reg), events)


def probe(source: Any, host: str, watch_s: float) -> HostReport:
    """Read every GPU of the host, then watch Xid events for ``watch_s`` seconds."""
    driver = source.call("nvmlSystemGetDriverVersion")
    count = source.call("nvmlDeviceGetCount")
    meminfo = source.meminfo()
    gpus = tuple(_gpu(source, i, meminfo) for i in range(count))
    p2p = tuple(
        P2P(a, b, **{n: _read(source, "nvmlDeviceGetP2PStatus", a, b, c)
                     for n, c in P2P_CAPS.items()})
        for a in range(count) for b in range(count) if a != b)
    xid = _xid(source.watch_xid(count, watch_s), count)
    return HostReport(host=host, source=source.description, driver=driver, gpus=gpus, p2p=p2p,
                      xid=xid)
