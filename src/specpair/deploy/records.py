"""Release records the controller can read, checked before Ansible starts.

Every host of the pair keeps ``release.json`` in its state directory (roles/specpair_release:
``{"schema": 1, "current": RELEASE | null, "previous": RELEASE | null}``, RELEASE being a
release's name, profiles, images and config plus its ``config_hash``). For hosts reached with
``ansible_connection: local`` (inventories/local) that file is on this machine: `specpair deploy
| rollback | restore | gates` read it first and refuse a damaged one with its path and what is
wrong, instead of Ansible's filter text. Remote hosts' records are checked by the playbook's own
read (roles/specpair_release/tasks/read.yml), which fails as cleanly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specpair.deploy.errors import DeployError
from specpair.deploy.release import config_hash, parse_release
from specpair.files import FileRefused, read_small
from specpair.yamlio import excerpt

__all__ = ["RecordError", "MAX_RECORD_BYTES", "check_record", "check_local_records"]

MAX_RECORD_BYTES = 1 << 20  # a record is two releases: a few kB
_HINT = "restore it from a backup, or remove it to start with no recorded release"


class RecordError(DeployError, ValueError):
    """A host's release record (release.json) is damaged."""


def _entry(value: Any, field: str, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise RecordError(f"{where}: {field} must be a release or null, got {excerpt(value)}")
    release = {k: v for k, v in value.items() if k != "config_hash"}
    try:
        r = parse_release(release, f"{where}: {field}")
    except DeployError as e:
        raise RecordError(str(e)) from None
    if value.get("config_hash") != r.config_hash:
        raise RecordError(f"{where}: {field}.config_hash is {excerpt(value.get('config_hash'))}, "
                          f"but its config hashes to {config_hash(r.config)}")


def check_record(path: Path) -> None:
    """Refuse a damaged release record (an absent one means nothing was deployed)."""
    if not path.exists() and not path.is_symlink():
        return
    where = f"release record {path} is damaged"
    try:
        data = json.loads(read_small(path, MAX_RECORD_BYTES, "release record"))
    except FileRefused as e:
        raise RecordError(f"{e}; {_HINT}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RecordError(f"{where}: not JSON ({e}); {_HINT}") from None
    if not isinstance(data, dict) or not {"current", "previous"} <= set(data):
        raise RecordError(f"{where}: it must be a JSON object with current and previous; "
                          f"{_HINT}")
    try:
        for field in ("current", "previous"):
            _entry(data[field], field, where)
    except RecordError as e:
        raise RecordError(f"{e}; {_HINT}") from None


def check_local_records(hosts: list[tuple[str, Path]]) -> None:
    """Refuse a damaged release record on any pair host this machine reaches locally: the
    (host, release.json path) pairs of specpair.deploy.inventory's ``local_records``."""
    for _host, path in hosts:
        check_record(path)
