"""What the probe found, as typed frozen dataclasses (one per GPU, one per host).

Every metric is a value or an explicit marker:

- ``Skipped``: NVML answered NOT_SUPPORTED (or the metric does not apply, e.g.
  no watch window). Never healthy, never failed: the policy lists it as skipped.
- ``Failed``: NVML answered another error (GPU_IS_LOST, NO_PERMISSION, ...).
  The policy fails on it: a GPU that cannot be read is not known healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Skipped", "Failed", "Identity", "Thermal", "Power", "Clocks", "Ecc", "RetiredPages",
    "RowRemap", "Pcie", "NvLink", "Memory", "GpuReport", "P2P", "XidEvent", "XidWatch",
    "HostReport", "CLOCK_EVENT_REASONS", "reason_names",
]


@dataclass(frozen=True)
class Skipped:
    """A metric that does not apply here (NVML NOT_SUPPORTED, or nothing to measure)."""

    reason: str  # "NOT_SUPPORTED", or why nothing was measured
    call: str  # the NVML query that answered (snapshot key), "" if none was made


@dataclass(frozen=True)
class Failed:
    """A metric whose NVML query failed with an error other than NOT_SUPPORTED."""

    error: str  # NVML error name, e.g. "GPU_IS_LOST"
    code: int  # NVML return code
    call: str  # the NVML query (snapshot key)


# nvmlClocksEventReason* bits (nvml.h), name -> bit.
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}


def reason_names(mask: int) -> tuple[str, ...]:
    """Names of the clock-event bits set in ``mask`` (unknown bits as hex)."""
    names = [n for n, bit in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS.values())
    return tuple(names + ([hex(unknown)] if unknown else []))


@dataclass(frozen=True)
class Identity:
    """Which GPU this is."""

    index: int  # NVML device index on its host
    name: str | Failed  # e.g. "NVIDIA GeForce RTX 3090"
    uuid: str | Failed  # "GPU-..."; what a run is qualified on
    serial: str | Skipped | Failed  # board serial (GeForce boards: NOT_SUPPORTED)
    compute_capability: tuple[int, int] | Skipped | Failed  # (8, 6) = sm_86, (12, 1) = sm_121


@dataclass(frozen=True)
class Thermal:
    """Temperatures in degrees Celsius."""

    gpu_c: int | Skipped | Failed  # core temperature now
    slowdown_c: int | Skipped | Failed  # the GPU's own slowdown threshold
    shutdown_c: int | Skipped | Failed  # the GPU's own shutdown threshold


@dataclass(frozen=True)
class Power:
    """Board power in watts."""

    usage_w: float | Skipped | Failed  # now
    limit_w: float | Skipped | Failed  # enforced limit


@dataclass(frozen=True)
class Clocks:
    """Clocks in MHz and why they are held down."""

    sm_mhz: int | Skipped | Failed  # SM clock now
    sm_max_mhz: int | Skipped | Failed  # SM clock maximum
    mem_mhz: int | Skipped | Failed  # memory clock now
    mem_max_mhz: int | Skipped | Failed  # memory clock maximum
    event_reasons: int | Skipped | Failed  # nvmlClocksEventReason* bit mask (throttle reasons)


@dataclass(frozen=True)
class Ecc:
    """ECC error counts (volatile: since boot; aggregate: lifetime)."""

    volatile_corrected: int | Skipped | Failed  # single-bit, since the last driver load
    volatile_uncorrected: int | Skipped | Failed  # double-bit, since the last driver load
    aggregate_corrected: int | Skipped | Failed  # single-bit, lifetime
    aggregate_uncorrected: int | Skipped | Failed  # double-bit, lifetime


@dataclass(frozen=True)
class RetiredPages:
    """Dynamic page retirement (pre-Ampere datacenter GPUs)."""

    single_bit: int | Skipped | Failed  # pages retired for repeated single-bit errors
    double_bit: int | Skipped | Failed  # pages retired for double-bit errors
    pending: bool | Skipped | Failed  # a retirement waits for the next driver reload


@dataclass(frozen=True)
class RowRemap:
    """Row remapping (Ampere+ datacenter GPUs)."""

    correctable: int | Skipped | Failed  # rows remapped for correctable errors
    uncorrectable: int | Skipped | Failed  # rows remapped for uncorrectable errors
    pending: bool | Skipped | Failed  # a remap waits for a GPU reset
    failure: bool | Skipped | Failed  # a remap failed: the GPU must be serviced


@dataclass(frozen=True)
class Pcie:
    """PCIe link, now vs the maximum the GPU and slot allow."""

    gen: int | Skipped | Failed  # current generation (drops at idle to save power)
    max_gen: int | Skipped | Failed  # maximum generation
    width: int | Skipped | Failed  # current lanes
    max_width: int | Skipped | Failed  # maximum lanes


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU."""

    link: int  # link index
    active: bool | Failed  # nvmlDeviceGetNvLinkState == NVML_FEATURE_ENABLED
    replay: int | Skipped | Failed  # NVML_NVLINK_ERROR_DL_REPLAY count
    recovery: int | Skipped | Failed  # NVML_NVLINK_ERROR_DL_RECOVERY count
    crc_flit: int | Skipped | Failed  # NVML_NVLINK_ERROR_DL_CRC_FLIT count
    crc_data: int | Skipped | Failed  # NVML_NVLINK_ERROR_DL_CRC_DATA count


