"""The inventory a `specpair deploy | rollback | restore | gates` or `specpair health
--inventory` run names, read before Ansible starts.

What the CLI knows of an inventory has this one owner: where it is (inventories/<name>, or a
path), its YAML files loaded under the limits (garbage, bombs and wrong types refused naming
the file, instead of Ansible's own text), its name, whether it needs typed confirmation, the
deploy locks a run on it takes (specpair.deploy.lock), the specpair settings it gives the
target, and which pair hosts this machine reaches itself (``ansible_connection: local``, as
every host of inventories/local), whose release records the CLI can check before Ansible runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpair.deploy.errors import DeployError, InventoryError
from specpair.vllm.settings import BadTargetSetting, check
from specpair.yamlio import YamlRefused, excerpt, load_yaml

__all__ = ["Inventory"]


@dataclass(frozen=True)
class Inventory:
    """An inventory, its YAML files loaded and checked."""

    path: Path  # what Ansible is given: a directory holding hosts.yml, or an inventory file
    files: dict[Path, Any]  # its YAML files (hosts, group_vars, host_vars) -> their mappings
    settings: dict[str, Any]  # the group_vars/all.yml beside it ({} without one)

    @classmethod
    def load(cls, name_or_path: str, root: Path) -> Inventory:
        """inventories/<name> of the checkout at ``root`` for a bare name (local, prod), else
        the directory or file given; its YAML files loaded and checked."""
        path = _resolve(name_or_path, root)
        files = _load_files(path)
        directory = path if path.is_dir() else path.parent
        all_vars = directory / "group_vars" / "all.yml"
        if all_vars in files:
            settings = files[all_vars]
        else:  # an inventory file: Ansible reads the group_vars beside it too
            settings = _mapping(all_vars, hosts=False) if all_vars.is_file() else {}
        return cls(path=path, files=files, settings=settings)

    @property
    def name(self) -> str:
        """``specpair_inventory_name`` (local, prod), else the inventory's path."""
        return str(self.settings.get("specpair_inventory_name") or self.path)

    def confirmation(self, given: str | None) -> str | None:
        """What the playbook gets as ``confirm``: --confirm as given; for a production
        inventory (``specpair_confirm_required``) without it, its name typed at the terminal
        (refused without one); None when no confirmation is needed."""
        if given is not None:
            return given
        if not self.settings.get("specpair_confirm_required"):
            return None
        if not sys.stdin.isatty():
            raise DeployError(f"inventory {self.name} is production: pass --confirm {self.name}")
        return input(f"inventory {self.name} is production; type its name to continue: ").strip()

    def check_target_settings(self, depth: int) -> None:
        """The specpair settings in the targets' ``specpair_service_env`` (values Ansible
        templates, with ``{{``, are its to render), checked for a target that drafts up to
        ``depth`` tokens: the one-line refusal the engine's start would otherwise end in."""
        for path, data in self.files.items():
            env = data.get("specpair_service_env")
            if not str(data.get("specpair_role", "")).startswith("target") or not isinstance(
                    env, dict):
                continue
            plain = {str(k): str(v) for k, v in env.items() if "{{" not in str(v)}
            try:
                check(plain, depth)
            except BadTargetSetting as e:
                raise InventoryError(f"inventory file {path}: specpair_service_env: {e}") from None

    def local_records(self, root: Path, extravars: dict[str, Any]) -> list[tuple[str, Path]]:
        """(host, release.json path) of every pair host this machine reaches itself.

        Ansible's inventory API runs in a child process: importing Ansible patches interpreter
        globals (``sys.intern``) that break a later torch import in the same process."""
        args = json.dumps({"inventory": str(self.path), "root": str(root),
                           "extravars": extravars})
        run = subprocess.run([sys.executable, "-c", _CHILD], input=args, capture_output=True,
                             text=True, timeout=120, check=False)
        if run.returncode != 0:
            lines = (run.stderr.strip() or f"exit {run.returncode}").splitlines()
            raise DeployError(f"cannot read the inventory {self.path}: {excerpt(lines[-1])}")
        return [(host, Path(path)) for host, path in json.loads(run.stdout)]

    def lock_names(self, reaches_here: bool) -> list[str]:
        """The deploy locks a run takes: the inventory's, and this machine's when some pair
        host is this machine (``reaches_here``: ``local_records`` found one)."""
        return [f"inventory-{self.name}", *([f"host-{socket.gethostname()}"] if reaches_here
                                            else [])]


def _resolve(name_or_path: str, root: Path) -> Path:
    p = Path(name_or_path)
    bare = not (p.is_absolute() or os.sep in name_or_path)
    candidates = [root / "inventories" / p, p] if bare else [p]
    for c in candidates:
        if (c.is_dir() and (c / "hosts.yml").is_file()) or c.is_file():
            return c.resolve()
    known = sorted(d.name for d in (root / "inventories").iterdir() if d.is_dir())
    raise InventoryError(f"no inventory {name_or_path!r}: give one of {known} or a path")


def _load_files(inventory: Path) -> dict[Path, Any]:
    """The inventory's YAML files, loaded under the limits: its hosts file (hosts.yml, or the
    inventory itself when it is a .yml file) a non-empty mapping, group_vars and host_vars
    files mappings or empty. An INI inventory file is Ansible's alone to read."""
    if inventory.is_dir():
        hosts = inventory / "hosts.yml"
        others = sorted(p for sub in ("group_vars", "host_vars")
                        for p in (inventory / sub).glob("*.y*ml") if p.is_file())
    elif inventory.suffix in (".yml", ".yaml"):
        hosts, others = inventory, []
    else:
        return {}
    return {path: _mapping(path, hosts=path == hosts) for path in [hosts, *others]}


def _mapping(path: Path, hosts: bool) -> dict[str, Any]:
    """One inventory file: a mapping ({} when empty); a hosts file (``hosts``) not empty."""
    try:
        data = load_yaml(path, "inventory file")
    except YamlRefused as e:
        raise InventoryError(str(e)) from None
    if not isinstance(data, dict | None) or (hosts and not data):
        want = "a non-empty mapping" if hosts else "a mapping"
        raise InventoryError(f"inventory file {path}: must be {want}, got {type(data).__name__}")
    return data or {}


_CHILD = """
import json, sys
from pathlib import Path
from specpair.deploy.inventory import _paths_here
a = json.loads(sys.stdin.read())
print(json.dumps([(h, str(p)) for h, p in _paths_here(Path(a["inventory"]), Path(a["root"]),
                                                      a["extravars"])]))
"""


def _paths_here(inventory: Path, root: Path, extravars: dict[str, Any]
                ) -> list[tuple[str, Path]]:
    """``Inventory.local_records`` in this process (the child's side)."""
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
