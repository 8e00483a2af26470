#!/usr/bin/env python3
"""Talk to the local pair's vLLM target (stdlib only; run by scripts/local-pair.sh).

  wait      poll GET /health until it answers 200 (exit 1 after --timeout seconds); the time
            it reports counts from --since (a Unix time: the start of the caller's whole wait,
            of which this call may be one of many), else from its own start
  complete  send one real completion (temperature 1, seeded), then print the text and vLLM's
            speculative-decoding figures from /metrics: drafts, draft tokens, accepted tokens,
            acceptance rate, mean accepted length per round, accepted per draft position, and
            specpair's own accepted count per position beside vLLM's (they must be equal, at
            any tensor parallelism); then REPEAT identical seeded requests at once, which must
            give one completion (a seeded request is reproducible whatever runs beside it).
            Exit 1 if no draft token was proposed (the pair is not speculating), the accepted
            counts differ, or the seeded requests differ.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request

PROMPT = "import os\n\n\ndef read_config(path):\n    "  # Python: the trained pair (docs/models.md)
MODEL = "specpair-trained"  # the name compose/local-cpu.yml serves the trained pair under
# 48 tokens take seconds on an idle 2-core box; 120 s ran out on one loaded ~15x over.
COMPLETION_TIMEOUT_S = 300


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait(port: int, timeout: float, since: float | None = None) -> int:
    since = time.time() if since is None else since
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _get(f"http://127.0.0.1:{port}/health", 2.0)
            print(f">> target healthy after {time.time() - since:.0f}s")
            return 0
        except (urllib.error.URLError, OSError):
            time.sleep(2)
    print(f"error: http://127.0.0.1:{port}/health did not answer within {timeout:.0f}s",
          file=sys.stderr)
    return 1


def spec_metrics(text: str) -> dict[str, float]:
    """vllm:spec_decode_*_total counters from a Prometheus text page, summed over label sets
    (per-position counters keep their position: `...per_pos_total[2]`)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:spec_decode_[a-z_]+_total)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not m:
            continue
        name = m.group(1)
        pos = re.search(r'position="(\d+)"', m.group(2) or "")
        key = f"{name}[{pos.group(1)}]" if pos else name
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def _completion(port: int, max_tokens: int, seed: int) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": seed}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=COMPLETION_TIMEOUT_S) as r:
        return json.loads(r.read())


