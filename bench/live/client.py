"""What the live benchmark asks of a running vLLM API server: timed streaming completions
(one stream, several sent at once, or several kept in flight) and its speculative-decoding
counters from /metrics."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specpair.vllm.metrics import ROUND_BUCKETS

__all__ = ["ROUND_BUCKET", "SPEC_COUNTERS", "Steady", "Stream", "in_flight", "round_quantile",
           "spec_counters", "steady", "steady_lengths", "stream", "streams"]

ROUND_BUCKET = "specpair_round_seconds_bucket"  # the target's round time histogram


@dataclass(frozen=True)
class Stream:
    """One streamed completion: its tokens, when it was sent and when its first and last
    text arrived."""

    tokens: int  # completion tokens (the final usage chunk)
    t_first: float  # time.perf_counter() when the first text chunk arrived (prefill done)
    t_last: float  # ... when the last one arrived
    t_sent: float  # ... when the request was sent

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first: prefill excluded; None when
        the API server sent all the text in one chunk (it merges a request's outputs while
        its handler is late: seen once with six engines up, 2026-12-02)."""
        if self.t_last <= self.t_first:
            return None
        return (self.tokens - 1) / (self.t_last - self.t_first)


def stream(port: int, model: str, prompt: str, max_tokens: int, temperature: float,
           top_p: float, xargs: dict | None = None) -> Stream:
    """One streamed /v1/completions request (EOS ignored: exactly ``max_tokens``);
    ``xargs``: vLLM's ``vllm_xargs`` (the request's sampling params' extra_args)."""
    req = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
           "temperature": temperature, "top_p": top_p, "ignore_eos": True,
           "stream": True, "stream_options": {"include_usage": True}}
    if xargs:
        req["vllm_xargs"] = xargs
    body = json.dumps(req)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t_sent = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"completion answered HTTP {resp.status}: {resp.read()[:300]!r}")
        t_first = t_last = None
        tokens = None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                t_last = time.perf_counter()
                t_first = t_first or t_last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    finally:
        conn.close()
    if tokens is None or t_first is None or tokens < 2:
        raise RuntimeError(f"the stream gave no decode window (tokens {tokens})")
    return Stream(tokens, t_first, t_last, t_sent)


def streams(port: int, model: str, prompts: list[str], max_tokens: int, temperature: float,
            top_p: float, xargs: dict | None = None) -> list[Stream]:
    """``len(prompts)`` streams sent at once, one thread each."""
    return [got[0] for got in _threads(
        [[(p, max_tokens)] for p in prompts],
        lambda prompt, n: stream(port, model, prompt, n, temperature, top_p, xargs))]


@dataclass(frozen=True)
class Steady:
    """What ``steady`` measured: the measured requests, every request of the turn, and the
    time-mean share of the c requests in flight over the measured requests' decode."""

    measured: list[Stream]
    every: list[Stream]
    in_flight: float


