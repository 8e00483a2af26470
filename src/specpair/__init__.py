"""specpair: cross-machine sampled speculative decoding with an exact verifier.

Public core (the executable specification the wire, the drafter worker and the
vLLM overlay follow):

- `specpair.rng`      counter-based noise streams (DRAFT, ACCEPT, RECOVER, BONUS)
- `specpair.sampling` sampling params and the exact law built from logits
- `specpair.proposal` the frozen proposal a drafter returns (tokens + q)
- `specpair.draft`    the sampled speculator
- `specpair.verify`   the reference verifier (Leviathan et al. 2023, Algorithm 1)
"""

__version__ = "0.1.0"
