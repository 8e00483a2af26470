"""The drafter's bounds under load: fairness (one target's huge rounds must not starve
another's) and memory (what requests that are never released can hold).

Fairness: two targets on one drafter (the tiny draft model behind a real WireServer on
127.0.0.1, one torch thread, the server's default chunking). The hog sends, back to back,
the largest rounds this bench affords: 48 whole 1900-token histories (the round of the
finding; the tiny model holds 2048 positions). The other target ("victim") sends rounds of 4
requests, K = 3, one committed token and one accepted draft per round, as in serving. Its round
time (DraftClient.propose wall time, client deadline 5 s so that late rounds are still timed)
is compared with the default target deadline (SPECPAIR_DRAFT_DEADLINE_MS, 200 ms), alone and
beside the hog; repetitions alternate alone / beside the hog. Medians over repetitions, ranges
in brackets.

Memory: a fresh process (so RSS is its own) loads the engine behind a WireServer (default
bounds: one connection holds at most 2048 requests, so 952 of the 3000 are evicted least
recently used on the way), one client sends 3000 requests of 200-token whole histories
(30 rounds of 100, K = 3) and never releases them, then closes its connection (the drafter
releases what it carried). RSS (VmRSS) at start (model loaded, one warm-up round), at the
peak, and after the release; the documented bound is --max-held-tokens x the model's KV
bytes per token (docs/wire.md section 5.2).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

DEADLINE_S = 0.200  # the target's default per-step deadline (specpair.vllm.settings)
KEY = b"bench-limits-key-0123456789"
FP = bytes(32)
REPS = 3
VICTIM_ROUNDS = 30


def _engine(model_dir: Path):
    from specpair.drafter.engine import DrafterEngine
    from specpair.drafter.model import HFDraftModel
    from specpair.wire.codec.header import VERSION

    model = HFDraftModel(model_dir)
    return model, DrafterEngine(model, tokenizer_fingerprint=FP, wire_version=VERSION)


def _client(port: int, v: int):
    from specpair.wire.client import DraftClient

    return DraftClient("127.0.0.1", port, KEY, vocab_size=v, tokenizer_fingerprint=FP)


class _Victim:
    """A target with 4 live requests; each round commits one accepted draft and one token."""

    def __init__(self, client, base: int) -> None:
        self.client, self.base = client, base
        self.hist = {base + r: [1, 5 + r, 9] for r in range(4)}
        self.new = {r: list(h) for r, h in self.hist.items()}
        self.acc = dict.fromkeys(self.hist, 0)

    def round(self) -> float:
        from specpair.wire.frames import DraftItem, ProposeItem, RequestParams

        p = RequestParams(1.0, 0, 1.0, 7)
        items = [ProposeItem(r, torch.tensor(self.new[r]), self.acc[r], len(self.hist[r]), 3, p,
                             None) for r in self.hist]
        t = time.perf_counter()
        got = self.client.propose(items, 5.0)
        dt = time.perf_counter() - t
        for r, d in zip(self.hist, got, strict=True):
            if isinstance(d, DraftItem):  # one draft accepted, then the target's own token
                self.acc[r], self.new[r] = 1, [int(d.tokens[0]), 11]
                self.hist[r] = self.hist[r] + self.new[r]
            else:  # missing: the next round resends the whole history
                self.hist[r] = self.hist[r] + [11]
                self.acc[r], self.new[r] = 0, list(self.hist[r])
        return dt


def _hog(client, v: int, stop: threading.Event, started: threading.Event) -> None:
    from specpair.wire.frames import ProposeItem, RequestParams

    g = torch.Generator().manual_seed(1)
    p = RequestParams(1.0, 0, 1.0, 3)
    while not stop.is_set():
        items = [ProposeItem(50_000 + r, torch.randint(1, v, (1900,), generator=g), 0, 1900, 3,
                             p, None) for r in range(48)]
        started.set()
        client.propose(items, 120.0)


def _fairness(model_dir: Path) -> None:
    from specpair.wire.server import ServerThread

    model, engine = _engine(model_dir)
    v = model.vocab_size
    runs: dict[str, list[list[float]]] = {"alone": [], "beside the hog": []}
    hog_rounds = []
    with ServerThread(engine, engine.hello(), KEY) as srv:
        for rep in range(REPS):
            for mode in runs:
                with _client(srv.port, v) as c:
                    victim = _Victim(c, 1000 * (rep + 1) + (0 if mode == "alone" else 500))
                    victim.round()  # connect and prefill
                    stop, started = threading.Event(), threading.Event()
                    hog = None
                    if mode != "alone":
                        hc = _client(srv.port, v)
                        hc.ensure_connected(10.0)
                        hog = threading.Thread(target=_hog, args=(hc, v, stop, started))
                        t_hog = time.perf_counter()
                        hog.start()
                        started.wait(10.0)
                        time.sleep(0.3)  # its round is in the drafter
                    lat = [victim.round() for _ in range(VICTIM_ROUNDS)]
                    runs[mode].append(lat)
                    if hog is not None:
                        stop.set()
                        hog.join()
                        hog_rounds.append(time.perf_counter() - t_hog)
                        hc.close()
    print("\n## Two targets on one drafter: the victim's round time vs its deadline "
          f"({DEADLINE_S * 1e3:.0f} ms), tiny draft model, 1 torch thread\n")
    print(f"Hog: 48 whole 1900-token histories per round, back to back; victim: 4 requests, "
          f"K = 3, {VICTIM_ROUNDS} rounds per repetition, {REPS} repetitions (alternating); "
          "median [range] over repetitions.\n")
    print("| victim | p50 ms | p99 ms | max ms | rounds over the deadline |")
    print("|---|---|---|---|---|")
    for mode, reps in runs.items():
        p50 = [statistics.median(r) * 1e3 for r in reps]
        p99 = [statistics.quantiles(r, n=100, method="inclusive")[98] * 1e3 for r in reps]
        mx = [max(r) * 1e3 for r in reps]
        late = [sum(x > DEADLINE_S for x in r) for r in reps]
        print(f"| {mode} | {_mr(p50)} | {_mr(p99)} | {_mr(mx)} | "
              f"{statistics.median(late):.0f} of {VICTIM_ROUNDS} [{min(late)}-{max(late)}] |")
    print(f"\nThe hog's rounds took {_mr(hog_rounds, 's', 1)} each (repetition wall time, "
          "while the victim ran).")


def _mr(xs: list[float], unit: str = "", nd: int = 1) -> str:
    return f"{statistics.median(xs):.{nd}f}{unit} [{min(xs):.{nd}f}-{max(xs):.{nd}f}]"


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def memory_worker(model_dir: str) -> None:
    """Run in a fresh process: prints one JSON line of RSS figures."""
    torch.set_num_threads(1)
    from specpair.wire.frames import ProposeItem, RequestParams
    from specpair.wire.server import ServerThread

    model, engine = _engine(Path(model_dir))
    v = model.vocab_size
    g = torch.Generator().manual_seed(2)
    p = RequestParams(1.0, 0, 1.0, 3)
    with ServerThread(engine, engine.hello(), KEY) as srv:
        with _client(srv.port, v) as c:  # warm-up: one round, released
            c.propose([ProposeItem(9_999_999, torch.randint(1, v, (200,), generator=g), 0, 200,
                                   3, p, None)], 30.0)
            c.release([9_999_999])
        time.sleep(0.5)
        start = _rss_mib()
        peak, live = start, 0
        with _client(srv.port, v) as c:
            for rnd in range(30):
                items = [ProposeItem(rnd * 100 + r, torch.randint(1, v, (200,), generator=g), 0,
                                     200, 3, p, None) for r in range(100)]
                c.propose(items, 60.0)
                peak = max(peak, _rss_mib())
            live, held = engine.live_requests(), engine.held_tokens()
        t = time.monotonic()
        while engine.live_requests() and time.monotonic() - t < 30:
            time.sleep(0.05)  # the connection's close releases its requests
        time.sleep(0.5)
        after, live_after = _rss_mib(), engine.live_requests()
    print(json.dumps({"live_after": live_after, "start": start, "peak": peak, "after": after,
                      "live": live, "held": held,
                      "kv_bytes_per_token": model.kv_bytes_per_token,
                      "bound_tokens": engine.max_held_tokens}))


def _memory(model_dir: Path) -> None:
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", "import sys; from bench.limits import "
                              "memory_worker; memory_worker(sys.argv[1])", str(model_dir)],
                             capture_output=True, text=True, timeout=600, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    r0 = runs[0]
    bound_mib = r0["bound_tokens"] * r0["kv_bytes_per_token"] / 2**20
    print("\n## Drafter memory: 3000 unreleased requests (200-token histories), then their "
          "release (connection closed)\n")
    print(f"Fresh process per repetition, {len(runs)} repetitions; median [range]. Documented "
          f"bound: --max-held-tokens {r0['bound_tokens']:,} x {r0['kv_bytes_per_token']:,} KV "
          f"bytes per token = {bound_mib:,.0f} MiB above the start.\n")
    print("| live requests (sent 3000) | tokens held | RSS start MiB | RSS peak MiB "
          "| peak - start MiB | RSS after release MiB | after / start | live after |")
    print("|---|---|---|---|---|---|---|---|")
    col = {k: [r[k] for r in runs] for k in ("start", "peak", "after")}
    growth = [r["peak"] - r["start"] for r in runs]
    ratio = [r["after"] / r["start"] for r in runs]
    print(f"| {r0['live']:,} | {r0['held']:,} | {_mr(col['start'])} | {_mr(col['peak'])} | "
          f"{_mr(growth)} | {_mr(col['after'])} | {_mr(ratio, '', 3)} | "
          f"{max(r['live_after'] for r in runs)} |")
    ok_bound = all(g <= bound_mib for g in growth)
    ok_back = all(x <= 1.10 for x in ratio)
    print(f"\nTargets: peak - start under the bound ({'met' if ok_bound else 'MISSED'}); RSS "
          f"after release within 10 % of its start ({'met' if ok_back else 'MISSED'}).")


def main() -> None:
    from specpair.models.tiny import make_tiny

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pair = make_tiny(Path(tmp))
            _fairness(pair.draft)
            _memory(pair.draft)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
