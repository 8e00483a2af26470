"""The live NVML access layer (`LiveNvml`) against a stand-in pynvml module.

No GPU here, so the stand-in answers from a snapshot with pynvml's raw types (bytes
strings, tuples, a memory struct, NVMLError subclasses carrying `.value`, an event set
that times out). The live layer must turn those into exactly what a snapshot holds, so
the probe sees the same report either way. The real library runs in the gpu-marked test.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from specpair.health.errors import CannotProbe
from specpair.health.nvml import CALLS, LiveNvml, RecordedNvml, call_key
from specpair.health.probe import probe

SNAPS = Path(__file__).parent / "snapshots"


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeTimeout(FakeNVMLError):
    pass


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def fake_pynvml(snapshot: dict, init_error: int | None = None) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVMLError, m.NVMLError_Timeout = FakeNVMLError, FakeTimeout
    events = list(snapshot["xid_watch"]["events"])
    registered: list[tuple[int, int]] = []

    def init() -> None:
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def raw(name: str):
        def fn(*args):
            key = call_key(name, tuple(a.index if isinstance(a, Handle) else a for a in args))
            v = snapshot["calls"][key]
            if isinstance(v, dict) and "nvml_error" in v:
                raise FakeNVMLError(v["nvml_error"])
            if isinstance(v, str):
                return v.encode()
            if name == "nvmlDeviceGetMemoryInfo":
                return types.SimpleNamespace(**v)
            if isinstance(v, list):
                return tuple(v)
            return v
        return fn

    for name in CALLS:
        setattr(m, name, raw(name))

    def wait(event_set, timeout_ms):
        if not events:
            raise FakeTimeout(10)
        e = events.pop(0)
        return types.SimpleNamespace(device=Handle(e["gpu"]), eventType=8, eventData=e["xid"])

    m.nvmlInit, m.nvmlShutdown = init, lambda: None
    m.nvmlDeviceGetHandleByIndex = Handle
    m.nvmlDeviceGetIndex = lambda h: h.index
    m.nvmlEventSetCreate = lambda: object()
    m.nvmlEventSetFree = lambda es: None
    m.nvmlDeviceRegisterEvents = lambda h, mask, es: registered.append((h.index, mask))
    m.nvmlEventSetWait_v2 = wait
    m.registered = registered
    return m


@pytest.mark.parametrize("name", ["rtx3090_pair_healthy", "gb10_sparkhead_healthy",
                                  "fault_xid79", "fault_row_remap_failure"])
def test_live_layer_reads_what_a_snapshot_holds(monkeypatch, name):
    snap = json.loads((SNAPS / f"{name}.json").read_text())
    fake = fake_pynvml(snap)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    live = LiveNvml()
    monkeypatch.setattr(live, "meminfo", lambda: snap["meminfo"])  # not this machine's
    got = probe(live, snap["host"], 0.2)
    want = probe(RecordedNvml(snap), snap["host"], 0.2)
    assert got.gpus == want.gpus and got.p2p == want.p2p and got.driver == want.driver
    assert [(e.gpu, e.xid) for e in got.xid.events] == [(e.gpu, e.xid) for e in want.xid.events]
    assert got.xid.seconds == 0.2
    assert fake.registered == [(i, 0x8) for i in range(len(got.gpus))]  # Xid events only


def test_nvml_init_failure_cannot_probe(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml({"xid_watch": {"events": []},
                                                            "calls": {}}, init_error=9))
    with pytest.raises(CannotProbe, match="cannot initialize NVML"):
        LiveNvml()


def test_real_meminfo_parses():
    from specpair.health.nvml import read_proc_meminfo

    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo on this OS")
    m = read_proc_meminfo()
    assert m["MemTotal"] > m["MemAvailable"] > 0
