"""Whether the pair is whole after a move: every host records one release and runs it.

playbooks/tasks/summary.yml reads each host's release record and its service container, asks
these functions (through playbooks/filter_plugins/specpair_decisions.py) and writes the answer
into summary.json: each host's ``matches_record`` and the pair's ``pair_consistent``, which
`specpair deploy | rollback | restore` need for exit 0 and which decides whether a move's
intent is marked done (releases/README.md, "Exit codes" and "Recovery").

Pure functions over what Docker and the record said (no Ansible, no I/O): the unit tests
cover them in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Verdict", "healthy", "runs_record", "pair_verdict"]


@dataclass(frozen=True)
class Verdict:
    """The pair after a move, as summary.json's ``checks`` and ``pair_consistent`` say it."""

    one_release_recorded: bool  # every host's record names the same current release
    every_host_runs_its_record: bool  # runs_record holds on every host

    @property
    def whole(self) -> bool:
        """Both: the pair is consistent (whole) on its recorded release."""
        return self.one_release_recorded and self.every_host_runs_its_record


def healthy(state: Mapping[str, Any]) -> bool:
    """Docker's healthcheck verdict on a container's ``State`` is healthy now, or the container
    has no healthcheck. A restart-looping service is "starting" or "unhealthy", never healthy."""
    health = state.get("Health") or {}
    return health.get("Status", "healthy") == "healthy"


def runs_record(container: Mapping[str, Any], current: Any, image_id: str,
                enabled: bool) -> bool:
    """Whether a host runs exactly its recorded release.

    ``container`` is what docker_container_info answered for the host's service (``exists``,
    ``container``), ``current`` the record's current release (or None), ``image_id`` the
    recorded image's local ID ('' when the host has no image or the engine lacks it) and
    ``enabled`` whether the host runs a service at all. A host with a service must run it,
    not restarting, healthy, from that image ID and with the record's config hash; a host
    without one (the cpu profile's rank-1 worker) needs only the recorded image staged.
    """
    if not isinstance(current, Mapping) or not image_id:
        return False
    if not enabled:
        return True
    if not container.get("exists", False):
        return False
    info = container["container"]
    state = info["State"]
    labels = info.get("Config", {}).get("Labels") or {}
    return bool(state["Running"] and not state["Restarting"] and healthy(state)
                and info["Image"] == image_id
                and labels.get("specpair.config_hash") == current["config_hash"])


def pair_verdict(hosts: Mapping[str, Mapping[str, Any]]) -> Verdict:
    """The pair's verdict from each host's summary entry: ``record_current`` (the current
    release's name, or None) and ``matches_record`` (its ``runs_record``)."""
    return Verdict(
        one_release_recorded=len({h["record_current"] for h in hosts.values()}) == 1,
        every_host_runs_its_record=all(h["matches_record"] for h in hosts.values()))
