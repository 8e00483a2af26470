"""The vLLM 0.32.0 overlay: patch machinery and the remote speculators the patches call.

Patch series and manifest: overlays/vllm/0.32.0/ (see its README.md).
"""
