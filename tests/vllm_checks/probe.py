"""Sampling probe: run vLLM (whichever `vllm` is first on sys.path) on a model; print JSON.

    python tests/vllm_checks/probe.py --model DIR --spec remote --prompts '[[5, 6, 7]]' \
        --greedy-tokens 16 --samples 1000

The end-to-end tests and the in-image sampling gate run it in a subprocess (by path,
``PROBE``: images carry tests/, and specpair comes from the environment), so
each run imports its own (overlaid) vLLM and starts one engine
(VLLM_ENABLE_V1_MULTIPROCESSING=0, eager mode). The last stdout line starting
with RESULT_MARK carries the JSON report (vLLM logs to stdout too). Phases
(each optional):

- greedy: every prompt of --prompts at temperature 0, --greedy-tokens tokens;
- sample: --samples requests of prompt 0 at temperature 1, seeds SEED_BASE + 0..N-1,
  --sample-tokens tokens each;
- kill: --kill-pid is SIGKILLed after --kill-after engine steps of a greedy
  batch; every request must still finish.

Speculative decoding: --spec remote uses specpair's remote drafter
(custom_class specpair.vllm.v1.RemoteProposer; the drafter address comes from
SPECPAIR_DRAFTER), --spec none runs the target alone.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

RESULT_MARK = "SPECPAIR_RESULT "  # prefixes the one JSON line the tests read
PROBE = os.path.abspath(__file__)  # what the tests run: [sys.executable, PROBE, ...]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _runner(llm):  # noqa: ANN001, ANN202
    core = llm.llm_engine.engine_core.engine_core
    return core.model_executor.driver_worker.worker.model_runner


def _spec_metrics(llm) -> dict:  # noqa: ANN001
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            if hasattr(m, "values"):
                out[m.name] = list(m.values)
            else:
                out[m.name] = getattr(m, "value", None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(prog="python tests/vllm_checks/probe.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--spec", choices=["none", "remote"], default="none")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    ap.add_argument("--greedy-tokens", type=int, default=0)
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--sample-tokens", type=int, default=3)
    ap.add_argument("--seed-base", type=int, default=0,
                    help="sampled request i uses seed SEED_BASE + i (independent runs: "
                    "use disjoint ranges)")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--kill-after", type=int, default=4)
    ap.add_argument("--kill-tokens", type=int, default=24)
    args = ap.parse_args()

    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    spec = None
    if args.spec == "remote":
        spec = {"method": "custom_class", "model": "specpair.vllm.v1.RemoteProposer",
                "num_speculative_tokens": args.depth}
    llm = LLM(model=args.model, dtype="float32", max_model_len=256, max_num_seqs=128,
              enforce_eager=True, speculative_config=spec, disable_log_stats=False, seed=0)
    report: dict = {"vllm_file": vllm.__file__, "start_s": time.perf_counter() - t0}
    prompts = [{"prompt_token_ids": p} for p in json.loads(args.prompts)]

    if args.greedy_tokens:
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(temperature=0.0,
                                                    max_tokens=args.greedy_tokens,
                                                    ignore_eos=True), use_tqdm=False)
        report["greedy"] = [list(o.outputs[0].token_ids) for o in outs]
        report["greedy_s"] = time.perf_counter() - t

    if args.samples:
        t = time.perf_counter()
        params = [SamplingParams(temperature=1.0, max_tokens=args.sample_tokens,
                                 seed=args.seed_base + s, ignore_eos=True)
                  for s in range(args.samples)]
        outs = llm.generate([prompts[0]] * args.samples, params, use_tqdm=False)
        report["samples"] = [list(o.outputs[0].token_ids) for o in outs]
        report["sample_s"] = time.perf_counter() - t

    if args.kill_pid:
        t = time.perf_counter()
        engine = llm.llm_engine
        sp = SamplingParams(temperature=0.0, max_tokens=args.kill_tokens, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(f"kill-{i}", p, sp)
        finished: dict[str, list[int]] = {}
        steps = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = list(out.outputs[0].token_ids)
            steps += 1
            if steps == args.kill_after:
                os.kill(args.kill_pid, signal.SIGKILL)
                report["killed_at_step"] = steps
                report["spec_metrics_at_kill"] = _spec_metrics(llm)
        report["kill_steps"] = steps
        report["kill"] = [finished.get(f"kill-{i}") for i in range(len(prompts))]
        report["kill_s"] = time.perf_counter() - t

    if args.spec == "remote":
        from dataclasses import asdict

        from specpair.vllm.v1 import VERIFY_COUNTERS

        runner = _runner(llm)  # V1 keeps the proposer in .drafter, V2 in .speculator
        proposer = getattr(runner, "drafter", None) or runner.speculator
        remote = proposer.drafting.remote
        report["counters"] = asdict(remote.counters) if remote else None
        report["chosen_depths"] = proposer.drafting.policy.chosen  # the depth policy's choices by k
        report["verify_counters"] = asdict(VERIFY_COUNTERS)
    report["spec_metrics"] = _spec_metrics(llm)
    print(RESULT_MARK + json.dumps(report), flush=True)  # vLLM logs to stdout too
    return 0


if __name__ == "__main__":
    sys.exit(main())
