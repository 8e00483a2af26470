"""N-gram drafts: a request's drafts looked up in its own history, no model and no drafter round.

The lookup is vLLM's own (vLLM 0.32.0's V1 n-gram proposer, ``vllm.v1.spec_decode.
ngram_proposer``): find the longest suffix of the committed tokens (prompt + output so far), MIN
to MAX tokens long, that occurred earlier in them, and draft the tokens that followed its
earliest occurrence. It is a deterministic function of the history, so the drafts' law q is a
point mass on them (``QKind.POINT_MASS``): the verifier accepts draft j with probability
p(x_j) and on a rejection samples from p without x_j, which is p's law again
(docs/performance.md, "N-gram drafts"). vLLM 0.32.0's V2 model runner has an n-gram
speculator too (``vllm.v1.worker.gpu.spec_decode.ngram``), but its matcher is a Triton kernel
over the runner's on-device token table; the V1 function used here is host-side (numba) and
needs neither runner, so one lookup serves the V1 proposer and the V2 speculator alike.

``SPECPAIR_NGRAM`` (``MIN:MAX``, default ``5:5``, vLLM's own ``ngram`` default; parsed by
``specpair.vllm.settings``) sets the n-gram lengths; the depth policy
(``specpair.vllm.depth_policy``) decides per request and round whether n-gram drafts are
drafted at all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from specpair.proposal import QKind
from specpair.qlaw import Drafts

__all__ = ["NgramLookup"]

def _matcher() -> Callable[..., np.ndarray]:
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens,
    )
    return _find_longest_matched_ngram_and_propose_tokens


class NgramLookup:
    """N-gram drafts of one engine (its drafting rank): ``drafts(history, k)``."""

    def __init__(self, min_n: int, max_n: int, max_model_len: int) -> None:
        self.min_n, self.max_n, self.max_model_len = min_n, max_n, max_model_len
        self._match: Callable[..., np.ndarray] | None = None

    def warm_up(self) -> None:
        """Load the matcher and compile it (numba, about a second) before the first round."""
        self.drafts(np.zeros(2 * self.max_n + 1, dtype=np.int32), 1)

    def drafts(self, history: np.ndarray, k: int) -> Drafts | None:
        """Up to ``k`` drafts following the longest earlier match of the history's suffix
        (the committed tokens, 1-D int32: the dtype vLLM's own proposer passes, so one
        compiled matcher serves), or None when nothing matches."""
        if self._match is None:
            self._match = _matcher()
        out = self._match(origin_tokens=history, min_ngram=self.min_n, max_ngram=self.max_n,
                          max_model_len=self.max_model_len, k=k)
        if len(out) == 0:
            return None
        return Drafts(torch.from_numpy(np.asarray(out, dtype=np.int64)), QKind.POINT_MASS,
                      None, None)
