"""Apply, verify and report the vLLM overlay on a site-packages directory.

Apply is all-or-nothing: every base hash is checked before anything is
written, the series is applied in memory, every result hash and every patched
module's byte-compilation is checked, and only then are files replaced; any
failure while writing restores the originals. The attestation
(``<site-packages>/vllm/SPECPAIR_OVERLAY.json``, see ATTESTATION_NAME) records
what was applied and is what ``verify`` re-checks inside an image.
"""

from __future__ import annotations

import json
import os
import py_compile
from dataclasses import asdict, dataclass
from pathlib import Path

from specpair import __version__ as specpair_version
from specpair.vllm.errors import BaseDrift, OverlayError, ResultMismatch, WrongVllm
from specpair.vllm.manifest import Manifest, sha256_bytes, sha256_file
from specpair.vllm.patchfile import apply_file_patch

__all__ = [
    "ATTESTATION_NAME",
    "Attestation",
    "Status",
    "attestation_path",
    "detect_variant",
    "status",
    "apply",
    "verify",
]

ATTESTATION_NAME = "SPECPAIR_OVERLAY.json"  # inside <site-packages>/vllm/


@dataclass(frozen=True)
class Attestation:
    """What an apply did; written as JSON next to the patched vLLM."""

    overlay_id: str  # manifest overlay_id
    vllm_version: str  # e.g. "0.32.0"
    variant: str  # "cuda" or "cpu"
    specpair_version: str  # the specpair that applied it
    applied: tuple[str, ...]  # patch ids applied, in order
    excluded: tuple[str, ...]  # patch ids left out (power tests only)
    files: dict[str, dict[str, str]]  # path -> {"base": sha256, "result": sha256}


@dataclass(frozen=True)
class Status:
    """The state of a site-packages with respect to the overlay."""

    state: str  # "clean" | "applied" | "drifted"
    variant: str  # detected variant
    attestation: Attestation | None  # parsed attestation, if any
    files: dict[str, str]  # path -> "base" | "result" | "unknown:<sha256>"
    problems: tuple[str, ...]  # human-readable reasons when drifted


def attestation_path(site: Path) -> Path:
    return site / "vllm" / ATTESTATION_NAME


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


def _read_attestation(site: Path) -> Attestation | None:
    path = attestation_path(site)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    raw["applied"] = tuple(raw["applied"])
    raw["excluded"] = tuple(raw["excluded"])
    return Attestation(**raw)


def status(site: Path, man: Manifest) -> Status:
    """Classify every touched file and cross-check the attestation."""
    variant = detect_variant(site, man)
    att = _read_attestation(site)
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


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.specpair-tmp")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def apply(site: Path, man: Manifest, exclude: tuple[str, ...] = ()) -> tuple[Attestation, bool]:
    """Apply the series (minus ``exclude``). Returns (attestation, changed).

    ``changed`` is False when the same overlay was already applied (a no-op).
    Raises BaseDrift / ResultMismatch / PatchConflict / OverlayError with the tree untouched.
    """
    exclude = tuple(sorted(set(exclude)))
    man.check_exclusion(exclude)
    st = status(site, man)
    variant = st.variant
    if st.attestation is not None:
        if st.state == "applied" and st.attestation.excluded == exclude:
            return st.attestation, False
        if st.state == "applied":
            raise OverlayError(
                f"{site} already carries {man.overlay_id} with excluded="
                f"{list(st.attestation.excluded)}; reinstall vLLM to apply it with "
                f"excluded={list(exclude)}"
            )
        raise BaseDrift(f"{site} has an attestation but drifted: " + "; ".join(st.problems))
    for path, entry in man.files.items():  # every base hash, before anything else
        got = st.files[path]
        if got != "base":
            found = entry.result[variant] if got == "result" else got.split(":", 1)[1]
            raise BaseDrift(
                f"{path}: sha256 {found}, pinned base {entry.base[variant]} ({variant}); "
                "nothing was changed"
            )
    originals = {p: (site / p).read_bytes() for p in man.files}
    texts = {p: b.decode("utf-8") for p, b in originals.items()}
    applied = tuple(s.patch_id for s in man.series if s.patch_id not in exclude)
    for s in man.series:
        if s.patch_id in exclude:
            continue
        for fp in s.files:
            texts[fp.path] = apply_file_patch(texts[fp.path], fp, s.name)
    results: dict[str, bytes] = {}
    for path, text in texts.items():
        data = text.encode("utf-8")
        want = man.expected_after(path, variant, exclude)
        got = sha256_bytes(data)
        if got != want:
            raise ResultMismatch(f"{path}: patched sha256 {got}, pinned result {want} ({variant})")
        compile(data, str(site / path), "exec", dont_inherit=True)
        if data != originals[path]:
            results[path] = data
    att = Attestation(
        overlay_id=man.overlay_id,
        vllm_version=man.vllm_version,
        variant=variant,
        specpair_version=specpair_version,
        applied=applied,
        excluded=exclude,
        files={
            p: {
                "base": man.files[p].base[variant],
                "result": man.expected_after(p, variant, exclude),
            }
            for p in man.files
        },
    )
    written: list[str] = []
    try:
        for path, data in results.items():
            _atomic_write(site / path, data)
            written.append(path)
        for path in results:
            _drop_pyc(site / path)  # stale (or, in a symlinked tree, foreign) bytecode
            py_compile.compile(
                str(site / path), doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
        _atomic_write(attestation_path(site), (json.dumps(asdict(att), indent=2) + "\n").encode())
    except BaseException:
        for path in written:
            _atomic_write(site / path, originals[path])
            _drop_pyc(site / path)
        attestation_path(site).unlink(missing_ok=True)
        raise
    return att, True


def _drop_pyc(path: Path) -> None:
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def verify(site: Path, man: Manifest) -> Status:
    """The status, raising ResultMismatch unless the overlay is applied and intact."""
    st = status(site, man)
    if st.state != "applied":
        why = "; ".join(st.problems) or "no attestation (overlay not applied)"
        raise ResultMismatch(f"{site}: overlay {man.overlay_id} not verified: {why}")
    return st
