"""`specpair deploy | rollback | restore | gates | release`: the pair's deployment.

The first four run playbooks/{deploy,rollback,restore-pair,gates}.yml through ansible-runner
against an inventory (inventories/local or inventories/prod, or a path), print progress and a
final summary (or one JSON object with --json), and exit 0 only when the play succeeded and its
summary says the pair is consistent (restore: restored). Each holds the deploy lock
(specpair.deploy.lock) for its Ansible run; SIGINT/SIGTERM/SIGHUP end that run (exit 130).
deploy, rollback and restore first finish a move an earlier run left unfinished, forward or
back (playbooks/tasks/recover.yml), and print what they did (`recovery: ...`).
Production inventories need typed confirmation: --confirm NAME, or typing NAME at the prompt.
`specpair health --inventory INV` (the health group) calls `run_health_inventory` here.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from specpair.deploy import outcome, records, runner
from specpair.deploy.errors import DeployError
from specpair.deploy.inventory import Inventory
from specpair.deploy.lock import holder_record, holding, lock_dir
from specpair.deploy.release import (
    DRAFTER_MODES,
    MAX_DEPTH,
    PROFILES,
    Release,
    check_release_config,
    image_tag,
    load_release,
    resolve_image,
    write_release,
)
from specpair.deploy.release_ref import ReleaseRef
from specpair.deploy.report import print_summary
from specpair.deploy.runner import RunResult
from specpair.errors import EXIT_OK
from specpair.yamlio import YamlRefused, excerpt, loads_yaml

__all__ = ["add_parser", "add_inventory_argument", "run_health_inventory"]

_ACTIONS = {  # command -> (playbook, help)
    "deploy": ("deploy.yml", "deploy a release to the pair: health, stage by digest, stop old "
               "pair, start drafter then target, completion, in-image gates, commit; any "
               "failure puts the previous release back on every host"),
    "rollback": ("rollback.yml", "move the pair back to the previous recorded release "
                 "(same checks as deploy)"),
    "restore": ("restore-pair.yml", "after an experiment window, put the recorded release "
                "back on every host, verify it serves, write summary.json with pair_restored"),
    "gates": ("gates.yml", "run the in-image gates (pytest -m gate) of the recorded release "
              "on every host; JUnit XML fetched to the controller"),
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inventory", "-i", required=True, metavar="INV",
                   help="inventory: local, prod (inventories/<name>) or a path")
    p.add_argument("--json", action="store_true", help="print one JSON object (machines)")
    p.add_argument("--check", action="store_true",
                   help="ansible check mode: report, change nothing")
    p.add_argument("--confirm", metavar="NAME",
                   help="typed confirmation for a production inventory (its name)")
    p.add_argument("--tags", metavar="TAGS", help="only these playbook tags "
                   "(health, stage, start, verify, gates, record)")
    p.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE",
                   help="extra variable for the playbook (repeatable), e.g. "
                   "specpair_state_root=/tmp/state")


def add_inventory_argument(p: argparse.ArgumentParser) -> None:
    """`--inventory` for `specpair health`: probe every host of an inventory via health.yml."""
    p.add_argument("--inventory", metavar="INV",
                   help="probe every host of this inventory (local, prod or a path) through "
                   "playbooks/health.yml; reports land under build/deploy/<run>/reports")
    p.add_argument("--confirm", metavar="NAME", help="with --inventory: typed confirmation "
                   "for a production inventory")


def add_parser(sub: Any) -> None:
    for command, (playbook, text) in _ACTIONS.items():
        p = sub.add_parser(command, help=text, description=text[0].upper() + text[1:] + ".",
                           epilog=f"runs playbooks/{playbook}; exit 0 ok (the pair "
                           "consistent), 1 failed, 4 bad input (inventory, release, release "
                           "records, arguments: refused before Ansible starts), 6 another run "
                           "holds the deploy lock, 130 stopped by a signal (releases/README.md)")
        _common(p)
        if command == "deploy":
            p.add_argument("--release", "-r", required=True, metavar="NAME|FILE",
                           help="release name (releases/NAME.yml) or a release file")
        p.set_defaults(func=_run_action, action=command, playbook=playbook)
    _add_release_parser(sub)


def _add_release_parser(sub: Any) -> None:
    p = sub.add_parser("release", help="write or show a release file (images by digest + config)",
                       description="Release files name the pair's images by ID/digest and its "
                       "config; see specpair.deploy.release for the format.")
    rsub = p.add_subparsers(dest="release_command", metavar="COMMAND", required=True)
    new = rsub.add_parser("new", help="write releases/NAME.yml, resolving images to their IDs",
                          description="Resolve the target and drafter images in the local Docker "
                          "engine to their image IDs and write a release file.")
    new.add_argument("name", help="release name ([a-z0-9._-])")
    new.add_argument("--target", metavar="IMAGE", help="target image (tag or ID; default the "
                     "tag `make image` gives it: specpair-target:PROFILE-VERSION)")
    new.add_argument("--drafter", metavar="IMAGE", help="drafter image (tag or ID; default "
                     "specpair-drafter:PROFILE-VERSION)")
    new.add_argument("--target-profile", default="cpu", choices=PROFILES)
    new.add_argument("--drafter-profile", default="cpu", choices=PROFILES)
    new.add_argument("--depth", type=int, default=4, help=f"K, 1..{MAX_DEPTH} (default 4)")
    new.add_argument("--drafter-mode", default="sampled", choices=DRAFTER_MODES)
    new.add_argument("--set", action="append", default=[], metavar="KEY=YAML",
                     help="another config entry (repeatable), e.g. --set gate_size=quick")
    new.add_argument("--dir", default="releases", help="directory to write to (default releases)")
    new.set_defaults(func=_run_release_new)
    show = rsub.add_parser("show", help="check a release file and print it with its config hash")
    show.add_argument("file", help="release file")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=_run_release_show)


def _key_values(items: list[str], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DeployError(f"{what} {excerpt(item)}: expected KEY=VALUE")
        try:
            out[key] = loads_yaml(value, f"{what} {excerpt(key)}") if value else ""
        except YamlRefused as e:
            raise DeployError(str(e)) from None
    return out


def _run_action(args: argparse.Namespace) -> int:
    # deploy: the release is checked here, with its name or field named, before Ansible starts
    extravars = ReleaseRef.parse(args.release).playbook_vars() if args.action == "deploy" else {}
    return _run_playbook(args, args.playbook, args.action, extravars)


def run_health_inventory(args: argparse.Namespace) -> int:
    """`specpair health --inventory INV`: the probe on every host, via playbooks/health.yml."""
    args.extra_var = []
    return _run_playbook(args, "health.yml", "health", {})


def _run_playbook(args: argparse.Namespace, playbook: str, action: str,
                  extravars: dict[str, Any]) -> int:
    """Check what can be checked here (the inventory's files, the deploy's target settings,
    local hosts' release records), then run the playbook (a move or gates under the deploy
    lock) and report it."""
    root = runner.repo_root()
    inventory = Inventory.load(args.inventory, root)  # garbage, bombs, wrong types
    extravars = {**extravars, **_key_values(getattr(args, "extra_var", []), "--extra-var")}
    release = ReleaseRef.from_vars(extravars, root)  # as the playbook reads it (-e may override)
    if action == "deploy" and release is not None:
        inventory.check_target_settings(release.load().config["depth"])
    confirm = inventory.confirmation(args.confirm)
    if confirm is not None:
        extravars["confirm"] = confirm

    def run() -> RunResult:
        return runner.run_playbook(playbook, inventory.path, extravars,
                                   check=getattr(args, "check", False),
                                   tags=getattr(args, "tags", None), action=action,
                                   out=None if args.json else sys.stderr)

    if action == "health":
        return _report(args, action, inventory, run())
    local = inventory.local_records(root, extravars)
    records.check_local_records(local)
    holder = holder_record(action, inventory.name, release.name if release else None)
    with holding(lock_dir(root), inventory.lock_names(bool(local)), holder,
                 say=lambda text: print(f"specpair {action}: {text}", file=sys.stderr)):
        result = run()
    return _report(args, action, inventory, result)


def _report(args: argparse.Namespace, action: str, inventory: Inventory,
            result: RunResult) -> int:
    result = outcome.judge(action, result)
    step = outcome.next_step(action, result, str(args.inventory))
    if args.json:
        print(json.dumps({"action": action, "inventory": str(inventory.path), **result.to_json(),
                          "next_step": step}, indent=1))
    else:
        print_summary(action, result)
        if step:
            print(f"  next step: {step}")
    return outcome.exit_code(result)


def _run_release_new(args: argparse.Namespace) -> int:
    config = {"depth": args.depth, "drafter_mode": args.drafter_mode,
              **_key_values(args.set, "--set")}
    profiles = {"target": args.target_profile, "drafter": args.drafter_profile}
    check_release_config(args.name, profiles, config)  # before Docker is asked
    refs = {"target": args.target, "drafter": args.drafter}
    for role, ref in refs.items():
        if ref is None:  # the one tag scheme (images/bin/image-tag.sh)
            refs[role] = image_tag(role, profiles[role], runner.repo_root())
    release = Release(name=args.name, profiles=profiles,
                      images={role: resolve_image(ref) for role, ref in refs.items()},
                      config=config)
    path = write_release(release, args.dir, sources=refs)
    print(f"wrote {path} (config_hash {release.config_hash})")
    return EXIT_OK


def _run_release_show(args: argparse.Namespace) -> int:
    release = load_release(args.file)
    data = {**release.to_dict(), "config_hash": release.config_hash}
    text = json.dumps(data, indent=1) + "\n" if args.json else yaml.safe_dump(data, sort_keys=False)
    print(text, end="")
    return EXIT_OK
