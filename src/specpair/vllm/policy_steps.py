"""The depth policy's step log: every step it could time, one JSON line, to read its fitted
step times against what each step cost (docs/performance.md, "Adaptive policy").

Off unless ``SPECPAIR_POLICY_STEPS`` names a file; the engine appends to it. A line: ``t``
(the policy's clock), ``depth`` (the step's largest depth asked for), ``prev`` (the step
before it's), ``gap_s`` (from this step's start to the next's), ``round_s`` (its PROPOSE
round; null: none), ``work_s`` (the drafting protocol's own time at the step on the drafting
rank, the round included: what speculation costs a step beside the target's forward and
verify; null where the policy runs without it, as in tests), ``requests``, ``joined`` (a
request joined: its prefill is in the gap, so the policy does not time it), ``pinned`` (a
request outside the adaptive estimates: not timed either), ``greedy`` and ``truncated``
(every request greedy; any under top-p or top-k), ``favoured`` (the depth the adaptive
estimates favoured; another ``depth``: a probe's or a pinned request's; null: no adaptive
request), and what it was favoured from (null with it): ``rest_ms`` and ``round_ms`` (the
fitted rest of the step and PROPOSE round at each depth 0..K) and ``accept`` (the step's
adaptive requests' mean a_1..a_K), ``pid``. A file that cannot be opened or written is
logged once and the engine runs on without the log.
``summary`` groups the lines (``python -m bench.live.trace --steps``).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections.abc import Iterable, Mapping
from typing import IO, Any

__all__ = ["ENV", "StepLog", "summary"]

ENV = "SPECPAIR_POLICY_STEPS"

log = logging.getLogger(__name__)


class StepLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = None
        try:
            self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            log.warning("%s=%s: cannot open it (%s); the policy's steps are not logged",
                        ENV, path, exc.strerror or exc)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StepLog | None:
        path = env.get(ENV, "")
        return cls(path) if path else None

    def write(self, **fields: Any) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps({**fields, "pid": os.getpid()}) + "\n")
        except (OSError, ValueError) as exc:  # a full disk, a closed file: stop logging
            log.warning("%s=%s: cannot write to it (%s); the policy's steps are no longer "
                        "logged", ENV, self.path, exc)
            self._file = None


def summary(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Per (truncated, greedy, requests, pinned, prev, depth): the steps no request joined,
    their count and median rest (gap less round), round and drafting work (None where no
    step logged it), in ms; sorted by those keys."""
    groups: dict[tuple, list[tuple[float, float, float | None]]] = {}
    for line in lines:
        s = json.loads(line)
        if s["joined"]:
            continue
        key = (s["truncated"], s["greedy"], s["requests"], s["pinned"], s["prev"], s["depth"])
        rnd = s["round_s"] or 0.0
        groups.setdefault(key, []).append((s["gap_s"] - rnd, rnd, s.get("work_s")))
    names = ("truncated", "greedy", "requests", "pinned", "prev", "depth")
    return [dict(zip(names, key, strict=True), steps=len(v),
                 rest_ms=1e3 * statistics.median(r for r, _, _ in v),
                 round_ms=1e3 * statistics.median(r for _, r, _ in v),
                 work_ms=_median_ms([w for _, _, w in v if w is not None]))
            for key, v in sorted(groups.items())]


def _median_ms(seconds: list[float]) -> float | None:
    return 1e3 * statistics.median(seconds) if seconds else None
