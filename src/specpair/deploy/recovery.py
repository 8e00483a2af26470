"""Finishing a move a kill interrupted: which move, forward or back, and why.

deploy, rollback and restore share one recovery path (playbooks/tasks/recover.yml), run after
every host's release record is read and before anything moves. The playbook reads what these
functions need (the intent of the last move on the controller, each host's record, each
service's container), asks them through playbooks/filter_plugins/specpair_decisions.py, and
writes the chosen record on every host. The rules (releases/README.md, "Recovery"):

- An intent not ``done`` (playbooks/tasks/intent.yml) is an interrupted move. Without one,
  host records that disagree are one when exactly two records exist and one is the other's
  successor (its ``previous`` is the other's ``current``): a kill between the hosts' record
  writes, so the move was committing. Records that disagree otherwise are refused: nothing
  tells which release the pair agreed on.
- The move is finished FORWARD to its release when its records were being committed (phase
  ``commit``: every host had passed health, completion and gates) and every host runs that
  release now, healthy and not restarting; otherwise BACK to the record every host agreed on
  before it.

Pure functions over the records, the intent and what Docker said (no Ansible, no I/O): the
unit tests cover every case the kill sweep (tests/deploy/test_deploy_recovery.py) can leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specpair.deploy.errors import RecordsDisagree
from specpair.deploy.verdict import healthy

__all__ = ["Move", "Recovery", "interrupted_move", "runs_healthy", "finish"]


@dataclass(frozen=True)
class Move:
    """A move that did not finish."""

    before: dict[str, Any]  # the release record every host agreed on before the move
    to: dict[str, Any]  # the release it was moving to
    committing: bool  # its records were being written: every host had passed its checks
    found: str  # how it was found, as the summary says it ("an unfinished deploy (run ...)")


@dataclass(frozen=True)
class Recovery:
    """How an interrupted move is finished."""

    forward: bool  # to the move's release; False: back to the record before it
    record: dict[str, Any]  # the release record then written on every host
    why: str  # one line for the summary's `recovery`: what was found, what was done, why


def _name(release: Any, none: str) -> Any:
    return release.get("name", none) if isinstance(release, Mapping) else none


def _names(records: Mapping[str, Any]) -> dict[str, Any]:
    """Host -> the name of the release its record holds as current ('none' for none)."""
    return {host: _name(record["current"], "none") for host, record in records.items()}


def _successor(distinct: list[Any]) -> tuple[Any, Any] | None:
    """(older, newer) when the two distinct records are a move's before and after."""
    if len(distinct) != 2:
        return None
    for older, newer in (distinct, distinct[::-1]):
        if isinstance(newer["current"], Mapping) and newer["previous"] == older["current"]:
            return older, newer
    return None


def interrupted_move(intent: Any, records: Mapping[str, Any]) -> Move | None:
    """The move to finish, or None when the last move finished.

    ``intent`` is the intent file's JSON (None when there is none), ``records`` each pair
    host's release record in play order. Raises RecordsDisagree for records that disagree
    with no unfinished intent and no successor relation between them (edited by hand).
    """
    if isinstance(intent, Mapping) and intent.get("phase", "done") != "done":
        return Move(before=intent["before"], to=intent["to"],
                    committing=intent["phase"] == "commit",
                    found=f"an unfinished {intent['action']} (run {intent['run']}, phase "
                          f"{intent['phase']})")
    distinct: list[Any] = []
    for record in records.values():
        if record not in distinct:
            distinct.append(record)
    if len(distinct) == 1:
        return None
    pair = _successor(distinct)
    if pair is None:
        raise RecordsDisagree(
            "the hosts' release records disagree and no unfinished move explains it: "
            f"{_names(records)}; copy the release.json of the host that records the release "
            "you want onto the others, then run restore")
    older, newer = pair
    return Move(before=older, to=newer["current"], committing=True,
                found=f"release records that disagree {_names(records)}")


def runs_healthy(container: Mapping[str, Any], matches: bool, enabled: bool) -> bool:
    """Whether a host runs the move's release healthy: the service role's inspect found its
    container running that release (``matches``: image reference, config hash, release name)
    and Docker has it neither restarting nor unhealthy. ``container`` is the inspect's
    docker_container_info answer; a host without a service (``enabled`` false) counts."""
    if not matches:
        return False
    if not enabled:
        return True
    state = container["container"]["State"]
    return not state["Restarting"] and healthy(state)


def finish(move: Move, runs_new: Mapping[str, bool]) -> Recovery:
    """Forward or back, from which hosts (play order) run the move's release healthy."""
    behind = [host for host, ok in runs_new.items() if not ok]
    forward = move.committing and not behind
    before = move.before
    head = (f"found {move.found} of release {move.to['name']} from "
            f"{_name(before['current'], 'none')}: ")
    if forward:
        previous = before["current"] if before["current"] != move.to else before["previous"]
        return Recovery(forward=True,
                        record={"schema": 1, "current": move.to, "previous": previous},
                        why=f"{head}rolled FORWARD to {move.to['name']} on every host: its "
                            "records were being committed and every host runs it healthy")
    why = ("not every host runs it healthy (" + ", ".join(behind) + ")" if move.committing
           else "its records were not being committed yet")
    return Recovery(forward=False, record=before,
                    why=f"{head}rolled BACK to {_name(before['current'], 'no release')} on "
                        f"every host: {why}")
