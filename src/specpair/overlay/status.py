"""What a site-packages holds with respect to the overlay: variant, per-file state, verdict.

States:
- clean: every touched file at its pinned base, no attestation;
- partial: an apply was interrupted: every file at its base or its pinned result, no
  attestation (``apply`` completes it; the pending record says with which exclusions);
- applied: the attestation, and every file at the hash it records;
- drifted: anything else (a file at neither hash, an attestation the files contradict).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from specpair.overlay.attestation import (
    Attestation,
    attestation_path,
    pending_path,
    read_attestation,
)
from specpair.overlay.errors import ResultMismatch, WrongVllm
from specpair.overlay.manifest import Manifest, sha256_file
from specpair.overlay.tree_writes import strays

__all__ = ["Status", "detect_variant", "declared_version", "status", "verify"]


@dataclass(frozen=True)
class Status:
    """The state of a site-packages with respect to the overlay."""

    state: str  # "clean" | "partial" | "applied" | "drifted"
    variant: str  # detected variant
    attestation: Attestation | None  # parsed attestation, if any
    pending: Attestation | None  # an interrupted apply's intent, if any
    files: dict[str, str]  # path -> "base" | "result" | "unknown:<sha256>" | "unknown:missing"
    problems: tuple[str, ...]  # human-readable reasons when drifted
    strays: tuple[str, ...]  # leftovers of an interrupted apply (apply removes them)
    advice: str  # what to do next, one line ("" when nothing is to be done)


def declared_version(site: Path) -> str:
    """``__version__`` as vllm/_version.py assigns it (read, never imported)."""
    try:
        tree = ast.parse((site / "vllm" / "_version.py").read_bytes())
    except (OSError, SyntaxError, ValueError):
        return "unknown (no readable vllm/_version.py)"
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            v = node.value.value
            return v if re.fullmatch(r"[\w.+!-]{1,40}", v) else repr(v[:40])
    return "unknown (vllm/_version.py assigns no __version__)"


def detect_variant(site: Path, man: Manifest) -> str:
    """The variant whose identity files match; WrongVllm naming what was found."""
    if not (site / "vllm" / "__init__.py").is_file():
        raise WrongVllm(f"no vllm package under {site}")
    for name, v in man.variants.items():
        if all((site / p).is_file() and sha256_file(site / p) == h for p, h in v.identity.items()):
            return name
    found = declared_version(site)
    builds = ", ".join(sorted(man.variants))
    if found != man.vllm_version:
        raise WrongVllm(f"{site}/vllm is vLLM {found}; this overlay fits vLLM "
                        f"{man.vllm_version} only (builds {builds})")
    identity = sorted({p for v in man.variants.values() for p in v.identity})
    raise WrongVllm(f"{site}/vllm is vLLM {found} but not a build this overlay knows (builds "
                    f"{builds}; its {' and '.join(identity)} match none)")


def _apply_command(site: Path, exclude: tuple[str, ...]) -> str:
    return (f"`specpair overlay apply --site-packages {site}"
            + "".join(f" --exclude {p}" for p in exclude) + "`")


def status(site: Path, man: Manifest) -> Status:
    """Classify every touched file, cross-check the attestation, say what to do next."""
    variant = detect_variant(site, man)
    problems: list[str] = []
    leftovers = strays(site, [*man.files, f"vllm/{attestation_path(site).name}",
                              f"vllm/{pending_path(site).name}"], list(man.files))
    try:
        att = read_attestation(attestation_path(site))
    except ValueError as err:
        att = None
        problems.append(f"attestation {err}")
    try:
        pending = read_attestation(pending_path(site))
    except ValueError:  # only its exclusions matter, and the files are checked anyway
        pending = None
        leftovers.append(pending_path(site))
    if att is not None and pending is not None:  # a finished apply's intent: stale
        leftovers.append(pending_path(site))
    exclude = att.excluded if att else pending.excluded if pending else ()
    files: dict[str, str] = {}
    for path, entry in man.files.items():
        got = sha256_file(site / path) if (site / path).is_file() else "missing"
        files[path] = ("base" if got == entry.base[variant] else
                       "result" if got == entry.result[variant] else f"unknown:{got}")
        want = man.expected_after(path, variant, exclude)
        if att is not None and got != want:
            problems.append(f"{path}: sha256 {got}, expected {want}")
        elif att is None and got not in (entry.base[variant], want):
            problems.append(f"{path}: sha256 {got}, expected base {entry.base[variant]}"
                            + (f" or result {want}" if want != entry.base[variant] else ""))
    if att is not None:
        if att.overlay_id != man.overlay_id or att.variant != variant:
            problems.append(f"attestation is for {att.overlay_id}/{att.variant}, "
                            f"this overlay is {man.overlay_id}/{variant}")
        for path, h in att.files.items():
            if path not in man.files or h["result"] != man.expected_after(path, variant, exclude):
                problems.append(f"attestation lists {path} with result {h['result']}")
    patched = sum(v == "result" for v in files.values())
    if problems:
        state = "drifted"
        advice = (f"reinstall vLLM {man.vllm_version} (its wheel's files), then run "
                  f"{_apply_command(site, ())}")
    elif att is not None:
        state, advice = "applied", (f"run {_apply_command(site, exclude)} to remove the "
                                    "leftovers" if leftovers else "")
    elif pending is not None or patched:
        state = "partial"
        advice = (f"an apply was interrupted ({patched} of {len(files)} files patched, no "
                  f"attestation): run {_apply_command(site, exclude)} to complete it")
    else:
        state = "clean"
        advice = f"run {_apply_command(site, ())} to apply the overlay"
    return Status(state, variant, att, pending, files, tuple(problems),
                  tuple(str(p.relative_to(site)) for p in leftovers), advice)


def verify(site: Path, man: Manifest) -> Status:
    """The status, raising ResultMismatch unless the overlay is applied and intact."""
    st = status(site, man)
    if st.state != "applied":
        why = "; ".join(st.problems) or f"{st.state}: {st.advice}"
        raise ResultMismatch(f"{site}: overlay {man.overlay_id} not verified: {why}")
    return st
