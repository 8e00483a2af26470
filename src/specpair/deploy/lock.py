"""One run at a time: the deploy lock of `specpair deploy | rollback | restore | gates`.

Each run holds, for its whole Ansible run, an exclusive flock(2) on

- ``inventory-<name>.lock``: one per inventory (``specpair_inventory_name``), on the controller;
- ``host-<machine>.lock``: one per machine that the inventory reaches with
  ``ansible_connection: local`` (for inventories/local the controller is every host, so the
  three hosts share this machine's lock, and a second inventory pointing at this machine is
  refused too).

in the lock directory (``$SPECPAIR_LOCK_DIR``, else ``<checkout>/build/deploy/locks``). Each
file holds a JSON holder record ``{pid, host, action, release, inventory, since}``, written
once the flock is taken and emptied when the run ends. A second run does not wait: it is
refused at once (exit 6, one line) naming the holder. flock is released by the kernel when its
holder dies, so a holder record left behind by a killed run (its pid no longer alive on this
host) is taken over and said so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpair.deploy.errors import DeployError
from specpair.errors import EXIT_BUSY

__all__ = ["Locked", "DeployLock", "holding", "lock_dir", "describe"]


class Locked(DeployError):
    """Another run holds the deploy lock."""

    exit_code = EXIT_BUSY


def lock_dir(root: Path) -> Path:
    env = os.environ.get("SPECPAIR_LOCK_DIR")
    return Path(env) if env else root / "build" / "deploy" / "locks"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100] or "_"


def _alive(pid: Any) -> bool:
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def describe(holder: dict[str, Any]) -> str:
    """'pid 123 on host h (deploy of release a, inventory local, since 2026-...Z)'."""
    what = holder.get("action", "?")
    rel = holder.get("release")
    what += f" of release {rel}" if rel else ""
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} ({what}, inventory "
            f"{holder.get('inventory', '?')}, since {holder.get('since', '?')})")


def _read_holder(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16)
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return {"pid": "?", "host": "?", "action": "unreadable holder record"}
    return data if isinstance(data, dict) else None


@dataclass
class DeployLock:
    """An exclusive, non-blocking flock on one lock file with a JSON holder record."""

    path: Path
    fd: int = -1
    took_over: dict[str, Any] | None = None  # the stale holder record this run replaced

    def acquire(self, holder: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # O_CLOEXEC: Python's default
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _read_holder(fd) or {"pid": "?", "host": "?", "action": "a run starting"}
            os.close(fd)
            gone = (other.get("host") == holder["host"] and not _alive(other.get("pid")))
            tail = (" (that pid is gone, but a process it started still holds the lock: "
                    "wait for it or end it)" if gone else "")
            raise Locked(f"another run holds the deploy lock {self.path}: "
                         f"{describe(other)}{tail}; nothing was changed") from None
        previous = _read_holder(fd)
        if previous is not None:  # a run that died without emptying its record
            self.took_over = previous
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(holder, sort_keys=True) + "\n").encode())
        os.fsync(fd)
        self.fd = fd

    def release(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing the only descriptor releases the flock
        self.fd = -1


def holder_record(action: str, inventory: str, release: str | None) -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "action": action,
            "release": release, "inventory": inventory,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


@contextlib.contextmanager
def holding(directory: Path, names: list[str], holder: dict[str, Any],
            say: Any = None) -> Iterator[list[DeployLock]]:
    """Take every lock in `names` (sorted, so two runs never deadlock) or none; `say(text)` is
    told of each stale holder taken over. A lock directory that cannot be written is refused
    as a DeployError naming it."""
    locks: list[DeployLock] = []
    try:
        for name in sorted(set(names)):
            lock = DeployLock(directory / f"{_safe(name)}.lock")
            try:
                lock.acquire(holder)
            except OSError as e:
                raise DeployError(f"cannot take the deploy lock: {e}") from None
            locks.append(lock)
            if lock.took_over is not None and say is not None:
                state = ("no longer running" if not _alive(lock.took_over.get("pid"))
                         or lock.took_over.get("host") != holder["host"]
                         else "its lock was free")
                say(f"took over the stale deploy lock {lock.path} from "
                    f"{describe(lock.took_over)}: {state}")
        yield locks
    finally:
        for lock in reversed(locks):
            lock.release()
