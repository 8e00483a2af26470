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
from pathlib import Path
from typing import Any

import yaml

from specpair.cli import one_line
from specpair.deploy.errors import DeployError, InventoryError, ReleaseError
from specpair.deploy.release import (
    DRAFTER_MODES,
    MAX_DEPTH,
    PROFILES,
    Release,
    check_release_config,
    image_tag,
    is_release_name,
    load_release,
    resolve_image,
    write_release,
)
from specpair.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from specpair.yamlio import YamlRefused, excerpt, load_yaml, loads_yaml

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


def _inventory_files(inventory: Path) -> dict[Path, Any]:
    """The inventory's YAML files, loaded under the limits: its hosts file (hosts.yml, or the
    inventory itself when it is a .yml file) a non-empty mapping, group_vars and host_vars files
    mappings or empty. An INI inventory file is Ansible's alone to read."""
    if inventory.is_dir():
        hosts = inventory / "hosts.yml"
        others = sorted(p for sub in ("group_vars", "host_vars")
                        for p in (inventory / sub).glob("*.y*ml") if p.is_file())
    elif inventory.suffix in (".yml", ".yaml"):
        hosts, others = inventory, []
    else:
        return {}
    out = {}
    for path in [hosts, *others]:
        try:
            data = load_yaml(path, "inventory file")
        except YamlRefused as e:
            raise InventoryError(str(e)) from None
        if not isinstance(data, dict | None) or (path == hosts and not data):
            want = "a non-empty mapping" if path == hosts else "a mapping"
            raise InventoryError(f"inventory file {path}: must be {want}, got "
                                 f"{type(data).__name__}")
        out[path] = data or {}
    return out


def _release_of(extravars: dict[str, Any], root: Path) -> Release:
    if "release_file" in extravars:
        return load_release(extravars["release_file"])
    return load_release(root / "releases" / f"{extravars['release']}.yml")


def _check_target_settings(files: dict[Path, Any], depth: int) -> None:
    """The specpair settings in the targets' ``specpair_service_env`` of the inventory's
    files (values Ansible templates, with ``{{``, are its to render), checked for a target
    that drafts up to ``depth`` tokens: the one-line refusal an engine start would end in."""
    from specpair.vllm.settings import BadTargetSetting, check

    for path, data in files.items():
        env = data.get("specpair_service_env")
        if not str(data.get("specpair_role", "")).startswith("target") or not isinstance(env,
                                                                                         dict):
            continue
        plain = {str(k): str(v) for k, v in env.items() if "{{" not in str(v)}
        try:
            check(plain, depth)
        except BadTargetSetting as e:
            raise InventoryError(f"inventory file {path}: specpair_service_env: {e}") from None


def _confirm(inventory: Path, given: str | None) -> str | None:
    """The confirmation to pass: --confirm, or typed at a prompt for a production inventory."""
    if given is not None:
        return given
    gv = inventory / "group_vars" / "all.yml"
    data = _inventory_files(inventory).get(gv, {}) if gv.is_file() else {}
    if not data or not data.get("specpair_confirm_required"):
        return None
    name = data.get("specpair_inventory_name", inventory.name)
    if not sys.stdin.isatty():
        raise DeployError(f"inventory {name} is production: pass --confirm {name}")
    return input(f"inventory {name} is production; type its name to continue: ").strip()


