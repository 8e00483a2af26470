"""The drafter engine: per-request state, one batched forward per draft step.

``DrafterEngine.handle(Propose) -> ProposalFrame`` is what the wire server
calls once per round; ``release(ids)`` frees finished requests.

Per request the engine keeps the committed history H (tokens at absolute
positions 0..len(H)-1, and their target features when the model needs them)
and the model's cache, which covers a prefix of H followed by the drafts it
fed last round. Each PROPOSE item (docs/wire.md §3.3) is applied as follows:

- ``n_new == position``: the item carries the whole history; any state is
  discarded and rebuilt from it (first round, after RESYNC, after reconnect).
- otherwise, if the engine holds the request and ``len(H) + n_new == position``,
  H grows by ``new_tokens``. The cache keeps the longest prefix it shares with
  the new H: the drafts the target accepted stay, rejected ones are cropped.
  ``num_accepted`` is cross-checked: when the committed tokens contradict the
  drafts the target says it accepted, the histories disagree and the cache is
  rebuilt from the committed history alone (counted in the metrics).
- otherwise the engine lacks the history: RESYNC (the target resends it whole).

A request's state is freed by RELEASE, by the end of the connection that
carried it, or by ``expire()`` once no round has touched it for
``idle_release_s``: the target sends RELEASE only from its next decode step,
so the requests of its last step would otherwise stay held while it idles.
At most ``max_requests`` requests and ``max_held_tokens`` committed tokens are
held: past that the least recently used are evicted (their next round is
answered RESYNC). A request freed too early costs
one RESYNC, never a wrong draft.

Items the engine cannot serve (K above its max depth, positions past the
model's or past ``max_history``, bad ids, params outside the domain of
``specpair.sampling.check_params_domain``, missing features) get REFUSED, each on
its own. The OK items of a round are drafted together with
``specpair.draft.propose`` (DRAFT stream, absolute positions, each request's
params and seed) at the round's largest K, one batch per drafting mode: the
engine's own, and for a SAMPLED engine GREEDY (argmax drafts, POINT_MASS q) for
the items that ask for it (``ProposeItem.greedy``); each request gets its own first K
drafts (noise is keyed by position, so a draft does not depend on how many
follow it, nor on which requests share its batch). If drafting the batch
raises, each item is drafted alone and only the ones that still fail are
REFUSED (logged with the traceback, counted in ``draft_failures``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from specpair.draft import DraftMode, propose
from specpair.drafter.metrics import Metrics
from specpair.drafter.model import DraftModel, Row
from specpair.errors import BadSamplingParams
from specpair.proposal import Proposal, QKind
from specpair.qlaw import Drafts, widen
from specpair.sampling import SamplingParams, check_params_domain
from specpair.wire.frames import DraftItem, Hello, ItemStatus, ProposalFrame, Propose, ProposeItem

__all__ = ["DrafterEngine", "WIRE_MAX_SUPPORT", "MAX_REQUESTS", "MAX_HISTORY",
           "MAX_HELD_TOKENS", "freeze_heap"]

WIRE_MAX_SUPPORT = 65_536  # docs/wire.md §5: larger truncated laws travel DENSE
_MAX_POSITION = 2**32 - 1  # noise counters hold 32-bit positions (specpair.rng)
MAX_REQUESTS = 4096  # default: live requests held in total (LRU eviction past it)
MAX_HISTORY = 32_768  # default: committed tokens held per request (longer: REFUSED)
MAX_HELD_TOKENS = 1 << 20  # default: committed tokens held over all requests (LRU past it)
_TRIM_EVERY = 256  # requests freed between two malloc_trim calls

log = logging.getLogger("specpair.drafter")


@dataclass
class _State:
    """What the engine holds for one live request (mutable, engine-private)."""

    history: list[int]  # committed tokens, absolute positions 0..len-1
    features: torch.Tensor | None  # [len(history), width] target features, or None
    cache: Any = None  # the model's cache of history[:cached] + fed
    cached: int = 0  # committed tokens covered by the cache (a prefix of history)
    fed: list[int] = field(default_factory=list)  # drafts fed after them last round
    drafts: list[int] = field(default_factory=list)  # drafts sent last round
    touched: float = 0.0  # time.monotonic() of the last round that carried the request


class DrafterEngine:
    """Serves PROPOSE rounds from one draft model (thread-safe: one round at a time)."""

    def __init__(self, model: DraftModel, *, tokenizer_fingerprint: bytes, wire_version: int,
                 mode: DraftMode = DraftMode.SAMPLED, draft_top_k: int = 0, max_depth: int = 16,
                 metrics: Metrics | None = None, idle_release_s: float = 30.0,
                 max_requests: int = MAX_REQUESTS, max_history: int = MAX_HISTORY,
                 max_held_tokens: int = MAX_HELD_TOKENS) -> None:
        if len(tokenizer_fingerprint) != 32:
            raise ValueError("tokenizer_fingerprint must be a 32-byte sha256")
        if not 1 <= max_depth <= 32:
            raise ValueError(f"max_depth must lie in [1, 32] (docs/wire.md §5), got {max_depth}")
        if draft_top_k < 0:
            raise ValueError(f"draft_top_k must be >= 0 (0 = off), got {draft_top_k}")
        if not idle_release_s > 0:
            raise ValueError(f"idle_release_s must be > 0, got {idle_release_s}")
        if min(max_requests, max_history, max_held_tokens) < 1:
            raise ValueError(f"max_requests ({max_requests}), max_history ({max_history}) and "
                             f"max_held_tokens ({max_held_tokens}) must be >= 1")
        self.model = model
        self.mode = mode
        self.draft_top_k = draft_top_k
        self.max_depth = max_depth
        self.metrics = metrics or Metrics()
        self.idle_release_s = idle_release_s  # expire() frees requests idle this long
        self.max_requests = max_requests  # live requests held; LRU eviction past it
        self.max_history = max_history  # committed tokens per request; past it REFUSED
        self.max_held_tokens = max_held_tokens  # committed tokens over all requests; LRU past it
        v = model.vocab_size
        support = min(v, WIRE_MAX_SUPPORT) if draft_top_k == 0 else min(v, draft_top_k)
        self._hello = Hello(
            version=wire_version, mode=mode, vocab_size=v,
            tokenizer_fingerprint=bytes(tokenizer_fingerprint),
            # a SAMPLED drafter drafts greedily for the items that ask (ProposeItem.greedy)
            q_encodings=(QKind.POINT_MASS,) if mode == DraftMode.GREEDY
            else (QKind.SPARSE, QKind.DENSE, QKind.POINT_MASS),
            max_depth=max_depth, max_support=support, features=model.feature_spec)
        self._states: OrderedDict[int, _State] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._freed = 0  # requests freed since the last malloc_trim

    def hello(self) -> Hello:
        return self._hello

    def live_requests(self) -> int:
        return len(self._states)

    def release(self, request_ids: Iterable[int]) -> None:
        with self._lock:
            n = len(self._states)
            for rid in request_ids:
                self._states.pop(rid, None)
            self._freed += n - len(self._states)
            self.metrics.set_live(len(self._states))
            self._trim()

    def _trim(self, force: bool = False) -> None:
        """Hand freed caches back to the OS (glibc keeps freed heap otherwise): a gc pass
        and malloc_trim, once ``_TRIM_EVERY`` requests were freed (or when forced)."""
        if self._freed == 0 or (self._freed < _TRIM_EVERY and not force):
            return
        self._freed = 0
        gc.collect()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)

    def held_tokens(self) -> int:
        """Committed tokens held over all live requests (what their caches cover at most)."""
        return sum(len(st.history) for st in self._states.values())

    def _evict(self, keep: set[int]) -> None:
        """Evict least recently used requests (never one in ``keep``) while over
        max_requests or max_held_tokens."""
        over = len(self._states) - self.max_requests
        tokens = self.held_tokens()
        if over <= 0 and tokens <= self.max_held_tokens:
            return
        victims = []
        for rid, st in self._states.items():
            if over <= 0 and tokens <= self.max_held_tokens:
                break
            if rid in keep:
                continue
            victims.append(rid)
            over -= 1
            tokens -= len(st.history)
        for rid in victims:
            del self._states[rid]
        self._freed += len(victims)
        self.metrics.count_evicted(len(victims))
        self._trim()
        log.info("evicted %d least recently used request(s): over --max-requests %d or "
                 "--max-held-tokens %d", len(victims), self.max_requests, self.max_held_tokens)

    def expire(self, now: float | None = None) -> int:
        """Free every request no round touched for ``idle_release_s``; how many were freed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [rid for rid, st in self._states.items()
                    if now - st.touched >= self.idle_release_s]
            for rid in idle:
                del self._states[rid]
            self._freed += len(idle)
            self.metrics.set_live(len(self._states))
            self._trim(force=bool(idle))
        if idle:
            log.info("released %d request(s) idle for %g s or more", len(idle),
                     self.idle_release_s)
        return len(idle)

    def handle(self, frame: Propose) -> ProposalFrame:
        t0 = time.perf_counter()
        with self._lock:
            statuses: dict[int, ItemStatus] = {}
            ok: list[tuple[ProposeItem, _State]] = []
            disagreements = 0
            for item in frame.items:
                status, state, disagree = self._apply(item)
                statuses[item.request_id] = status
                disagreements += disagree
                if status == ItemStatus.OK:
                    ok.append((item, state))
            drafted = self._draft_isolated(ok, statuses) if ok else {}
            items = tuple(drafted.get(it.request_id) or self._empty(it, statuses[it.request_id])
                          for it in frame.items)
            self._evict({it.request_id for it in frame.items})
            live = len(self._states)
        self.metrics.observe_round(
            time.perf_counter() - t0, [i.status for i in items],
            sum(int(i.tokens.numel()) for i in items), disagreements, live)
        return ProposalFrame(round_id=frame.round_id, items=items)

    # -- per item -------------------------------------------------------------------

    def _refusal(self, item: ProposeItem) -> str | None:
        """Why the engine cannot serve this item, or None."""
        n = int(item.new_tokens.numel())
        p = item.params
        spec = self.model.feature_spec
        if not 1 <= item.depth <= self.max_depth:
            return f"depth {item.depth} outside [1, {self.max_depth}]"
        if not 1 <= n <= item.position:
            return f"n_new {n} outside [1, position {item.position}]"
        if item.position + item.depth > min(self.model.max_positions, _MAX_POSITION):
            return f"position {item.position} + depth past the model's positions"
        if item.position > self.max_history:
            return f"position {item.position} past --max-history {self.max_history}"
        if bool(((item.new_tokens < 0) | (item.new_tokens >= self.model.vocab_size)).any()):
            return "token id outside the vocabulary"
        try:
            check_params_domain(p.temperature, p.top_k, p.top_p, p.seed)
        except BadSamplingParams as e:
            return str(e)
        if spec is not None and (item.features is None
                                 or tuple(item.features.shape) != (n, spec.width)):
            return "missing or misshapen context features"
        return None

    def _apply(self, item: ProposeItem) -> tuple[ItemStatus, _State | None, int]:
        """Fold the item into the request's state; (status, state, disagreement 0/1)."""
        rid = item.request_id
        why = self._refusal(item)
        if why is not None:
            log.warning("request %d refused: %s", rid, why)
            self._states.pop(rid, None)  # its history is now incomplete: RESYNC next time
            return ItemStatus.REFUSED, None, 0
        new = item.new_tokens.tolist()
        feats = item.features if self.model.feature_spec is not None else None
        if len(new) == item.position:  # whole history: start over
            self._states.pop(rid, None)
            st = self._states[rid] = _State(history=new, features=feats,
                                            touched=time.monotonic())
            return ItemStatus.OK, st, 0
        st = self._states.get(rid)
        if st is None or len(st.history) + len(new) != item.position:
            self._states.pop(rid, None)
            return ItemStatus.RESYNC, None, 0
        self._states.move_to_end(rid)
        st.touched = time.monotonic()
        n_acc = item.num_accepted
        disagree = int(n_acc > len(st.drafts) or new[:n_acc] != st.drafts[:n_acc])
        prev = len(st.history)
        st.history = st.history + new
        if feats is not None:
            st.features = torch.cat([st.features, feats])
        if disagree or st.cached < prev:
            keep = min(st.cached, prev)
        elif feats is not None:
            keep = prev  # drafts' cache entries lack target features: recompute them
        else:
            keep = prev + _common_prefix(st.fed, new)
        st.cached = min(keep, len(st.history) - 1)
        st.cache = self.model.crop(st.cache, st.cached) if st.cache is not None else None
        st.fed = []
        return ItemStatus.OK, st, disagree

    def _empty(self, item: ProposeItem, status: ItemStatus) -> DraftItem:
        return DraftItem(request_id=item.request_id, status=status,
                         tokens=torch.zeros(0, dtype=torch.int64),
                         kind=self._hello.q_encodings[0], q_logp=None, q_ids=None)

    # -- the batched draft ----------------------------------------------------------

    def _draft_isolated(self, ok: list[tuple[ProposeItem, _State]],
                        statuses: dict[int, ItemStatus]) -> dict[int, DraftItem]:
        """``_draft`` of the items drafted in each mode (one batch per mode); if a batch
        raises, each of its items alone, and REFUSED for those that fail."""
        out: dict[int, DraftItem] = {}
        for mode in (DraftMode.SAMPLED, DraftMode.GREEDY):
            batch = [pair for pair in ok if self._mode(pair[0]) == mode]
            if batch:
                out.update(self._draft_batch(batch, mode, statuses))
        return out

    def _mode(self, item: ProposeItem) -> DraftMode:
        return DraftMode.GREEDY if item.greedy else self.mode

    def _draft_batch(self, ok: list[tuple[ProposeItem, _State]], mode: DraftMode,
                     statuses: dict[int, ItemStatus]) -> dict[int, DraftItem]:
        try:
            return self._draft(ok, mode)
        except Exception:
            if len(ok) == 1:
                return self._failed(ok[0][0], statuses)
            log.exception("drafting a batch of %d failed; drafting each request alone", len(ok))
        out: dict[int, DraftItem] = {}
        for pair in ok:
            try:
                out.update(self._draft([pair], mode))
            except Exception:
                out.update(self._failed(pair[0], statuses))
        return out

    def _failed(self, item: ProposeItem, statuses: dict[int, ItemStatus]) -> dict:
        log.exception("drafting request %d failed (a bug): answered REFUSED", item.request_id)
        self.metrics.count_draft_failure()
        statuses[item.request_id] = ItemStatus.REFUSED
        self._states.pop(item.request_id, None)
        return {}

    def _draft(self, ok: list[tuple[ProposeItem, _State]],
               mode: DraftMode) -> dict[int, DraftItem]:
        rows = []
        for _, st in ok:
            c = st.cached
            f = st.features[c:] if st.features is not None else None
            rows.append(Row(cache=st.cache if c else None, start=c,
                            tokens=torch.tensor(st.history[c:], dtype=torch.int64), features=f))
        params = SamplingParams(
            temperature=torch.tensor([it.params.temperature for it, _ in ok], dtype=torch.float32),
            top_k=torch.tensor([it.params.top_k for it, _ in ok], dtype=torch.int64),
            top_p=torch.tensor([it.params.top_p for it, _ in ok], dtype=torch.float32),
            seed=torch.tensor([it.params.seed for it, _ in ok], dtype=torch.int64))
        position = torch.tensor([len(st.history) for _, st in ok], dtype=torch.int64)
        depth = max(it.depth for it, _ in ok)
        session, first = self.model.begin(rows)
        prop = propose(first, lambda d, _k: session.step(d), params, position, depth,
                       mode, self.draft_top_k)
        caches = session.finish()
        out = {}
        for b, (it, st) in enumerate(ok):
            st.cache = caches[b]
            st.cached = len(st.history)
            st.fed = prop.tokens[b, : depth - 1].tolist()
            st.drafts = prop.tokens[b, : it.depth].tolist()
            out[it.request_id] = self._item(it, prop, b)
        return out

    def _item(self, it: ProposeItem, prop: Proposal, b: int) -> DraftItem:
        k = it.depth
        tokens = prop.tokens[b, :k].clone()
        kind, logp, ids = prop.kind, None, None
        if kind == QKind.DENSE:
            logp = prop.q_logp[b, :k].clone()
        elif kind == QKind.SPARSE:
            ids = prop.q_ids[b, :k]
            s = int((ids >= 0).sum(dim=1).max())
            ids, logp = ids[:, :s].clone(), prop.q_logp[b, :k, :s].clone()
            if s > self._hello.max_support:  # too wide for SPARSE: the same values, DENSE
                sparse = Drafts(tokens, QKind.SPARSE, logp, ids)
                kind, logp, ids = QKind.DENSE, widen(sparse, self.model.vocab_size), None
        return DraftItem(request_id=it.request_id, status=ItemStatus.OK, tokens=tokens,
                         kind=kind, q_logp=logp, q_ids=ids)


def freeze_heap() -> int:
    """Move every object the garbage collector tracks now out of its scans (``gc.freeze``,
    as vLLM's engine core does after its start) and return how many: called once the model
    and the engine are loaded, whose objects live as long as the process. A drafter with
    the trained pair loaded tracks about 377,000 objects (torch, transformers, the model),
    and a full collection scanned them all: 180 ms on the 2-core box, in ``_trim`` every
    ``_TRIM_EVERY`` freed requests and in Python's own oldest-generation passes, each
    stalling the rounds in flight (live at c = 16 a drafted step of 70 ms took 251).
    Frozen, such a collection takes well under a millisecond."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.malloc_trim  # noqa: B018 (glibc only)
        return lib
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