@dataclass(frozen=True)
class Memory:
    """Memory the GPU can use, in bytes."""

    source: str  # "nvml" or "/proc/meminfo" (GB10: unified memory, NVML NOT_SUPPORTED)
    total_bytes: int | Skipped | Failed  # capacity
    available_bytes: int | Skipped | Failed  # free (NVML) or MemAvailable (/proc/meminfo)


@dataclass(frozen=True)
class GpuReport:
    """Everything the probe read from one GPU."""

    identity: Identity  # which GPU
    thermal: Thermal  # temperatures
    power: Power  # power vs limit
    clocks: Clocks  # clocks and throttle reasons
    ecc: Ecc  # ECC counters
    retired_pages: RetiredPages  # page retirement
    row_remap: RowRemap  # row remapping
    pcie: Pcie  # PCIe link
    nvlinks: tuple[NvLink, ...]  # links that exist on this GPU (empty: none)
    memory: Memory  # memory


@dataclass(frozen=True)
class P2P:
    """Peer-to-peer capability from GPU a to GPU b (NVML_P2P_STATUS_* codes, 0 = OK)."""

    a: int  # source device index
    b: int  # peer device index
    read: int | Skipped | Failed  # NVML_P2P_CAPS_INDEX_READ status
    write: int | Skipped | Failed  # NVML_P2P_CAPS_INDEX_WRITE status
    nvlink: int | Skipped | Failed  # NVML_P2P_CAPS_INDEX_NVLINK status
    atomics: int | Skipped | Failed  # NVML_P2P_CAPS_INDEX_ATOMICS status


@dataclass(frozen=True)
class XidEvent:
    """One Xid critical-error event seen during the watch window."""

    gpu: int  # device index
    xid: int  # Xid number (e.g. 79: GPU has fallen off the bus)
    t_s: float  # seconds after the window opened


@dataclass(frozen=True)
class XidWatch:
    """Xid critical errors over the watch window."""

    seconds: float  # window length (0: not watched)
    registration: tuple[None | Skipped | Failed, ...]  # per GPU: None = registered
    events: tuple[XidEvent, ...]  # what arrived


@dataclass(frozen=True)
class HostReport:
    """The probe's result for one host."""

    host: str  # host name (recorded name for a snapshot)
    source: str  # "live NVML" or "snapshot PATH"
    driver: str  # NVIDIA driver version, e.g. "580.95.05"
    gpus: tuple[GpuReport, ...]  # per GPU, by index
    p2p: tuple[P2P, ...]  # every ordered pair of distinct GPUs
    xid: XidWatch  # Xid events over the watch window
