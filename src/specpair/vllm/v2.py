"""Model Runner V2 (CUDA): the remote sampled speculator.

Enabled by the same speculative config as V1 (``method="custom_class"``,
``model="specpair.vllm.v1.RemoteProposer"``): patch 0002 lets V2 accept that
class and has ``init_speculator`` build ``RemoteSpeculator`` instead.

V2 carries q to its rejection sampler only through ``speculator.draft_logits``
[max_num_reqs, K, V] fp32, which the verifier divides by the request's
temperature on load. For each request of a step we therefore store
``T * log q`` on q's support and -inf elsewhere (``write_draft_logits``): after
the division the verifier sees exactly log q. Every row of the requests in the
step is rewritten (stale entries cleared); a request whose q is MISSING keeps
-inf rows and ``num_valid`` 0, and patch 0002 turns that flag into
``invalid_drafts`` so its drafts are rejected and the step is target-only.
Only standard tokenwise verification is allowed: block and synthetic
verification (and adaptive verification) are refused at construction.

Why the drafter drafts without top-k / top-p under V2 (checked in vLLM 0.32.0):
V2's ``RejectionSampler._verify`` runs ``Sampler.apply_sampling_params`` on the
target logits without ``skip_top_k_top_p``, so the p it verifies against already
has the request's logits processors, temperature, min-p, top-k and top-p applied,
and the output follows that p for any q that is the exact law of the draws. But a
V2 speculator is not shown top-k / top-p: ``model_runner.py`` passes ``propose`` only
``sampling_states.temperature`` and ``.seeds``, and ``RequestState`` holds no
sampling params (vLLM's own ``DraftModelSpeculator`` drafts at the temperature
alone for the same reason, ``speculator.py`` ``_copy_request_inputs``). So the
drafter draws from the untruncated law at the request's temperature and ships that
q exactly: the output law is unchanged; a draft outside p's support is always
rejected, so acceptance may be lower. Patch 0002 hands the speculator the sampler's
states once the sampler exists (``sampling_states``), read for one thing only: which
requests' seeds their users set (``seeds_set``; V2 draws a seed for every other
request), so a seeded request's depths follow its own history (its completion is then
reproducible, specpair.vllm.depth_policy). Its top-k / top-p are there too, for a
later change that drafts with them.
"""

from __future__ import annotations

from typing import Any

import torch

from specpair import qlaw
from specpair.qlaw import Drafts
from specpair.vllm.drafting import Drafting, RequestStep, digest
from specpair.vllm.errors import RemoteVerificationRefused

__all__ = [
    "REMOTE_CLASS",
    "is_remote_config",
    "init_remote_speculator",
    "write_draft_logits",
    "merge_invalid_drafts",
    "RemoteSpeculator",
]

REMOTE_CLASS = "specpair.vllm.v1.RemoteProposer"  # the documented speculative `model`


def is_remote_config(spec_config: Any) -> bool:
    """True when the speculative config asks for specpair's remote drafter."""
    return spec_config.method == "custom_class" and spec_config.model == REMOTE_CLASS


def init_remote_speculator(vllm_config: Any, device: torch.device, req_states: Any) -> Any:
    """Called by the patched init_speculator for method ``custom_class`` (patch 0002)."""
    spec = vllm_config.speculative_config
    if not is_remote_config(spec):
        raise NotImplementedError(f"custom_class {spec.model!r} is not supported by V2 yet.")
    return RemoteSpeculator(vllm_config, device, req_states)


def write_draft_logits(
    draft_logits: torch.Tensor,  # [max_num_reqs, K, V] fp32, written in place
    state_idx: list[int],  # request-state row of each request of the step
    drafts: list[Drafts | None],  # its drafts and their q (None: no drafts)
    temperature: list[float],  # its temperature (0 = greedy: q is not read)
) -> torch.Tensor:
    """Clear the step's rows to -inf and store T * log q; returns drafts [n, K] int64."""
    assert draft_logits.dtype == torch.float32 and draft_logits.ndim == 3
    _, depth, vocab = draft_logits.shape
    n = len(state_idx)
    tokens = torch.zeros(n, depth, dtype=torch.int64)
    if n == 0:
        return tokens
    rows = torch.tensor(state_idx, dtype=torch.int64, device=draft_logits.device)
    draft_logits.index_fill_(0, rows, float("-inf"))
    for i, (d, t) in enumerate(zip(drafts, temperature, strict=True)):
        if d is None:
            continue
        k = d.depth
        tokens[i, :k] = d.tokens
        if t > 0.0:
            qlaw.scaled_logits(d, vocab, t, out=draft_logits[state_idx[i], :k])
    return tokens


def merge_invalid_drafts(speculator: Any, input_batch: Any,
                         invalid_drafts: torch.Tensor | None) -> torch.Tensor | None:
    """OR vLLM's invalid_drafts [num_logits] bool with the draft rows that lack q.

    As in vLLM's grammar_invalid_drafts, draft i sits at local position i + 1, so
    a request with ``num_valid`` drafts backed by q invalidates local positions
    > num_valid (all of them when its q is MISSING: a target-only step)."""
    limit = speculator.num_valid[input_batch.expanded_idx_mapping]
    mask = input_batch.expanded_local_pos > limit
    if not bool(mask.any()):
        return invalid_drafts
    return mask if invalid_drafts is None else invalid_drafts | mask


