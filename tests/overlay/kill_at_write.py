"""`specpair overlay apply` that SIGKILLs itself at its Nth write under a site-packages.

    python kill_at_write.py SITE N    # N = 0: never; prints the writes counted to stderr

A write is what an audit hook sees (sys.addaudithook, before the call runs) on a path under
SITE: an open for writing (builtin open and os.open), a rename/replace, a remove, a chmod,
a mkdir. Killing at N means writes 1..N-1 happened and write N did not: every point
between two of apply's file-system steps, with nothing in apply knowing about it.
"""

from __future__ import annotations

import os
import signal
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
WRITE_EVENTS = {"os.rename", "os.remove", "os.chmod", "os.mkdir", "os.truncate"}


def main() -> int:
    site, kill_at = os.path.realpath(sys.argv[1]), int(sys.argv[2])
    count = 0

    def hook(event: str, args: tuple) -> None:
        nonlocal count
        if event == "open":
            path, writes = args[0], bool(args[2] & WRITE_FLAGS)
        elif event in WRITE_EVENTS:
            path, writes = args[0], True
        else:
            return
        if not writes or not isinstance(path, str | bytes | os.PathLike):
            return
        if not os.path.realpath(os.fsdecode(path)).startswith(site + os.sep):
            return
        count += 1
        if count == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    from specpair.cli import main as specpair

    sys.addaudithook(hook)
    code = specpair(["overlay", "apply", "--site-packages", site])
    print(f"writes {count}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
