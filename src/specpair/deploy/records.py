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
import subprocess
import sys
from pathlib import Path
from typing import Any

from specpair.deploy.errors import DeployError
from specpair.deploy.release import config_hash, parse_release
from specpair.files import FileRefused, read_small
from specpair.yamlio import excerpt

__all__ = ["RecordError", "MAX_RECORD_BYTES", "check_record", "local_record_paths",
           "check_local_records"]

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


def local_record_paths(inventory: Path, root: Path, extravars: dict[str, Any]
                       ) -> list[tuple[str, Path]]:
    """(host, release.json path) of every pair host this machine reaches locally.

    Ansible's inventory API runs in a child process: importing Ansible patches interpreter
    globals (``sys.intern``) that break a later torch import in the same process."""
    args = json.dumps({"inventory": str(inventory), "root": str(root), "extravars": extravars})
    run = subprocess.run([sys.executable, "-c", _CHILD], input=args, capture_output=True,
                         text=True, timeout=120, check=False)
    if run.returncode != 0:
        lines = (run.stderr.strip() or f"exit {run.returncode}").splitlines()
        raise DeployError(f"cannot read the inventory {inventory}: {excerpt(lines[-1])}")
    return [(host, Path(path)) for host, path in json.loads(run.stdout)]


_CHILD = """
import json, sys
from pathlib import Path
from specpair.deploy.records import _paths_here
a = json.loads(sys.stdin.read())
print(json.dumps([(h, str(p)) for h, p in _paths_here(Path(a["inventory"]), Path(a["root"]),
                                                      a["extravars"])]))
"""


def _paths_here(inventory: Path, root: Path, extravars: dict[str, Any]
                ) -> list[tuple[str, Path]]:
    """``local_record_paths`` in this process (the child's side)."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(inventory)])
    variables = VariableManager(loader=loader, inventory=hosts)
    out = []
    for host in hosts.get_hosts("pair"):
        hv = {**variables.get_vars(host=host), "playbook_dir": str(root / "playbooks"),
              **extravars}
        if hv.get("ansible_connection") != "local" or "specpair_release_state_dir" not in hv:
            continue
        try:
            state = Templar(loader=loader, variables=hv).template(hv["specpair_release_state_dir"])
        except AnsibleError:  # a value only the play can know: leave it to the play's check
            continue
        if isinstance(state, str) and "{{" not in state:
            out.append((host.name, Path(state) / "release.json"))
    return out


def check_local_records(inventory: Path, root: Path, extravars: dict[str, Any]) -> None:
    """Refuse a damaged release record on any pair host this machine reaches locally."""
    for _host, path in local_record_paths(inventory, root, extravars):
        check_record(path)
