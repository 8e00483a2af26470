"""`specpair overlay apply|verify|status|manifest|unpack`: the vLLM 0.32.0 overlay."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from specpair.errors import EXIT_BAD_INPUT
from specpair.overlay.errors import (
    BadExclusion,
    BadOverlay,
    CannotWrite,
    OverlayError,
    PatchFormatError,
    WheelHashMismatch,
    WheelUnavailable,
    WrongVllm,
)

__all__ = ["add_parser", "EXIT_OK", "EXIT_REFUSED", "EXIT_WRONG_VLLM",
           "EXIT_CANNOT_WRITE", "EXIT_BAD_OVERLAY"]

EXIT_OK = 0  # done; status: clean or applied
EXIT_REFUSED = 1  # the tree is not in the state asked for (drifted, partial, not applied, ...)
# 4 (docs/cli.md: bad input): bad arguments; a --site-packages with no vLLM or not a 0.32.0 build
# the overlay knows; a tree that cannot be read or written (read-only, not this user's, a symlink
# leaving the tree, an I/O error)
EXIT_WRONG_VLLM = EXIT_CANNOT_WRITE = EXIT_BAD_INPUT
EXIT_BAD_OVERLAY = 5  # the overlay directory or a pinned wheel does not match its pins

EXIT_CODES = (
    "exit codes: 0 done (status: clean or applied); 1 not in the state asked for: verify finds "
    "the overlay not applied or drifted, status reports partial or drifted, apply refuses a "
    "file at neither its pinned base nor its result, or other exclusions than the tree "
    "carries; 4 bad input: bad arguments, no vLLM 0.32.0 build the overlay knows (the "
    "version found is named), or a tree it cannot read or write (read-only, not this "
    "user's, a directory whose symlink leads outside --site-packages, an I/O error); 5 the "
    "overlay directory or "
    "a pinned wheel does not match its pins")


def add_parser(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser(
        "overlay", help="apply/verify the vLLM 0.32.0 overlay (hash-pinned patch series)",
        description="The vLLM 0.32.0 overlay: a numbered patch series with base and result "
        "sha256 pinned per build (cuda, cpu). Apply checks everything before writing, is "
        "crash-safe (after a kill, a re-run completes it) and writes an attestation to "
        "SITE/vllm/SPECPAIR_OVERLAY.json last; verify re-checks it.", epilog=EXIT_CODES)
    cmds = group.add_subparsers(dest="overlay_cmd", metavar="CMD", required=True)

    def command(name: str, text: str, func: Callable[[argparse.Namespace], int],
                site: bool = True) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=text, description=text, epilog=EXIT_CODES)
        if site:
            p.add_argument("--site-packages", type=Path, required=True, metavar="DIR",
                           help="the site-packages directory holding vllm/")
        p.add_argument("--overlay", type=Path, default=None, metavar="DIR",
                       help="the overlay directory (default: $SPECPAIR_OVERLAY_DIR, else "
                       "overlays/vllm/0.32.0 of this checkout)")
        p.add_argument("--json", action="store_true", help="print a JSON report")
        p.set_defaults(func=lambda args: _guarded(args, func))
        return p

    p = command("apply", "check every base hash, apply the series, write the attestation "
                "(a no-op when already applied; completes an interrupted apply)", _apply)
    p.add_argument("--exclude", action="append", default=[], metavar="NNNN",
                   help="leave patch NNNN out (power tests only; recorded in the attestation)")
    command("verify", "exit 0 only if the overlay is applied and every result hash and the "
            "attestation match", _verify)
    command("status", "report clean / partial / applied / drifted, per file, and what to do "
            "next", _status)
    command("manifest", "(maintainers) recompute manifest.json from the pinned wheels and the "
            "patch files", _manifest, site=False)
    p = command("unpack", "fetch (cached) and unpack a pinned wheel's vllm/ sources into DIR",
                _unpack, site=False)
    p.add_argument("--variant", required=True,
                   help="cuda (x86_64; the aarch64 wheel is identical) or cpu")
    p.add_argument("--dest", type=Path, required=True, metavar="DIR",
                   help="where vllm/ and the dist-info are unpacked")


def _exit_code(err: OverlayError) -> int:
    if isinstance(err, WrongVllm):
        return EXIT_WRONG_VLLM
    if isinstance(err, CannotWrite):
        return EXIT_CANNOT_WRITE
    if isinstance(err, BadOverlay | PatchFormatError | WheelHashMismatch | WheelUnavailable):
        return EXIT_BAD_OVERLAY
    if isinstance(err, BadExclusion):
        return EXIT_BAD_INPUT
    return EXIT_REFUSED


def _guarded(args: argparse.Namespace, func: Callable[[argparse.Namespace], int]) -> int:
    """Run one command; every failure is one line (or one JSON object) and its exit code."""
    try:
        return func(args)
    except OverlayError as err:
        return _fail(args, type(err).__name__, str(err), _exit_code(err))
    except OSError as err:  # reading the tree (writes are CannotWrite already)
        where = f"{err.filename}: " if err.filename else ""
        return _fail(args, type(err).__name__, f"{where}{err.strerror or err}",
                     EXIT_CANNOT_WRITE)


def _manifest_of(args: argparse.Namespace):  # noqa: ANN202
    from specpair.overlay.manifest import DEFAULT_OVERLAY_DIR, load_manifest

    return load_manifest(args.overlay or DEFAULT_OVERLAY_DIR)


def _report(args: argparse.Namespace, code: int, payload: dict, text: str) -> int:
    if args.json:
        print(json.dumps({"ok": code == EXIT_OK, "exit_code": code, **payload}, indent=2,
                         sort_keys=True))
    else:
        print(text, file=sys.stdout if code == EXIT_OK else sys.stderr)
    return code


def _fail(args: argparse.Namespace, kind: str, message: str, code: int) -> int:
    one_line = " ".join(message.split())
    return _report(args, code, {"error": kind, "message": one_line},
                   f"error: {kind}: {one_line}")


def _apply(args: argparse.Namespace) -> int:
    from specpair.overlay.apply_series import apply
    from specpair.overlay.attestation import attestation_path

    att, changed = apply(args.site_packages, _manifest_of(args), tuple(args.exclude))
    where = attestation_path(args.site_packages)
    msg = (f"applied {att.overlay_id} ({att.variant}, patches {list(att.applied)}"
           f"{', excluded ' + str(list(att.excluded)) if att.excluded else ''}); "
           f"every result sha256 matched; attestation {where}") if changed else (
           f"already applied: {att.overlay_id} ({att.variant}); nothing to do")
    return _report(args, EXIT_OK, {"changed": changed, "attestation": asdict(att),
                                   "attestation_path": str(where)}, msg)


def _verify(args: argparse.Namespace) -> int:
    from specpair.overlay.status import verify

    st = verify(args.site_packages, _manifest_of(args))
    return _report(args, EXIT_OK, {"status": asdict(st)},
                   f"verified: {st.attestation.overlay_id} ({st.variant}); "
                   f"{len(st.files)} files match their pinned result sha256")


def _status(args: argparse.Namespace) -> int:
    from specpair.overlay.status import status

    st = status(args.site_packages, _manifest_of(args))
    lines = [f"{st.state} ({st.variant})"] + [f"  {v:>8}  {p}" for p, v in st.files.items()]
    lines += [f"  problem: {x}" for x in st.problems]
    lines += [f"  leftover: {x}" for x in st.strays]
    lines += [f"  next: {st.advice}"] if st.advice else []
    code = EXIT_OK if st.state in ("clean", "applied") else EXIT_REFUSED
    return _report(args, code, {"status": asdict(st)}, "\n".join(lines))


def _manifest(args: argparse.Namespace) -> int:
    from specpair.overlay.manifest import DEFAULT_OVERLAY_DIR
    from specpair.overlay.manifest_build import build_manifest

    directory = args.overlay or DEFAULT_OVERLAY_DIR
    raw = build_manifest(directory)
    (directory / "manifest.json").write_text(json.dumps(raw, indent=2) + "\n")
    return _report(args, EXIT_OK, {"manifest": raw}, f"wrote {directory / 'manifest.json'}")


def _unpack(args: argparse.Namespace) -> int:
    from specpair.overlay.wheels import ensure_wheel, unpack

    man = _manifest_of(args)
    if args.variant not in man.variants:
        return _fail(args, "UnknownVariant", f"unknown variant {args.variant!r}; known "
                     f"{sorted(man.variants)}", EXIT_BAD_INPUT)
    site = unpack(ensure_wheel(man.variants[args.variant].wheel), args.dest)
    return _report(args, EXIT_OK, {"site_packages": str(site)}, f"unpacked into {site}")
