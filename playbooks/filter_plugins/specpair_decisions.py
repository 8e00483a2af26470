"""The playbooks' filters for the decisions of a move: the tasks read (slurp, Docker) and write,
Python decides. The decisions live in specpair.deploy.recovery (finish an interrupted move
forward or back, or refuse records nobody can explain; playbooks/tasks/recover.yml) and
specpair.deploy.verdict (is the pair whole; playbooks/tasks/summary.yml), unit-tested there.

Ansible loads this file from playbooks/filter_plugins/, beside the playbooks that use it. The
decisions are imported from this checkout's src/ first, so the playbooks and the code that
decides for them come from one commit whichever Python runs ansible-playbook (`specpair
deploy` runs the venv's, where specpair is installed from the checkout anyway).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_SRC = str(Path(__file__).resolve().parents[2] / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from specpair.deploy.errors import RecordsDisagree  # noqa: E402
from specpair.deploy.recovery import Move, finish, interrupted_move, runs_healthy  # noqa: E402
from specpair.deploy.verdict import pair_verdict, runs_record  # noqa: E402


def _plain(value: Any) -> Any:
    """``value`` as plain dicts and lists: Ansible passes its own lazy containers, which
    dataclasses.asdict cannot copy."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _interrupted_move(intent: Any, records: Mapping[str, Any]) -> dict[str, Any]:
    """{move: the move to finish (Move's fields) or None, refused: why the records are refused,
    or ''}: the refusal is the play's own assert (one failure, on the first host)."""
    try:
        move = interrupted_move(_plain(intent), _plain(records))
    except RecordsDisagree as e:
        return {"move": None, "refused": str(e)}
    return {"move": dataclasses.asdict(move) if move else None, "refused": ""}


def _recovery(move: Mapping[str, Any], runs_new: Mapping[str, bool]) -> dict[str, Any]:
    """Recovery's fields (forward, record, why) for a move from _interrupted_move."""
    return dataclasses.asdict(finish(Move(**_plain(move)), _plain(runs_new)))


def _runs_healthy(container: Mapping[str, Any], matches: bool, enabled: bool) -> bool:
    return runs_healthy(_plain(container), matches, enabled)


def _runs_record(container: Mapping[str, Any], current: Any, image_id: str,
                 enabled: bool) -> bool:
    return runs_record(_plain(container), _plain(current), image_id, enabled)


def _pair_verdict(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, bool]:
    """Verdict's fields and whole."""
    verdict = pair_verdict(_plain(hosts))
    return {**dataclasses.asdict(verdict), "whole": verdict.whole}


class FilterModule:
    """specpair_interrupted_move, specpair_runs_healthy, specpair_recovery (recover.yml);
    specpair_runs_record, specpair_pair_verdict (summary.yml)."""

    def filters(self) -> dict[str, Any]:
        return {"specpair_interrupted_move": _interrupted_move,
                "specpair_runs_healthy": _runs_healthy,
                "specpair_recovery": _recovery,
                "specpair_runs_record": _runs_record,
                "specpair_pair_verdict": _pair_verdict}
