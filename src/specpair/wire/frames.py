"""In-memory frames of the probability wire (the byte format is docs/wire.md).

These frozen dataclasses are what the codec encodes and decodes, what the
drafter worker consumes and produces, and what the target-side client hands
the vLLM overlay. Tensors are CPU tensors with the dtypes noted per field.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from specpair.draft import DraftMode
from specpair.proposal import QKind

__all__ = [
    "FeatureKind",
    "FeatureSpec",
    "Hello",
    "RequestParams",
    "ProposeItem",
    "Propose",
    "ItemStatus",
    "DraftItem",
    "ProposalFrame",
    "Release",
    "ErrorFrame",
    "Challenge",
    "Auth",
    "AuthOk",
]


class FeatureKind(IntEnum):
    """Which target hidden states a drafter conditions on. Wire codes: never reuse."""

    LAST_HIDDEN = 1  # the target's last hidden state per token (EAGLE, MTP)
    AUX_POOLED = 2  # pooled auxiliary hidden states per token (DSpark)


@dataclass(frozen=True)
class FeatureSpec:
    """Context features a drafter asks the target to send with every PROPOSE."""

    kind: FeatureKind  # what the rows are
    dtype: torch.dtype  # torch.float32, torch.bfloat16 or torch.float16
    width: int  # hidden size of one row (e.g. 7168 for DeepSeek)


@dataclass(frozen=True)
class Hello:
    """Drafter -> target, once per connection after authentication: capabilities."""

    version: int  # wire format version the drafter speaks
    mode: DraftMode  # SAMPLED (q travels; POINT_MASS too if declared) or GREEDY (POINT_MASS only)
    vocab_size: int  # V; every token id on the wire is < V
    tokenizer_fingerprint: bytes  # 32-byte sha256 over the drafter's tokenizer files
    q_encodings: tuple[QKind, ...]  # encodings the drafter may send
    max_depth: int  # largest K the drafter accepts
    max_support: int  # largest SPARSE support size it sends
    features: FeatureSpec | None  # target features it needs; None = none


@dataclass(frozen=True)
class RequestParams:
    """One request's sampling params (see specpair.sampling)."""

    temperature: float  # 0 = greedy
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    seed: int  # 64-bit Philox key of the request's noise streams


@dataclass(frozen=True)
class ProposeItem:
    """One request in a PROPOSE round (target -> drafter)."""

    request_id: int  # u64, unique among live requests
    new_tokens: torch.Tensor  # [n] int64 committed since its last round (whole prompt first)
    num_accepted: int  # drafts of the request's previous round that the target accepted
    position: int  # absolute position of the first token to draft (= committed length)
    depth: int  # K, drafts wanted
    params: RequestParams  # sampling params of the request
    features: torch.Tensor | None  # [n, width] target hidden states for new_tokens, or None
    # argmax drafts, q the POINT_MASS, for this item (only to a drafter that declared
    # POINT_MASS); False: drafts by the drafter's own mode
    greedy: bool = False


@dataclass(frozen=True)
class Propose:
    """Target -> drafter: one decode round."""

    round_id: int  # u64, increasing per connection
    items: tuple[ProposeItem, ...]  # one per request, request ids distinct


class ItemStatus(IntEnum):
    """Per-request outcome in a PROPOSAL. Wire codes: never reuse a retired one."""

    OK = 0  # tokens and q are present
    RESYNC = 1  # the drafter lacks this request's history: resend it whole next round
    REFUSED = 2  # the drafter cannot serve this request (e.g. K too large)


@dataclass(frozen=True)
class DraftItem:
    """One request's drafts and laws in a PROPOSAL (drafter -> target)."""

    request_id: int  # as in the PROPOSE item
    status: ItemStatus  # OK, or why there are no drafts
    tokens: torch.Tensor  # [K] int64 drafted ids ([0] when status != OK)
    kind: QKind  # encoding of q for every position
    q_logp: torch.Tensor | None  # SPARSE [K, S] / DENSE [K, V] fp32 log q; None for POINT_MASS
    q_ids: torch.Tensor | None  # SPARSE [K, S] int64 support ids (-1 pad last); else None


@dataclass(frozen=True)
class ProposalFrame:
    """Drafter -> target: the answer to one PROPOSE round."""

    round_id: int  # the PROPOSE round it answers
    items: tuple[DraftItem, ...]  # one per request of that round


@dataclass(frozen=True)
class Release:
    """Target -> drafter: requests that finished; the drafter frees their state."""

    request_ids: tuple[int, ...]


@dataclass(frozen=True)
class ErrorFrame:
    """Either direction: a protocol-level error; the sender closes afterwards."""

    code: int  # error code, see docs/wire.md
    message: str  # UTF-8, human readable


# Added by the wire codec (additive): the authentication frames of docs/wire.md 3.1.


@dataclass(frozen=True)
class Challenge:
    """Drafter -> target, first frame: a fresh nonce to answer with the key."""

    nonce: bytes  # 32 random bytes


@dataclass(frozen=True)
class Auth:
    """Target -> drafter: proof that the target holds the pre-shared key."""

    nonce: bytes  # 32 random bytes of the target
    mac: bytes  # 32-byte HMAC-SHA256(key, label || server nonce || client nonce)


@dataclass(frozen=True)
class AuthOk:
    """Drafter -> target: proof that the drafter holds the key too."""

    mac: bytes  # 32-byte HMAC-SHA256(key, label || server nonce || client nonce)