class RemoteSpeculator:
    """A V2 speculator whose drafts and q come from the remote drafter."""

    specpair_remote = True  # patch 0002 merges `num_valid` into invalid_drafts
    num_query_per_req = 1
    num_extra_query_per_req = 0
    supports_mm_inputs = False

    def __init__(self, vllm_config: Any, device: torch.device, req_states: Any) -> None:
        spec = vllm_config.speculative_config
        method = getattr(spec, "rejection_sample_method", "standard")
        if method in ("block", "synthetic"):
            raise RemoteVerificationRefused(
                f"rejection_sample_method={method!r} cannot verify remote sampled drafts; "
                "use the standard method")
        if getattr(spec, "enable_adaptive_verification", False):
            raise RemoteVerificationRefused("adaptive verification needs local draft confidences")
        self.device = device
        self.req_states = req_states
        self.depth = int(spec.num_speculative_tokens)  # K
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        max_reqs = int(vllm_config.scheduler_config.max_num_seqs)
        # [max_num_reqs, K, V] fp32: T * log q on the support, -inf elsewhere
        self.draft_logits = torch.full((max_reqs, self.depth, self.vocab_size), float("-inf"),
                                       dtype=torch.float32, device=device)
        # [max_num_reqs] int32: leading drafts of the request backed by q (0 = MISSING)
        self.num_valid = torch.full((max_reqs,), self.depth, dtype=torch.int32, device=device)
        self.pcp_manager = None
        self.sampling_states: Any = None  # the sampler's, handed over by patch 0002
        self.drafting = Drafting(self.depth, self.vocab_size,
                                 int(vllm_config.model_config.max_model_len),
                                 vllm_config.model_config.tokenizer)
        self.drafting.connect_early()

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        """The speculator runs no model: nothing to capture."""

    def capture(self) -> None:
        """The speculator runs no model: nothing to capture."""

    def prepare_watermarking(self, *args: Any, **kwargs: Any) -> None:
        raise RemoteVerificationRefused("watermarking is not supported with remote drafts")

    def propose(self, input_batch: Any, attn_metadata: Any, slot_mappings: Any,
                last_hidden_states: torch.Tensor, aux_hidden_states: Any,
                num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                last_sampled: torch.Tensor, next_prefill_tokens: torch.Tensor,
                temperature: torch.Tensor, seeds: torch.Tensor, dp_sync_state: Any = None,
                dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                mm_inputs: Any = None, is_profile: bool = False,
                num_speculative_tokens: int | None = None) -> torch.Tensor:
        """[num_reqs, K] int64 drafts (device); q goes to self.draft_logits. Called on every
        TP rank: the draft ids and q come from the drafting protocol's shared result."""
        num_reqs = int(input_batch.num_reqs)
        if dummy_run or is_profile:
            return torch.zeros(num_reqs, self.depth, dtype=torch.int64, device=self.device)
        idx = input_batch.idx_mapping_np[:num_reqs].tolist()
        rs = self.req_states
        total = rs.total_len.gpu[input_batch.idx_mapping].cpu()
        sampled = num_sampled[:num_reqs].cpu()
        rejected = num_rejected[:num_reqs].cpu()
        temps = temperature[input_batch.idx_mapping].cpu().tolist()
        seed_list = seeds[input_batch.idx_mapping].cpu().tolist()
        qs = input_batch.query_start_loc_np.tolist()
        req_ids = input_batch.req_ids[:num_reqs]
        # which seeds users set (V2 draws one for every other request): those requests'
        # depths follow their own history only
        ss = self.sampling_states
        user_seeded = ss.seeds_set[idx].tolist() if ss is not None else [False] * num_reqs
        # top-k / top-p off: V2 does not show them to speculators (module docstring)
        reqs = [RequestStep(req_id, int(total[i]), int(sampled[i]), float(temps[i]), 0, 1.0,
                            int(seed_list[i]), reproducible=bool(user_seeded[i]))
                for i, req_id in enumerate(req_ids)]

        def tokens(i: int, start: int, n: int) -> torch.Tensor:
            # only the tokens the drafter lacks cross from the device
            return rs.all_token_ids.gpu[idx[i], start:n].to("cpu", torch.int64)

        def features(i: int) -> torch.Tensor:
            # the states that predicted this step's committed tokens (EAGLE convention)
            committed = qs[i + 1] - qs[i] - int(rejected[i])
            return last_hidden_states[qs[i] : qs[i] + committed]

        def appended() -> int:  # what this rank committed: the guard compares it across ranks
            return digest(*req_ids, total, sampled, rejected,
                          last_sampled[:num_reqs].to("cpu", torch.int64))

        drafts = self.drafting.step(reqs, set(input_batch.req_ids), appended, tokens,
                                    features, num_speculative_tokens)
        tokens_out = write_draft_logits(self.draft_logits, idx, drafts, temps)
        # requests still in prefill (nothing sampled) are handled by vLLM itself
        valid = [(0 if d is None else d.depth) if r.num_sampled else self.depth
                 for r, d in zip(reqs, drafts, strict=True)]
        self.num_valid[input_batch.idx_mapping] = torch.tensor(valid, dtype=torch.int32).to(
            self.device)
        return tokens_out.to(self.device)
