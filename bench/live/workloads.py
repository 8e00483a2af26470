"""The live benchmark's prompts, by workload.

Fixed prompts for now (issue 15 item 1's held-out corpus split is not in the tree yet): four
Python code prefixes to continue (``code``) and four docstring/comment openings
(``prose``), four each so that concurrency 4 sends four different prompts. Prompt i of
repetition r at concurrency c is ``prompts[(r * c + i) % 4]``: every configuration gets the
same prompts in the same repetition.
"""

from __future__ import annotations

__all__ = ["WORKLOADS", "prompts_for"]

WORKLOADS: dict[str, tuple[str, ...]] = {
    "code": (
        "def _read_header(stream, size):\n    data = stream.read(size)\n    if len(data) < size:\n",
        "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n",
        "import os\n\n\ndef walk_files(root):\n"
        "    for dirpath, dirnames, filenames in os.walk(root):\n",
        "    def __repr__(self):\n        args = ', '.join(f'{k}={v!r}' for k, v in\n",
    ),
    "prose": (
        '"""Return a new list containing all items from the iterable in ascending order.\n\n',
        "# The lock must be held while the queue is modified, because another thread may\n",
        '"""Parse a configuration file and return a dictionary mapping each section name to\n',
        "# This function is called when the connection is closed by the remote end; it\n",
    ),
}


def prompts_for(workload: str, rep: int, concurrency: int) -> list[str]:
    pool = WORKLOADS[workload]
    return [pool[(rep * concurrency + i) % len(pool)] for i in range(concurrency)]
