"""The greedy near-tie gate's input: what a greedy admission window saved.

JSON (documented in docs/health.md, "Admission gates")::

    {"registration": "pp4-r12-logit-grid-tie",
     "prompt_count": 6,
     "prompts": [
       {"prompt": 0, "reference_token_count": 256, "experiment_token_count": 256,
        "divergence": null},
       {"prompt": 1, "reference_token_count": 256, "experiment_token_count": 256,
        "divergence": {"index": 78, "reference_token_id": 2201, "experiment_token_id": 881,
                       "top20": [{"token_id": 881, "logprob": -0.69314718},  ... 20 entries],
                       "reported_margin_nats": 0.5}}]}

``top20`` is the experiment's top-20 at the first differing index, unrounded
FP32 log-probs as vLLM serializes them; null when none was saved.
``reported_*`` keys (at any level) are recorded diagnostics (e.g. NBW's
rounded margin): accepted, echoed for divergences, never part of the verdict.
Parsing checks structure and types only; the gate judges the values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specpair.errors import SpecpairError

__all__ = ["MalformedEvidence", "TopEntry", "Divergence", "PromptRecord", "TieEvidence",
           "parse_evidence"]


class MalformedEvidence(SpecpairError, ValueError):
    """The gate's input is not the documented JSON structure."""


@dataclass(frozen=True)
class TopEntry:
    """One entry of a top-20 list."""

    token_id: int  # vocabulary id
    logprob: float  # the FP32 log-prob as serialized (a Python float)


@dataclass(frozen=True)
class Divergence:
    """Where the experiment's greedy output first differs from the reference."""

    index: int  # first differing token index
    reference_token_id: int  # the reference (production) token at that index
    experiment_token_id: int  # the experiment's token at that index
    top20: tuple[TopEntry, ...] | None  # experiment's top-20 there; None: not saved
    reported: dict[str, Any]  # reported_* diagnostics, echoed, never judged


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of the window."""

    prompt: int  # prompt number, 0..prompt_count-1
    reference_token_count: int  # tokens the reference generated
    experiment_token_count: int  # tokens the experiment generated
    divergence: Divergence | None  # None: identical outputs


@dataclass(frozen=True)
class TieEvidence:
    """Everything the gate judges."""

    registration: str  # must be "pp4-r12-logit-grid-tie"
    prompt_count: int  # prompts the window was to check
    prompts: tuple[PromptRecord, ...]  # the prompts it did check


def _keys(obj: Any, path: str, required: set[str]) -> None:
    if not isinstance(obj, dict):
        raise MalformedEvidence(f"{path}: expected an object, got {type(obj).__name__}")
    extra = {k for k in obj
             if k not in required and not (isinstance(k, str) and k.startswith("reported_"))}
    missing = required - set(obj)
    if missing or extra:
        raise MalformedEvidence(f"{path}: missing keys {sorted(missing)}, unknown keys "
                                f"{sorted(extra)}")


def _int(v: Any, path: str, minimum: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise MalformedEvidence(f"{path}: expected an integer >= {minimum}, got {v!r}")
    return v


def _number(v: Any, path: str) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise MalformedEvidence(f"{path}: expected a number, got {v!r}")
    return float(v)


def _divergence(d: Any, path: str) -> Divergence:
    _keys(d, path, {"index", "reference_token_id", "experiment_token_id", "top20"})
    top = d["top20"]
    entries = None
    if top is not None:
        if not isinstance(top, list):
            raise MalformedEvidence(f"{path}.top20: expected a list or null")
        entries = []
        for j, e in enumerate(top):
            _keys(e, f"{path}.top20[{j}]", {"token_id", "logprob"})
            entries.append(TopEntry(_int(e["token_id"], f"{path}.top20[{j}].token_id"),
                                    _number(e["logprob"], f"{path}.top20[{j}].logprob")))
        entries = tuple(entries)
    return Divergence(
        _int(d["index"], f"{path}.index"),
        _int(d["reference_token_id"], f"{path}.reference_token_id"),
        _int(d["experiment_token_id"], f"{path}.experiment_token_id"),
        entries, {k: v for k, v in d.items() if k.startswith("reported_")})


def parse_evidence(data: Any) -> TieEvidence:
    """Structure and types of the gate's JSON; raises ``MalformedEvidence`` naming the path."""
    _keys(data, "evidence", {"registration", "prompt_count", "prompts"})
    if not isinstance(data["registration"], str):
        raise MalformedEvidence("evidence.registration: expected a string")
    if not isinstance(data["prompts"], list):
        raise MalformedEvidence("evidence.prompts: expected a list")
    prompts = []
    for i, p in enumerate(data["prompts"]):
        path = f"evidence.prompts[{i}]"
        _keys(p, path, {"prompt", "reference_token_count", "experiment_token_count",
                        "divergence"})
        div = p["divergence"]
        prompts.append(PromptRecord(
            _int(p["prompt"], f"{path}.prompt"),
            _int(p["reference_token_count"], f"{path}.reference_token_count"),
            _int(p["experiment_token_count"], f"{path}.experiment_token_count"),
            None if div is None else _divergence(div, f"{path}.divergence")))
    numbers = [p.prompt for p in prompts]
    if len(set(numbers)) != len(numbers):
        raise MalformedEvidence(f"evidence.prompts: prompt numbers repeat: {numbers}")
    count = _int(data["prompt_count"], "evidence.prompt_count", minimum=1)
    if any(n >= count for n in numbers):
        raise MalformedEvidence(f"evidence.prompts: prompt numbers {numbers} exceed "
                                f"prompt_count {count}")
    return TieEvidence(data["registration"], count, tuple(prompts))
