"""The runtime adapters the vLLM 0.32.0 overlay's patches call inside vLLM.

``v1`` (Model Runner V1's remote proposer), ``v2`` (V2's remote speculator),
``cpu_expand`` (the CPU build's expand-kernel fix), ``client`` (the drafter
connection they share) and ``metrics`` (the target's specpair series on vLLM's
/metrics). The build-time machinery that applies the patch series lives in
``specpair.overlay``; the series and its manifest in overlays/vllm/0.32.0/ (see its
README.md).
"""