def specpair_accepted(text: str) -> dict[int, float]:
    """specpair_accepted_drafts_total by draft position (1..K), summed over modes."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        m = re.match(r'^specpair_accepted_drafts_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$',
                     line)
        if m:
            out[int(m.group(1))] = out.get(int(m.group(1)), 0.0) + float(m.group(2))
    return out


def late_items(page: str) -> float:
    """The draft items a target's /metrics page counts missing because their round came
    after the deadline (0 where the series is absent)."""
    m = re.search(r'^specpair_items_total\{outcome="missing",reason="late"\} (\S+)$', page, re.M)
    return float(m.group(1)) if m else 0.0


def late_items_on(port: int) -> float:
    return late_items(_get(f"http://127.0.0.1:{port}/metrics"))


def repeat_seeded(port: int, max_tokens: int, n: int) -> int:
    """n identical seeded requests at once: 0 when they give one completion. A round past the
    deadline is no drafts for its requests, which changes a seeded request's path: the late
    items meanwhile are printed beside the count (none is expected: the pair's deadline,
    compose/local-cpu.yml, is 2 s)."""
    late0 = late_items_on(port)
    texts: list[str | None] = [None] * n

    def one(i: int) -> None:
        texts[i] = _completion(port, max_tokens, 7)["choices"][0]["text"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    distinct = len(set(texts))
    late = late_items_on(port) - late0
    print(f">> {n} identical requests at once (temperature 1, seed 7): {distinct} distinct "
          f"completion(s); draft items late meanwhile: {late:.0f}")
    if None in texts or distinct != 1:
        print("error: identical seeded requests gave different completions"
              + (f" ({late:.0f} draft items came after the round deadline: a late round is no "
                 "drafts for its requests, and seeded requests are reproducible only where no "
                 "round is late)" if late else ""), file=sys.stderr)
        return 1
    return 0


def complete(port: int, drafter_metrics_port: int | None, max_tokens: int,
             repeat: int = 4) -> int:
    t0 = time.monotonic()
    try:
        answer = _completion(port, max_tokens, 0)
    except (urllib.error.URLError, OSError, ValueError) as err:  # timeouts are OSErrors
        print(f"error: the completion failed after {time.monotonic() - t0:.0f}s: {err}",
              file=sys.stderr)
        return 1
    seconds = time.monotonic() - t0
    choice = answer["choices"][0]
    print(f">> completion ({answer['usage']['completion_tokens']} tokens in {seconds:.2f}s, "
          f"temperature 1, seed 0):")
    print(f"   prompt: {PROMPT!r}")
    print(f"   output: {choice['text']!r}")
    page = _get(f"http://127.0.0.1:{port}/metrics")
    m = spec_metrics(page)
    drafts = m.get("vllm:spec_decode_num_drafts_total", 0.0)
    drafted = m.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    accepted = m.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    print(">> acceptance (vLLM spec-decode metrics, cumulative since start):")
    print(f"   drafts (rounds)        {drafts:.0f}")
    print(f"   draft tokens proposed  {drafted:.0f}")
    print(f"   draft tokens accepted  {accepted:.0f}")
    if drafted:
        print(f"   acceptance rate        {accepted / drafted:.3f}")
    if drafts:
        print(f"   mean accepted length   {1 + accepted / drafts:.3f} tokens per round "
              "(accepted + 1 from the target)")
    per_pos = sorted((k, v) for k, v in m.items() if k.endswith("]") and "per_pos" in k)
    if per_pos:
        print("   accepted per position  " + "  ".join(f"{k.rsplit('[', 1)[1][:-1]}:{v:.0f}"
                                                     for k, v in per_pos))
    if drafter_metrics_port:
        try:
            lines = [ln for ln in _get(f"http://127.0.0.1:{drafter_metrics_port}/metrics")
                     .splitlines() if ln.startswith("specpair_") and not ln.startswith("#")]
            print(">> drafter metrics: " + "; ".join(lines[:8]))
        except (urllib.error.URLError, OSError) as err:
            print(f">> drafter metrics unavailable: {err}")
    if not drafted:
        print("error: the target proposed no draft tokens: remote drafting is not working",
              file=sys.stderr)
        return 1
    ours = specpair_accepted(page)
    theirs = {int(k.rsplit("[", 1)[1][:-1]) + 1: v for k, v in per_pos}
    print(f">> specpair's accepted by position {dict(sorted(ours.items()))}, vLLM's "
          f"{dict(sorted(theirs.items()))}")
    if ours != theirs:
        print("error: specpair's accepted drafts differ from vLLM's: a round counted twice or "
              "not at all", file=sys.stderr)
        return 1
    try:
        return repeat_seeded(port, max_tokens, repeat) if repeat else 0
    except (urllib.error.URLError, OSError, ValueError) as err:
        print(f"error: a seeded completion failed: {err}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait", help="wait until the target's /health answers")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--timeout", type=float, default=300.0)
    w.add_argument("--since", type=float, default=None,
                   help="Unix time the reported wait counts from (default: now)")
    c = sub.add_parser("complete", help="one completion, then the acceptance figures")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--drafter-metrics-port", type=int, default=None)
    c.add_argument("--max-tokens", type=int, default=48)
    c.add_argument("--repeat", type=int, default=4,
                   help="identical seeded requests sent at once after the first (0: none)")
    args = parser.parse_args(argv)
    if args.cmd == "wait":
        return wait(args.port, args.timeout, args.since)
    return complete(args.port, args.drafter_metrics_port, args.max_tokens, args.repeat)


if __name__ == "__main__":
    sys.exit(main())
