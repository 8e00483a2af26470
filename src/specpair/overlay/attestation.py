"""The attestation: what an apply did, as JSON inside the patched vLLM.

``<site-packages>/vllm/SPECPAIR_OVERLAY.json`` (inside the vllm package, so it
travels with it); ``verify`` and the attestation gate re-check it against the files.
``apply`` first writes the same record as ``SPECPAIR_OVERLAY.pending.json`` (its
intent) and renames it onto the attestation as its last step, so a pending file
means an apply was interrupted (``status`` then says how to complete it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

__all__ = ["ATTESTATION_NAME", "PENDING_NAME", "Attestation", "attestation_path",
           "pending_path", "read_attestation", "attestation_bytes"]

ATTESTATION_NAME = "SPECPAIR_OVERLAY.json"  # inside <site-packages>/vllm/
PENDING_NAME = "SPECPAIR_OVERLAY.pending.json"  # an apply's intent, until it completes


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


def attestation_path(site: Path) -> Path:
    return site / "vllm" / ATTESTATION_NAME


def pending_path(site: Path) -> Path:
    return site / "vllm" / PENDING_NAME


def read_attestation(path: Path) -> Attestation | None:
    """The record at ``path`` (attestation or pending), None if absent; ValueError if malformed."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or set(raw) != {f.name for f in fields(Attestation)}:
            raise ValueError("not an attestation's fields")
        raw["applied"] = tuple(raw["applied"])
        raw["excluded"] = tuple(raw["excluded"])
        return Attestation(**raw)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path} is unreadable ({str(err)[:120]})") from err


def attestation_bytes(att: Attestation) -> bytes:
    return (json.dumps(asdict(att), indent=2) + "\n").encode()
