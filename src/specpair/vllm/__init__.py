"""The runtime adapters the vLLM 0.32.0 overlay's patches call inside vLLM.

``v1`` (Model Runner V1's remote proposer) and ``v2`` (V2's remote speculator) translate
vLLM's structures for ``drafting``, the one owner of a decode step's drafting (rank 0 drafts,
``tp`` hands its result to every tensor-parallel rank, a guard compares them);
``depth_policy`` chooses the depths, ``drafter_source`` the drafter, ``metrics`` exports the
target's specpair series on vLLM's /metrics; ``cpu_expand`` is the CPU build's
expand-kernel fix. The build-time machinery that applies the patch series lives in
``specpair.overlay``; the series and its manifest in overlays/vllm/0.32.0/ (see its
README.md).
"""
