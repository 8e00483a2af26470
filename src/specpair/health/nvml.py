"""The thin NVML access layer: the only code that touches pynvml.

The probe asks for readings through one small interface, ``Source``:

- ``call(name, *args)``: one NVML query by its pynvml name, with integer
  arguments (device indices, link indices, enum codes). Returns a JSON value
  (str, int, list, dict) or raises ``NvmlCallError(code)``.
- ``watch_xid(count, seconds)``: register for Xid critical-error events on
  devices 0..count-1 and collect them for ``seconds``.
- ``meminfo()``: host memory from /proc/meminfo (GB10's unified memory has no
  NVML memory info).

Three sources implement it: ``LiveNvml`` (the real library), ``RecordedNvml``
(a snapshot file: what NVML returned, NOT_SUPPORTED codes included) and
``Recorder`` (wraps a source and writes such a snapshot). Everything is
read-only: no setter, reset or clear call is reachable from here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specpair.files import FileRefused, read_small
from specpair.health.errors import CannotProbe, SnapshotError

__all__ = [
    "CALLS", "NVML_ERROR_NAMES", "NOT_SUPPORTED", "SNAPSHOT_FORMAT", "LiveNvml", "NvmlCallError",
    "RecordedNvml", "Recorder", "call_key", "read_proc_meminfo",
]

SNAPSHOT_FORMAT = "specpair-nvml-snapshot/1"
MAX_SNAPSHOT_BYTES = 64 << 20  # the largest snapshot or JSON report read (an 8-GPU one is ~100 kB)
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError

# NVML return codes (nvml.h), by value.
NVML_ERROR_NAMES = {
    1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE", 8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE", 12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM", 15: "GPU_IS_LOST", 16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM", 18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 20: "MEMORY",
    21: "NO_DATA", 999: "UNKNOWN",
}


class NvmlCallError(Exception):
    """One NVML query returned an error code (not a specpair failure by itself)."""

    def __init__(self, code: int) -> None:
        super().__init__(NVML_ERROR_NAMES.get(code, f"NVML error {code}"))
        self.code = code  # NVML return code (3 = NOT_SUPPORTED)

    @property
    def name(self) -> str:
        return NVML_ERROR_NAMES.get(self.code, str(self.code))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _memory(m: Any) -> dict[str, int]:
    return {"total": int(m.total), "free": int(m.free), "used": int(m.used)}


# Every query the probe may make: pynvml name -> (argument kinds, result converter).
# "dev" arguments are device indices (the live source turns them into handles).
CALLS: dict[str, tuple[tuple[str, ...], Callable[[Any], Any]]] = {
    "nvmlSystemGetDriverVersion": ((), _text),
    "nvmlDeviceGetCount": ((), int),
    "nvmlDeviceGetName": (("dev",), _text),
    "nvmlDeviceGetUUID": (("dev",), _text),
    "nvmlDeviceGetSerial": (("dev",), _text),
    "nvmlDeviceGetCudaComputeCapability": (("dev",), list),
    "nvmlDeviceGetTemperature": (("dev", "int"), int),
    "nvmlDeviceGetTemperatureThreshold": (("dev", "int"), int),
    "nvmlDeviceGetPowerUsage": (("dev",), int),
    "nvmlDeviceGetEnforcedPowerLimit": (("dev",), int),
    "nvmlDeviceGetClockInfo": (("dev", "int"), int),
    "nvmlDeviceGetMaxClockInfo": (("dev", "int"), int),
    "nvmlDeviceGetCurrentClocksEventReasons": (("dev",), int),
    "nvmlDeviceGetTotalEccErrors": (("dev", "int", "int"), int),
    "nvmlDeviceGetRetiredPages": (("dev", "int"), lambda v: [int(a) for a in v]),
    "nvmlDeviceGetRetiredPagesPendingStatus": (("dev",), int),
    "nvmlDeviceGetRemappedRows": (("dev",), lambda v: [int(x) for x in v]),
    "nvmlDeviceGetCurrPcieLinkGeneration": (("dev",), int),
    "nvmlDeviceGetMaxPcieLinkGeneration": (("dev",), int),
    "nvmlDeviceGetCurrPcieLinkWidth": (("dev",), int),
    "nvmlDeviceGetMaxPcieLinkWidth": (("dev",), int),
    "nvmlDeviceGetNvLinkState": (("dev", "int"), int),
    "nvmlDeviceGetNvLinkErrorCounter": (("dev", "int", "int"), int),
    "nvmlDeviceGetP2PStatus": (("dev", "dev", "int"), int),
    "nvmlDeviceGetMemoryInfo": (("dev",), _memory),
}


def call_key(name: str, args: tuple[int, ...]) -> str:
    """The snapshot key of one query, e.g. ``nvmlDeviceGetNvLinkState(0,3)``."""
    return f"{name}({','.join(str(int(a)) for a in args)})"


def _check_call(name: str, args: tuple[int, ...]) -> None:
    if name not in CALLS:
        raise ValueError(f"{name} is not a query of the health probe")
    kinds = CALLS[name][0]
    if len(args) != len(kinds):
        raise ValueError(f"{name} takes {len(kinds)} arguments, got {len(args)}")


def read_proc_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """MemTotal and MemAvailable in bytes (the kernel reports kB)."""
    out: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            out[key] = int(rest.split()[0]) * 1024
    return out


class LiveNvml:
    """The real NVML through pynvml. Raises ``CannotProbe`` when NVML is absent."""

    description = "live NVML"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # nvidia-ml-py is a pinned dependency
            raise CannotProbe(f"pynvml (nvidia-ml-py) is not importable: {e}") from e
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise CannotProbe(f"cannot initialize NVML: {e} (no NVIDIA driver on this host?)"
                              ) from e
        self._handles: dict[int, Any] = {}

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nv.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def call(self, name: str, *args: int) -> Any:
        _check_call(name, args)
        kinds, convert = CALLS[name]
        try:
            real = [self._handle(a) if k == "dev" else a for k, a in zip(kinds, args,
                                                                        strict=True)]
            return convert(getattr(self._nv, name)(*real))
        except self._nv.NVMLError as e:
            raise NvmlCallError(int(e.value)) from e

    def watch_xid(self, count: int, seconds: float) -> dict[str, Any]:
        nv = self._nv
        registration: dict[str, Any] = {}
        events: list[dict[str, Any]] = []
        event_set = nv.nvmlEventSetCreate()
        try:
            for i in range(count):
                try:
                    nv.nvmlDeviceRegisterEvents(self._handle(i), XID_EVENT, event_set)
                    registration[str(i)] = None
                except nv.NVMLError as e:
                    registration[str(i)] = {"nvml_error": int(e.value)}
            start = time.monotonic()
            while seconds > 0 and (left := start + seconds - time.monotonic()) > 0:
                try:
                    data = nv.nvmlEventSetWait_v2(event_set, max(1, int(left * 1000)))
                except nv.NVMLError_Timeout:
                    break
                events.append({"gpu": int(nv.nvmlDeviceGetIndex(data.device)),
                               "event_type": int(data.eventType), "xid": int(data.eventData),
                               "t_s": round(time.monotonic() - start, 3)})
        finally:
            nv.nvmlEventSetFree(event_set)
        return {"seconds": seconds, "registration": registration, "events": events}

    def meminfo(self) -> dict[str, int]:
        return read_proc_meminfo()

    def close(self) -> None:
        self._nv.nvmlShutdown()


def _recorded_value(key: str, value: Any) -> Any:
    if isinstance(value, dict) and "nvml_error" in value:
        code = value["nvml_error"]
        if not isinstance(code, int):
            raise SnapshotError(f"{key}: nvml_error must be an integer NVML return code")
        raise NvmlCallError(code)
    return value


class RecordedNvml:
    """A snapshot file replayed as NVML: same probe, no driver needed."""

    def __init__(self, snapshot: dict[str, Any], description: str = "snapshot") -> None:
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(f"{description}: not a {SNAPSHOT_FORMAT} snapshot "
                                f"(format field is {snapshot.get('format')!r})"
                                if isinstance(snapshot, dict) else f"{description}: not an object")
        for field in ("calls", "xid_watch", "meminfo"):
            if field not in snapshot:
                raise SnapshotError(f"{description}: missing field {field!r}")
            if not isinstance(snapshot[field], dict):
                raise SnapshotError(f"{description}: {field} must be an object, got "
                                    f"{type(snapshot[field]).__name__}")
        self.snapshot = snapshot
        self.description = description

    @classmethod
    def load(cls, path: str | Path) -> RecordedNvml:
        try:
            data = json.loads(read_small(path, MAX_SNAPSHOT_BYTES, "snapshot"))
        except (FileRefused, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
            raise SnapshotError(f"cannot read snapshot {path}: {e}") from None
        return cls(data, f"snapshot {path}")

    def call(self, name: str, *args: int) -> Any:
        _check_call(name, args)
        key = call_key(name, args)
        if key not in self.snapshot["calls"]:
            raise SnapshotError(f"{self.description} has no recorded result for {key}")
        return _recorded_value(key, self.snapshot["calls"][key])

    def watch_xid(self, count: int, seconds: float) -> dict[str, Any]:
        # A recording carries its own watch window; the requested one cannot be replayed.
        return self.snapshot["xid_watch"]

    def meminfo(self) -> dict[str, int]:
        return self.snapshot["meminfo"]

    def close(self) -> None:
        pass


class Recorder:
    """Wraps a source and keeps every answer, to be written as a snapshot."""

    def __init__(self, source: Any, host: str) -> None:
        self._source = source
        self.description = f"{source.description} (recording)"
        self.snapshot: dict[str, Any] = {
            "format": SNAPSHOT_FORMAT, "host": host,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "calls": {}, "xid_watch": None, "meminfo": None,
        }

    def call(self, name: str, *args: int) -> Any:
        key = call_key(name, args)
        try:
            value = self._source.call(name, *args)
        except NvmlCallError as e:
            self.snapshot["calls"][key] = {"nvml_error": e.code, "name": e.name}
            raise
        self.snapshot["calls"][key] = value
        return value

    def watch_xid(self, count: int, seconds: float) -> dict[str, Any]:
        self.snapshot["xid_watch"] = self._source.watch_xid(count, seconds)
        return self.snapshot["xid_watch"]

    def meminfo(self) -> dict[str, int]:
        self.snapshot["meminfo"] = self._source.meminfo()
        return self.snapshot["meminfo"]

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.snapshot, indent=1, sort_keys=False) + "\n")

    def close(self) -> None:
        self._source.close()
