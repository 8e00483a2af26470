"""The reference verifier: standard tokenwise speculative sampling.

Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023, Algorithm 1 (and Chen et al. 2023). For each request,
with target laws p_1..p_{K+1} and drafts d_1..d_K drawn from q_1..q_K:

- ACCEPTED token: d_i is kept when u_i < p_i(d_i) / q_i(d_i), u_i ~ U(0, 1)
  (so q >= p: accepted with probability p/q; q < p: always accepted);
- RECOVERED token: at the first rejection i, emit a draw from
  norm(max(0, p_i - q_i)); for SPARSE q, p_i outside the support counts in
  full; for POINT_MASS q it is p_i with d_i removed; verification stops;
- BONUS token: when all K drafts are accepted, emit a draw from p_{K+1}.

The emitted tokens are then distributed exactly as K+1 draws from the target.
With temperature 0 no randomness is used: d_i is accepted iff it equals the
target argmax, and the recovered / bonus token is the target argmax.

Noise: acceptance uniforms come from the ACCEPT stream, recovery from RECOVER,
bonus from BONUS, each keyed by (seed, absolute position); none of them can
meet the drafter's DRAFT stream (see ``specpair.rng``). Recovery and bonus use
one uniform per request by inverse CDF, never a per-token noise field.

A request whose q is MISSING is refused (``MissingDraftLaw``) or, with
``on_missing="drop"``, its drafts are dropped and the step is target-only:
position 1 is drawn from p_1 on the RECOVER stream, exactly the target's law.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from specpair import qlaw
from specpair.errors import InvalidProposal, MissingDraftLaw
from specpair.proposal import Proposal, QKind
from specpair.rng import Stream, uniform
from specpair.sampling import SamplingParams, process_logits, sample_from_weights

__all__ = ["Verdict", "VerifierStreams", "verify"]


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one proposal batch."""

    tokens: torch.Tensor  # [B, K+1] int64 emitted tokens; -1 after the last one
    num_accepted: torch.Tensor  # [B] int64 drafts accepted, 0..K
    dropped: torch.Tensor  # [B] bool: q was MISSING, drafts dropped, target-only step

    @property
    def num_emitted(self) -> torch.Tensor:
        """[B] int64 tokens emitted this round (accepted + one recovered or bonus)."""
        return self.num_accepted + 1


@dataclass(frozen=True)
class VerifierStreams:
    """Which noise stream each verifier draw uses. Only the RNG gate's must-fail
    control changes this (it couples recovery to DRAFT to reproduce the bug)."""

    accept: Stream = Stream.ACCEPT
    recover: Stream = Stream.RECOVER
    bonus: Stream = Stream.BONUS