def steady_lengths(c: int, max_tokens: int) -> list[tuple[int, int]]:
    """Per stream i of ``c``: (lead-in tokens, cover tokens) of ``steady`` (0: no such
    request). Stream i's measured request starts after i/c of one request's tokens, so the c
    measured ones start spread over one request's time; its cover lasts until the last
    measured request has ended, with an eighth of a request to spare (requests advance
    unevenly where drafts are accepted); the last stream needs none."""
    spare = max(2, max_tokens // 8)
    out = []
    for i in range(c):
        lead = round(max_tokens * i / c)
        cover = 0 if i == c - 1 else round(max_tokens * (c - 1 - i) / c) + spare
        out.append((max(2, lead) if lead else 0, cover))
    return out


def steady(port: int, model: str, prompts: list[str], fill: list[str], max_tokens: int,
           temperature: float, top_p: float, xargs: dict | None = None) -> Steady:
    """``len(prompts)`` = c requests kept in flight, as a serving engine under a steady load
    sees them: stream i sends, back to back, a lead-in request (prompt ``fill[i]``,
    ``steady_lengths``), its measured request (``prompts[i]``, ``max_tokens``) and a cover
    request (``fill[i]``), so that each measured request decodes beside c - 1 others from
    its first token to its last, without the shared start and ragged end of c requests sent
    at once (``streams``): there the last of them finish in ever smaller batches."""
    lengths = steady_lengths(len(prompts), max_tokens)
    plans = [[(f, lead)] * bool(lead) + [(p, max_tokens)] + [(f, cover)] * bool(cover)
             for p, f, (lead, cover) in zip(prompts, fill, lengths, strict=True)]
    got = _threads(plans, lambda prompt, n: stream(port, model, prompt, n, temperature, top_p,
                                                   xargs))
    measured = [g[bool(lead)] for g, (lead, _) in zip(got, lengths, strict=True)]
    every = [s for g in got for s in g]
    return Steady(measured, every, in_flight(every, measured, len(prompts)))


def in_flight(every: list[Stream], measured: list[Stream], c: int) -> float:
    """The time-mean number of ``every``'s requests in flight (sent, last text not yet in)
    over the decode windows of ``measured`` (first text to last), over ``c``."""
    total = busy = 0.0
    for m in measured:
        total += m.t_last - m.t_first
        for s in every:
            busy += max(0.0, min(s.t_last, m.t_last) - max(s.t_sent, m.t_first))
    return busy / (c * total) if total > 0 else 0.0


def _threads(plans: list[list[tuple[str, int]]],
             one: Callable[[str, int], Stream]) -> list[list[Stream]]:
    """Per plan, one thread sending its (prompt, tokens) requests back to back; every
    thread started at once. A failed request's error is re-raised in the caller's thread."""
    out: list[list[Stream] | BaseException] = [[] for _ in plans]

    def run(i: int) -> None:
        try:
            for prompt, n in plans[i]:
                out[i].append(one(prompt, n))  # type: ignore[union-attr]
        except BaseException as exc:  # re-raised below, in the caller's thread
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out  # type: ignore[return-value]


# vLLM's speculative-decoding counters (``_total`` samples), its per-request decode time, and
# specpair's round times.
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "decode_s_sum": "vllm:request_decode_time_seconds_sum",  # first token to last, by the
    "decode_s_count": "vllm:request_decode_time_seconds_count",  # engine core's timestamps
    "round_s_sum": "specpair_round_seconds_sum",
    "round_s_count": "specpair_round_seconds_count",
    "drafter_s_sum": "specpair_drafter_round_seconds_sum",
    "drafter_s_count": "specpair_drafter_round_seconds_count",
    "chosen": "specpair_chosen_depth_total",  # the depth policy's choices, by depth
}
_BY_LABEL = {"per_pos": "position", "chosen": "depth"}  # counters kept as lists by label
# specpair's draft tokens by drafting mode (greedy, sampled, ngram): kept as "drafted_MODE"
BY_MODE = {"specpair_draft_tokens_total": "drafted"}


def spec_counters(*metrics_texts: str) -> dict[str, float | list[float]]:
    """The SPEC_COUNTERS found in Prometheus texts (summed over label sets; ``per_pos`` as a
    list by position, ``chosen`` by depth; BY_MODE's as one counter per mode); counters
    absent from every text are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {v: k for k, v in SPEC_COUNTERS.items()}
    out: dict[str, float | list[float]] = {}
    lists: dict[str, dict[int, float]] = {}
    le_counts: dict[float, float] = {}
    for text in metrics_texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = names.get(s.name)
                if key in _BY_LABEL:
                    got = lists.setdefault(key, {})
                    i = int(s.labels[_BY_LABEL[key]])
                    got[i] = got.get(i, 0.0) + s.value
                elif key is not None:
                    out[key] = out.get(key, 0.0) + s.value
                elif s.name in BY_MODE:
                    key = f"{BY_MODE[s.name]}_{s.labels['mode']}"
                    out[key] = out.get(key, 0.0) + s.value
                elif s.name == ROUND_BUCKET:
                    le = float(s.labels["le"])
                    le_counts[le] = le_counts.get(le, 0.0) + s.value
    for key, got in lists.items():
        out[key] = [got.get(i, 0.0) for i in range(max(got) + 1)]
    if le_counts:  # cumulative counts of rounds at or under each bound of ROUND_BUCKETS
        out["round_le"] = [le_counts.get(b, 0.0) for b in (*ROUND_BUCKETS, float("inf"))]
    return out


def round_quantile(round_le: list[float], q: float) -> float | None:
    """The smallest bucket bound (seconds) at or under which ``q`` of the rounds took: an
    upper bound of the q-quantile of the round time; inf past the last bound, None without
    rounds."""
    total = round_le[-1] if round_le else 0.0
    if total <= 0:
        return None
    bounds = (*ROUND_BUCKETS, float("inf"))
    return next(b for b, n in zip(bounds, round_le, strict=True) if n >= q * total)
