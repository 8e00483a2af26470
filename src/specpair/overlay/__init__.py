"""The build-time vLLM 0.32.0 overlay: apply, verify and pin the patch series.

Imports no torch and no vLLM (it runs before either is usable). Modules:
``unified_diff`` (parse and apply diffs exactly), ``manifest`` (the pins),
``status`` (what a site-packages holds), ``apply_series`` (writing the series,
crash-safely), ``tree_writes`` (atomic writes inside the tree only), ``attestation``
(the record of an apply), ``manifest_build`` and ``wheels``
(maintainers: recompute the pins from the pinned wheels), ``shadow_copy``
(overlay-able symlinked copies of an installed vLLM), ``cli``
(`specpair overlay ...`). Series and manifest: overlays/vllm/0.32.0/ (its README.md).
The runtime code the patches call lives in ``specpair.vllm``.
"""
