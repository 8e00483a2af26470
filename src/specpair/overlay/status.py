"""What a site-packages holds with respect to the overlay: variant, per-file state, verdict."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specpair.overlay.attestation import Attestation, read_attestation
from specpair.overlay.errors import ResultMismatch, WrongVllm
from specpair.overlay.manifest import Manifest, sha256_file

__all__ = ["Status", "detect_variant", "status", "verify"]


@dataclass(frozen=True)
class Status:
    """The state of a site-packages with respect to the overlay."""

    state: str  # "clean" | "applied" | "drifted"
    variant: str  # detected variant
    attestation: Attestation | None  # parsed attestation, if any
    files: dict[str, str]  # path -> "base" | "result" | "unknown:<sha256>"
    problems: tuple[str, ...]  # human-readable reasons when drifted


def detect_variant(site: Path, man: Manifest) -> str:
    """The variant whose identity files match; WrongVllm naming what was found."""
    if not (site / "vllm" / "__init__.py").is_file():
        raise WrongVllm(f"no vllm package under {site}")
    version_file = site / "vllm" / "_version.py"
    for name, v in man.variants.items():
        if all((site / p).is_file() and sha256_file(site / p) == h for p, h in v.identity.items()):
            return name
    found = ""
    if version_file.is_file():
        found = version_file.read_text().split("__version__", 1)[-1][:40]
    raise WrongVllm(
        f"{site}/vllm is not a vLLM {man.vllm_version} build the overlay knows "
        f"(variants {sorted(man.variants)}; vllm/_version.py says {found.strip()!r})"
    )


def status(site: Path, man: Manifest) -> Status:
    """Classify every touched file and cross-check the attestation."""
    variant = detect_variant(site, man)
    att = read_attestation(site)
    exclude = att.excluded if att else ()
    files: dict[str, str] = {}
    problems: list[str] = []
    for path, entry in man.files.items():
        got = sha256_file(site / path) if (site / path).is_file() else "missing"
        if got == entry.base[variant]:
            files[path] = "base"
        elif got == entry.result[variant]:
            files[path] = "result"
        else:
            files[path] = f"unknown:{got}"
        want = man.expected_after(path, variant, exclude) if att else entry.base[variant]
        if got != want:
            problems.append(f"{path}: sha256 {got}, expected {want}")
    if att is not None:
        if att.overlay_id != man.overlay_id or att.variant != variant:
            problems.append(
                f"attestation is for {att.overlay_id}/{att.variant}, "
                f"this overlay is {man.overlay_id}/{variant}"
            )
        for path, h in att.files.items():
            if path not in man.files or h["result"] != man.expected_after(path, variant, exclude):
                problems.append(f"attestation lists {path} with result {h['result']}")
    state = "drifted" if problems else ("applied" if att else "clean")
    return Status(state, variant, att, files, tuple(problems))


def verify(site: Path, man: Manifest) -> Status:
    """The status, raising ResultMismatch unless the overlay is applied and intact."""
    st = status(site, man)
    if st.state != "applied":
        why = "; ".join(st.problems) or "no attestation (overlay not applied)"
        raise ResultMismatch(f"{site}: overlay {man.overlay_id} not verified: {why}")
    return st