def verify(
    target_logits: torch.Tensor,  # [B, K+1, V] raw target logits
    proposal: Proposal,
    params: SamplingParams,
    position: torch.Tensor,  # [B] int64 absolute position of d_1
    *,
    on_missing: Literal["refuse", "drop"] = "refuse",
    streams: VerifierStreams = VerifierStreams(),  # noqa: B008 (frozen, immutable)
) -> Verdict:
    """Verify a batch of proposals against the target (see the module docstring)."""
    b, k = proposal.tokens.shape
    assert target_logits.ndim == 3 and target_logits.shape[:2] == (b, k + 1), (
        f"target_logits {tuple(target_logits.shape)} vs proposal [{b}, {k}]")
    assert params.batch == b and position.shape == (b,), "params/position batch mismatch"
    v = target_logits.shape[2]
    _check_proposal_fits(proposal, v)
    dropped = ~proposal.present
    if bool(dropped.any()) and on_missing == "refuse":
        raise MissingDraftLaw(
            f"q is MISSING for requests {dropped.nonzero().flatten().tolist()}; "
            "refusing to verify them (pass on_missing='drop' for a target-only step)")

    rows = torch.arange(b)
    pos = position.unsqueeze(1) + torch.arange(k + 1)  # [B, K+1]
    greedy = params.greedy
    any_greedy = bool(greedy.any())
    drafts = proposal.tokens
    logp = process_logits(target_logits, params)  # [B, K+1, V] fp32
    argmax = target_logits.argmax(dim=-1) if any_greedy else None  # [B, K+1]

    # Acceptance: log u < log p(d) - log q(d)  <=>  u < min(1, p(d) / q(d)).
    logp_d = logp[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2).double()
    logq_d = qlaw.draft_logq(proposal)
    bad = proposal.present & ~greedy & ~torch.isfinite(logq_d).all(dim=1)
    if bool(bad.any()):
        raise InvalidProposal(f"q(d) = 0 for a drafted token in requests "
                              f"{bad.nonzero().flatten().tolist()}")
    # Every uniform this round may need, in one call: ACCEPT at d_1..d_K, RECOVER at
    # d_1..d_K (one is used, at the first rejection), BONUS at position K+1.
    kinds = torch.tensor([int(streams.accept)] * k + [int(streams.recover)] * k
                         + [int(streams.bonus)])
    noise = uniform(params.seed.unsqueeze(1), torch.cat([pos[:, :k], pos], dim=1), kinds)
    accept = torch.log(noise[:, :k]) < logp_d - logq_d
    if any_greedy:
        accept = torch.where(greedy.unsqueeze(1), drafts == argmax[:, :k], accept)
    accept &= ~dropped.unsqueeze(1)
    n_acc = accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B] leading accepts

    # The one token after the accepted prefix: recovered (n_acc < K) or bonus.
    j = n_acc
    recovering = j < k
    p_j = logp.view(b * (k + 1), v).index_select(0, rows * (k + 1) + j)  # [B, V] fp32 log p_j
    w = p_j.exp()  # fp32 p_j: the law as the target computed it
    _subtract_q(w, proposal, rows, j, recovering & ~dropped)
    stream_u = noise[rows, k + j]  # RECOVER at the rejected draft, or BONUS (j = K)
    last = sample_from_weights(w, stream_u)
    empty = last < 0  # p == q up to rounding: the rejection had probability ~0; draw from p
    if bool(empty.any()):
        last[empty] = sample_from_weights(p_j[empty].exp(), stream_u[empty])
    if any_greedy:
        last = torch.where(greedy, argmax[rows, j], last)

    out = torch.where(torch.arange(k + 1) < j.unsqueeze(1),
                      torch.nn.functional.pad(drafts, (0, 1), value=-1), -1)
    out[rows, j] = last
    return Verdict(tokens=out, num_accepted=n_acc, dropped=dropped)


def _check_proposal_fits(proposal: Proposal, vocab: int) -> None:
    d = proposal.tokens
    if bool(((d < 0) | (d >= vocab)).any()):
        raise InvalidProposal(f"drafted token ids must lie in [0, {vocab})")
    if proposal.kind == QKind.DENSE and proposal.q_logp.shape[2] != vocab:
        raise InvalidProposal(f"DENSE q has {proposal.q_logp.shape[2]} columns, vocab is {vocab}")
    if proposal.kind == QKind.SPARSE and bool((proposal.q_ids >= vocab).any()):
        raise InvalidProposal(f"SPARSE support ids must be < {vocab}")


def _subtract_q(w: torch.Tensor, proposal: Proposal, rows: torch.Tensor, j: torch.Tensor,
                where: torch.Tensor) -> None:
    """In place, for rows in ``where``: w = max(0, p_j - q_j) (w holds p_j on entry)."""
    if not bool(where.any()):
        return
    r = rows[where]
    jr = j[where]
    if proposal.kind == QKind.POINT_MASS:
        w[r, proposal.tokens[r, jr]] = 0.0
        return
    q = torch.exp(qlaw.proposal_logq(proposal)[r, jr]).float()  # [R, S|V]
    if proposal.kind == QKind.DENSE:
        w[r] = (w[r] - q).clamp_(min=0.0)
        return
    ids = proposal.q_ids[r, jr]  # [R, S]
    valid = ids >= 0  # ids are distinct, so each valid index is written once
    rr = r.unsqueeze(1).expand_as(ids)[valid]
    cc = ids[valid]
    w[rr, cc] = (w[rr, cc] - q[valid]).clamp_(min=0.0)