def _run_playbook(args: argparse.Namespace, playbook: str, action: str,
                  extravars: dict[str, Any]) -> int:
    from specpair.deploy.runner import repo_root, resolve_inventory, run_playbook

    try:
        root = repo_root()
        inventory = resolve_inventory(args.inventory, root)
        extravars = {**extravars, **_key_values(getattr(args, "extra_var", []), "--extra-var")}
        files = _inventory_files(inventory)  # garbage, bombs, wrong types: before Ansible
        if action == "deploy":
            _check_target_settings(files, _release_of(extravars, root).config["depth"])
        confirm = _confirm(inventory if inventory.is_dir() else inventory.parent, args.confirm)
        if confirm is not None:
            extravars["confirm"] = confirm
        if action != "health":
            from specpair.deploy.records import check_local_records

            check_local_records(inventory, root, extravars)
    except (DeployError, OSError) as e:
        print(f"specpair {action}: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if action == "health":
        result = run_playbook(playbook, inventory, extravars, check=getattr(args, "check", False),
                              tags=getattr(args, "tags", None), action=action,
                              out=None if args.json else sys.stderr)
        import dataclasses

        from specpair.deploy.report import health_summary

        result = dataclasses.replace(result, summary=health_summary(result.run_dir))
        return _report(args, action, inventory, result)
    from specpair.deploy.lock import Locked, holder_record, holding, lock_dir

    names, inv_name = _lock_names(inventory, root, extravars)
    release = extravars.get("release") or (Path(extravars["release_file"]).stem
                                            if "release_file" in extravars else None)
    try:
        with holding(lock_dir(root), names, holder_record(action, inv_name, release),
                     say=lambda t: print(f"specpair {action}: {t}", file=sys.stderr)):
            result = run_playbook(playbook, inventory, extravars,
                                  check=getattr(args, "check", False),
                                  tags=getattr(args, "tags", None), action=action,
                                  out=None if args.json else sys.stderr)
    except Locked as e:
        print(f"specpair {action}: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # the lock directory cannot be written
        print(f"specpair {action}: cannot take the deploy lock: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _report(args, action, inventory, result)


def _lock_names(inventory: Path, root: Path, extravars: dict[str, Any]) -> tuple[list[str], str]:
    """The deploy locks a run on `inventory` takes (specpair.deploy.lock), and its name."""
    import socket

    from specpair.deploy.records import local_record_paths

    directory = inventory if inventory.is_dir() else inventory.parent
    data = _inventory_files(inventory).get(directory / "group_vars" / "all.yml", {})
    name = str(data.get("specpair_inventory_name") or inventory)
    names = [f"inventory-{name}"]
    if local_record_paths(inventory, root, extravars):  # some pair host is this machine
        names.append(f"host-{socket.gethostname()}")
    return names, name


def _pair_failures(action: str, result: Any) -> list[str]:
    """Why a move whose play exited 0 still failed: the summary's pair not whole."""
    s = result.summary
    if action not in ("deploy", "rollback", "restore") or not s or s.get("check_mode"):
        return []
    out = []
    if not s.get("pair_consistent"):
        bad = sorted(h for h, e in (s.get("hosts") or {}).items() if not e.get("matches_record"))
        out.append(f"pair consistent: NO after the play (hosts not running their recorded "
                   f"release healthy: {', '.join(bad) or 'none'}; recorded "
                   f"{s.get('recorded_release')})")
    if action == "restore" and not s.get("pair_restored"):
        why = ("no real completion was served through the pair" if s.get("completion") is None
               else "the pair is not whole" if not s.get("pair_consistent") else "a step failed")
        out.append(f"pair_restored is false: {why}")
    return out


def _next_step(action: str, result: Any, inventory: str) -> str | None:
    """The command to run after a run that did not succeed."""
    if result.rc == 0 and result.status != "canceled":
        return None
    s = result.summary or {}
    restore = f"specpair restore -i {inventory}"
    if result.status == "canceled":
        return (f"the run was stopped before it finished, the pair may be split: {restore} "
                "(puts the recorded release back on every host)")
    if action == "gates":
        return f"read the gate failures above; `specpair gates -i {inventory}` runs them again"
    if s and not s.get("pair_consistent"):
        return (f"{restore} (finishes the interrupted move, forward or back, then puts the "
                "recorded release back on every host: releases/README.md, 'Recovery')")
    if action == "restore":
        return f"fix the failure above, then {restore} again"
    return (f"the pair is whole on its recorded release; fix the failure above and run "
            f"{action} again")


def _report(args: argparse.Namespace, action: str, inventory: Path, result: Any) -> int:
    extra = _pair_failures(action, result) if result.rc == 0 else []
    if extra:
        import dataclasses

        result = dataclasses.replace(result, rc=1, status="failed",
                                     failures=[*result.failures, *extra])
    step = _next_step(action, result, str(args.inventory))
    if args.json:
        print(json.dumps({"action": action, "inventory": str(inventory), **result.to_json(),
                          "next_step": step}, indent=1))
    else:
        from specpair.deploy.report import print_summary

        print_summary(action, result)
        if step:
            print(f"  next step: {step}")
    if result.status == "canceled":
        return EXIT_INTERRUPTED
    return EXIT_OK if result.rc == 0 else EXIT_FAILED


def _run_action(args: argparse.Namespace) -> int:
    extravars: dict[str, Any] = {}
    if args.action == "deploy":
        try:  # fail here, with the release or field named, before ansible starts
            extravars = _release_vars(args.release)
        except DeployError as e:
            print(f"specpair deploy: {one_line(e)}", file=sys.stderr)
            return EXIT_BAD_INPUT
    return _run_playbook(args, args.playbook, args.action, extravars)


def _release_vars(ref_text: str) -> dict[str, Any]:
    """The playbook's release variables for --release NAME|FILE, after checking the release."""
    from specpair.deploy.runner import repo_root

    ref = Path(ref_text)
    if ref.suffix in (".yml", ".yaml") or ref.is_file():
        load_release(ref)
        return {"release_file": str(ref.resolve())}
    releases = repo_root() / "releases"  # the playbook's specpair_release_dir
    known = sorted(p.stem for p in releases.glob("*.yml") if is_release_name(p.stem))
    if not is_release_name(ref_text) or not (releases / f"{ref_text}.yml").is_file():
        listed = ", ".join(known) if known else "none yet (make one: specpair release new)"
        raise ReleaseError(f"unknown release {excerpt(ref_text)}: no file "
                           f"{releases}/{ref_text[:64]}.yml; known releases: {listed}")
    load_release(releases / f"{ref_text}.yml")
    return {"release": ref_text}


def run_health_inventory(args: argparse.Namespace) -> int:
    """`specpair health --inventory INV`: the probe on every host, via playbooks/health.yml."""
    args.extra_var = []
    return _run_playbook(args, "health.yml", "health", {})


def _run_release_new(args: argparse.Namespace) -> int:
    try:
        config = {"depth": args.depth, "drafter_mode": args.drafter_mode,
                  **_key_values(args.set, "--set")}
        profiles = {"target": args.target_profile, "drafter": args.drafter_profile}
        check_release_config(args.name, profiles, config)  # before Docker is asked
        refs = {"target": args.target, "drafter": args.drafter}
        for role, ref in refs.items():
            if ref is None:  # the one tag scheme (scripts/image-tag.sh)
                from specpair.deploy.runner import repo_root

                refs[role] = image_tag(role, profiles[role], repo_root())
        release = Release(name=args.name, profiles=profiles,
                          images={role: resolve_image(ref) for role, ref in refs.items()},
                          config=config)
        path = write_release(release, args.dir, sources=refs)
    except DeployError as e:
        print(f"specpair release new: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {path} (config_hash {release.config_hash})")
    return EXIT_OK


def _run_release_show(args: argparse.Namespace) -> int:
    try:
        release = load_release(args.file)
    except DeployError as e:
        print(f"specpair release show: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    data = {**release.to_dict(), "config_hash": release.config_hash}
    text = json.dumps(data, indent=1) + "\n" if args.json else yaml.safe_dump(data, sort_keys=False)
    print(text, end="")
    return EXIT_OK
