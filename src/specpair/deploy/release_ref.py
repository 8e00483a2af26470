"""A release as a run names it: `--release NAME|FILE`, or the playbook's `release` /
`release_file` variables. Text -> name, file, release.

A name is the file releases/NAME.yml of the checkout (the playbook's specpair_release_dir); a
path is a release file anywhere. `specpair deploy` checks the release before Ansible starts,
passes it to the playbook, reads it back from the run's variables as the playbook will (an
`-e release_file=...` wins, as in roles/specpair_release) for the target-settings check, and
names it in the deploy lock's holder record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpair.deploy import runner
from specpair.deploy.errors import ReleaseError
from specpair.deploy.release import Release, is_release_name, load_release
from specpair.yamlio import excerpt

__all__ = ["ReleaseRef"]


@dataclass(frozen=True)
class ReleaseRef:
    """One named release."""

    name: str  # the release's name: NAME of releases/NAME.yml, or its file's stem
    path: Path  # its release file
    by_name: bool  # named (the playbook's `release`), not given as a file (`release_file`)

    @classmethod
    def parse(cls, text: str) -> ReleaseRef:
        """`--release NAME|FILE`, checked: a .yml/.yaml path or any existing file is a release
        file; anything else a name whose file releases/NAME.yml must exist (the known names
        listed when it does not). The release is loaded, so a bad field is refused here."""
        given = Path(text)
        if given.suffix in (".yml", ".yaml") or given.is_file():
            load_release(given)
            return cls(name=given.stem, path=given.resolve(), by_name=False)
        releases = runner.repo_root() / "releases"
        path = releases / f"{text}.yml"
        if not is_release_name(text) or not path.is_file():
            known = sorted(p.stem for p in releases.glob("*.yml") if is_release_name(p.stem))
            listed = ", ".join(known) if known else "none yet (make one: specpair release new)"
            raise ReleaseError(f"unknown release {excerpt(text)}: no file "
                               f"{releases}/{text[:64]}.yml; known releases: {listed}")
        load_release(path)
        return cls(name=text, path=path, by_name=True)

    @classmethod
    def from_vars(cls, extravars: dict[str, Any], root: Path) -> ReleaseRef | None:
        """The release a run's playbook variables name (None when they name none)."""
        if "release_file" in extravars:
            path = Path(str(extravars["release_file"]))
            return cls(name=path.stem, path=path, by_name=False)
        if "release" in extravars:
            name = str(extravars["release"])
            return cls(name=name, path=root / "releases" / f"{name}.yml", by_name=True)
        return None

    def load(self) -> Release:
        """The release file, read and checked (ReleaseError names the bad field)."""
        return load_release(self.path)

    def playbook_vars(self) -> dict[str, str]:
        """How the playbook is told: ``release`` (a name) or ``release_file`` (a path)."""
        return {"release": self.name} if self.by_name else {"release_file": str(self.path)}
