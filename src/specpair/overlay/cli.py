"""`specpair overlay apply|verify|status|manifest|unpack`: the vLLM 0.32.0 overlay."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from specpair.overlay.errors import OverlayError

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser(
        "overlay", help="apply/verify the vLLM 0.32.0 overlay (hash-pinned patch series)",
        description="The vLLM 0.32.0 overlay: a numbered patch series with base and result "
        "sha256 pinned per build (cuda, cpu). Apply is all-or-nothing and writes an "
        "attestation to SITE/vllm/SPECPAIR_OVERLAY.json; verify re-checks it.")
    cmds = group.add_subparsers(dest="overlay_cmd", metavar="CMD", required=True)

    def common(p: argparse.ArgumentParser, site: bool = True) -> None:
        if site:
            p.add_argument("--site-packages", type=Path, required=True, metavar="DIR",
                           help="the site-packages directory holding vllm/")
        p.add_argument("--overlay", type=Path, default=None, metavar="DIR",
                       help="the overlay directory (default: $SPECPAIR_OVERLAY_DIR, else "
                       "overlays/vllm/0.32.0 of this checkout)")
        p.add_argument("--json", action="store_true", help="print a JSON report")

    p = cmds.add_parser("apply", help="check base hashes, apply the series, write the "
                        "attestation (a no-op when already applied)")
    common(p)
    p.add_argument("--exclude", action="append", default=[], metavar="NNNN",
                   help="leave patch NNNN out (power tests only; recorded in the attestation)")
    p.set_defaults(func=_apply)
    p = cmds.add_parser("verify", help="exit 0 only if the overlay is applied and every "
                        "result hash and the attestation match")
    common(p)
    p.set_defaults(func=_verify)
    p = cmds.add_parser("status", help="report clean / applied / drifted, per file")
    common(p)
    p.set_defaults(func=_status)
    p = cmds.add_parser("manifest", help="(maintainers) recompute manifest.json from the "
                        "pinned wheels and the patch files")
    common(p, site=False)
    p.set_defaults(func=_manifest)
    p = cmds.add_parser("unpack", help="fetch (cached) and unpack a pinned wheel's vllm/ "
                        "sources into DIR")
    common(p, site=False)
    p.add_argument("--variant", required=True,
                   help="cuda (x86_64; the aarch64 wheel is identical) or cpu")
    p.add_argument("--dest", type=Path, required=True, metavar="DIR",
                   help="where vllm/ and the dist-info are unpacked")
    p.set_defaults(func=_unpack)


def _manifest_of(args: argparse.Namespace):  # noqa: ANN202
    from specpair.overlay.manifest import DEFAULT_OVERLAY_DIR, load_manifest

    return load_manifest(args.overlay or DEFAULT_OVERLAY_DIR)


def _report(args: argparse.Namespace, ok: bool, payload: dict, text: str) -> int:
    if args.json:
        print(json.dumps({"ok": ok, **payload}, indent=2, sort_keys=True))
    else:
        print(text, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def _fail(args: argparse.Namespace, err: OverlayError) -> int:
    return _report(args, False, {"error": type(err).__name__, "message": str(err)},
                   f"error: {type(err).__name__}: {err}")


def _apply(args: argparse.Namespace) -> int:
    from specpair.overlay.apply_series import apply
    from specpair.overlay.attestation import attestation_path

    try:
        man = _manifest_of(args)
        att, changed = apply(args.site_packages, man, tuple(args.exclude))
    except OverlayError as err:
        return _fail(args, err)
    where = attestation_path(args.site_packages)
    msg = (f"applied {att.overlay_id} ({att.variant}, patches {list(att.applied)}"
           f"{', excluded ' + str(list(att.excluded)) if att.excluded else ''}); "
           f"every result sha256 matched; attestation {where}") if changed else (
           f"already applied: {att.overlay_id} ({att.variant}); nothing to do")
    return _report(args, True, {"changed": changed, "attestation": asdict(att),
                                "attestation_path": str(where)}, msg)


def _verify(args: argparse.Namespace) -> int:
    from specpair.overlay.status import verify

    try:
        st = verify(args.site_packages, _manifest_of(args))
    except OverlayError as err:
        return _fail(args, err)
    return _report(args, True, {"status": asdict(st)},
                   f"verified: {st.attestation.overlay_id} ({st.variant}); "
                   f"{len(st.files)} files match their pinned result sha256")


def _status(args: argparse.Namespace) -> int:
    from specpair.overlay.status import status

    try:
        st = status(args.site_packages, _manifest_of(args))
    except OverlayError as err:
        return _fail(args, err)
    lines = [f"{st.state} ({st.variant})"] + [f"  {v:>8}  {p}" for p, v in st.files.items()]
    lines += [f"  problem: {x}" for x in st.problems]
    return _report(args, st.state != "drifted", {"status": asdict(st)}, "\n".join(lines))


def _manifest(args: argparse.Namespace) -> int:
    from specpair.overlay.manifest import DEFAULT_OVERLAY_DIR
    from specpair.overlay.manifest_build import build_manifest

    directory = args.overlay or DEFAULT_OVERLAY_DIR
    try:
        raw = build_manifest(directory)
    except OverlayError as err:
        return _fail(args, err)
    (directory / "manifest.json").write_text(json.dumps(raw, indent=2) + "\n")
    return _report(args, True, {"manifest": raw}, f"wrote {directory / 'manifest.json'}")


def _unpack(args: argparse.Namespace) -> int:
    from specpair.overlay.wheels import ensure_wheel, unpack

    try:
        man = _manifest_of(args)
        if args.variant not in man.variants:
            raise OverlayError(f"unknown variant {args.variant!r}; known {sorted(man.variants)}")
        site = unpack(ensure_wheel(man.variants[args.variant].wheel), args.dest)
    except OverlayError as err:
        return _fail(args, err)
    return _report(args, True, {"site_packages": str(site)}, f"unpacked into {site}")
