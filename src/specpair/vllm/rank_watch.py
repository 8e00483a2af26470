"""A headless tensor-parallel rank exits when its head goes away, so its restart policy brings
it back to join the head's next start.

vLLM cannot go on with a rank lost. When the headless rank dies, the head's engine fails and
both containers restart together. But when the head dies, the headless rank stays attached to
the dead head and the restarted head waits for it forever (measured on `make up TP=2`:
docs/operations.md, "Restart policies"). The signal used here is the rank's own TCP connection
to the head's rendezvous (``--master-addr``/``--master-port``, the head's TCPStore, which
every rank keeps open for its process group's life): once the rank's process tree holds an
ESTABLISHED connection there, its loss for ``grace_s`` means the head is gone, and the
process exits with EXIT_HEAD_GONE. Read from /proc (Linux), a connection is this process
tree's when its socket inode is among the tree's open files.

The same connection is the headless rank's health (it has no HTTP port): ``python -m
specpair.vllm.rank_watch ADDR PORT`` exits 0 when the container's process tree (PID 1) holds it
(the rank joined its head) and 1 when not (not yet joined, or the head is gone): the deploy
role's health check of rank 1 (inventories/*/group_vars/sparkworker.yml).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

__all__ = ["EXIT_HEAD_GONE", "connected_to", "main", "watch_head"]

log = logging.getLogger(__name__)

EXIT_HEAD_GONE = 75  # the head went away: restart me (EX_TEMPFAIL)
_ESTABLISHED = "01"


def _tree(root: int) -> set[int]:
    """``root`` and every process below it."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {root}, True
    while grew:
        more = {p for p, pp in parents.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return inodes


def _remote(hex_addr: str) -> tuple[bytes, int]:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    # /proc/net/tcp writes each 32-bit word of the address in host (little-endian) order
    ip_bytes = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ip_bytes, int(port, 16)


def connected_to(addr: str, port: int, root: int | None = None) -> bool:
    """Whether the process tree of ``root`` (this process) holds an ESTABLISHED TCP connection
    to ``addr``:``port``."""
    want4 = socket.inet_aton(socket.gethostbyname(addr))
    # the head's address as IPv4 and as IPv4-mapped IPv6, with its port
    wanted = {(want4, port), (b"\0" * 10 + b"\xff\xff" + want4, port)}
    inodes = _socket_inodes(_tree(os.getpid() if root is None else root))
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == _ESTABLISHED and f[9] in inodes and _remote(f[2]) in wanted:
                return True
    return False


def watch_head(addr: str, port: int, every_s: float = 2.0, grace_s: float = 6.0,
               exit_=os._exit) -> threading.Thread:
    """Start a daemon thread that calls ``exit_(EXIT_HEAD_GONE)`` once this process tree's
    connection to the head at ``addr``:``port``, held once, has been gone for ``grace_s``."""

    def run() -> None:
        joined, lost_since = False, None
        while True:
            up = connected_to(addr, port)
            now = time.monotonic()
            if up:
                if not joined:
                    log.info("specpair: joined the head at %s:%d; this rank exits if it goes "
                             "away", addr, port)
                joined, lost_since = True, None
            elif joined:
                lost_since = now if lost_since is None else lost_since
                if now - lost_since >= grace_s:
                    log.error("specpair: the head at %s:%d went away (no connection for "
                              "%.0f s); exiting (%d) so that this rank restarts and joins its "
                              "next start", addr, port, grace_s, EXIT_HEAD_GONE)
                    exit_(EXIT_HEAD_GONE)
                    return
            time.sleep(every_s)

    t = threading.Thread(target=run, name="specpair-rank-watch", daemon=True)
    t.start()
    return t


def main(argv: list[str] | None = None) -> int:
    """Health of a headless rank: 0 when the process tree of ``--pid`` holds its connection to
    the head at ADDR:PORT, 1 when it does not, 2 when the address does not resolve; one line."""
    p = argparse.ArgumentParser(
        prog="python -m specpair.vllm.rank_watch",
        description="Exit 0 when this headless tensor-parallel rank is joined to its head (an "
                    "ESTABLISHED connection to the head's rendezvous port, read from /proc), "
                    "1 when it is not: the health check of a rank with no HTTP port.")
    p.add_argument("addr", help="the head's --master-addr")
    p.add_argument("port", type=int, help="the head's --master-port")
    p.add_argument("--pid", type=int, default=1,
                   help="root of the rank's process tree (default 1: the container's process)")
    args = p.parse_args(argv)
    try:
        joined = connected_to(args.addr, args.port, root=args.pid)
    except OSError as e:  # an address that does not resolve
        print(f"error: cannot check the head at {args.addr}:{args.port}: {e}", file=sys.stderr)
        return 2
    if joined:
        print(f"joined: the rank holds a connection to its head at {args.addr}:{args.port}")
        return 0
    print(f"not joined: no connection to the head at {args.addr}:{args.port}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
