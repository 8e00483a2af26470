"""The depth policy's settings (``specpair.vllm.depth_policy``): the engine's
``SPECPAIR_DEPTH_POLICY`` and a request's own (``PIN_ARG`` in its sampling params'
extra_args), parsed; overlays/vllm/0.32.0/README.md documents them for operators.

- ``adaptive`` (default): the policy's own choice of depth, drafting mode and source per step
  and request (``specpair.vllm.depth_policy``; docs/performance.md, "Adaptive policy");
- ``fixed`` / ``fixed:K``: always K (the speculative config's K when not given);
- ``off``: never draft (every step target-only);
- ``schedule:K1,K2,...``: round r of a request drafts K_{r mod n} (tests and diagnosis).
A depth written with a ``g`` (``fixed:3g``, ``schedule:3,0,2g,1``) asks for argmax drafts in
those rounds where the drafter serves them; with an ``n`` (``schedule:3,2n,0,1``), n-gram
drafts (none in a round whose lookup finds no match); without either, the drafter's own mode.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENV", "PIN_ARG", "PROBE_EVERY", "PolicySetting", "parse_setting"]

ENV = "SPECPAIR_DEPTH_POLICY"
PIN_ARG = "specpair_depth_policy"  # a request's own setting (its sampling params' extra_args)
PROBE_EVERY = 16  # adaptive steps between one-step probes, while drafting


@dataclass(frozen=True)
class PolicySetting:
    mode: str  # "adaptive", "fixed", "off" or "schedule"
    depth: int | None = None  # fixed: K (None: the configured K)
    schedule: tuple[int, ...] = ()
    probe_every: int = PROBE_EVERY
    greedy: tuple[bool, ...] = (False,)  # fixed: (its mode,); schedule: one per entry
    ngram: tuple[bool, ...] = (False,)  # n-gram drafts instead: as greedy, one per entry


def parse_setting(text: str, k_max: int, name: str = ENV) -> PolicySetting:
    """``SPECPAIR_DEPTH_POLICY``'s value (or ``name``'s); ValueError naming what is wrong."""
    mode, _, arg = text.strip().partition(":")
    mode = mode.lower() or "adaptive"

    def depths(s: str) -> tuple[tuple[int, ...], tuple[bool, ...], tuple[bool, ...]]:
        words = [x.strip().lower() for x in s.split(",")]
        greedy = tuple(w.endswith("g") for w in words)
        ngram = tuple(w.endswith("n") for w in words)
        try:
            ks = tuple(int(w.removesuffix("g").removesuffix("n")) for w in words)
        except ValueError:
            ks = ()
        if not ks or any(not 0 <= k <= k_max for k in ks):
            raise ValueError(f"{name}={text!r}: depths must be integers in 0..{k_max} "
                             "(the speculative config's num_speculative_tokens), each with "
                             "an optional g (greedy drafts) or n (n-gram drafts)")
        return ks, greedy, ngram

    if mode in ("adaptive", "off") and not arg:
        return PolicySetting(mode)
    if mode == "fixed" and "," not in arg:
        if not arg:
            return PolicySetting(mode)
        ks, greedy, ngram = depths(arg)
        return PolicySetting(mode, ks[0], greedy=greedy, ngram=ngram)
    if mode == "schedule" and arg:
        ks, greedy, ngram = depths(arg)
        return PolicySetting(mode, schedule=ks, greedy=greedy, ngram=ngram)
    raise ValueError(f"{name}={text!r}: expected adaptive, off, fixed, fixed:K[g|n] or "
                     "schedule:K1[g|n],K2[g|n],...")
