"""`specpair drafter serve`: a draft model behind the probability wire."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from pathlib import Path

from specpair.draft import DraftMode
from specpair.drafter.errors import ModelLoadError
from specpair.drafter.metrics import Metrics, Readiness, serve_metrics
from specpair.wire.auth import MIN_KEY_BYTES, load_key
from specpair.wire.errors import BadKey


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
        "stdout when it is ready.")
    serve.add_argument("--model", type=Path, required=True,
                       help="local HF model directory (config.json, weights, tokenizer files)")
    serve.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="where the draft model runs (default cpu)")
    serve.add_argument("--listen", default="127.0.0.1:7070", metavar="HOST:PORT",
                       help="address to accept the target on (default 127.0.0.1:7070; "
                       "port 0 picks a free one)")
    serve.add_argument("--key-file", type=Path, required=True,
                       help=f"file holding the pre-shared key (>= {MIN_KEY_BYTES} bytes; "
                       "surrounding whitespace is stripped)")
    serve.add_argument("--metrics-port", type=int, default=None, metavar="P",
                       help="serve Prometheus metrics on http://127.0.0.1:P/metrics and "
                       "readiness on /healthz (200 once the model is loaded and the wire "
                       "server listens, else 503; 0 picks a free port; default off)")
    serve.add_argument("--mode", choices=("sampled", "greedy"), default="sampled",
                       help="sampled: drafts d ~ q with q on the wire (default); greedy: "
                       "argmax drafts declared as point masses")
    serve.add_argument("--draft-top-k", type=int, default=0, metavar="N",
                       help="truncate every draft law to its N most likely tokens (0 = off)")
    serve.add_argument("--max-depth", type=int, default=16, metavar="K",
                       help="largest K served, 1..32 (default 16)")
    serve.add_argument("--threads", type=int, default=0, metavar="N",
                       help="torch CPU threads (default: torch's choice)")
    serve.add_argument("--idle-release-s", type=float, default=30.0, metavar="S",
                       help="free a request no round touched for S seconds (default 30; the "
                       "target releases finished requests only at its next step, so an idle "
                       "target would leave them held; freed too early costs one RESYNC)")
    serve.set_defaults(func=_serve)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT with PORT in 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def _serve(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except (BadKey, ModelLoadError, ValueError, OSError) as e:
        print(f"specpair drafter serve: {e}", file=sys.stderr)
        return 2


def _expire_idle(engine, every_s: float, stop: threading.Event) -> None:  # noqa: ANN001
    """Free the engine's idle requests every ``every_s`` seconds until ``stop`` is set."""
    while not stop.wait(every_s):
        engine.expire()


def _run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    from specpair.drafter.engine import DrafterEngine
    from specpair.drafter.model import HFDraftModel
    from specpair.models.tokenizer import fingerprint
    from specpair.wire.format import VERSION
    from specpair.wire.server import serve

    host, port = parse_listen(args.listen)
    key = load_key(args.key_file)
    if args.draft_top_k < 0:
        raise ValueError(f"--draft-top-k must be >= 0, got {args.draft_top_k}")
    if not args.idle_release_s > 0:
        raise ValueError(f"--idle-release-s must be > 0, got {args.idle_release_s}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
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
        engine = DrafterEngine(
            HFDraftModel(args.model, args.device), tokenizer_fingerprint=fp,
            wire_version=VERSION,
            mode=DraftMode.GREEDY if args.mode == "greedy" else DraftMode.SAMPLED,
            draft_top_k=args.draft_top_k, max_depth=args.max_depth, metrics=metrics,
            idle_release_s=args.idle_release_s)
        readiness.engine_loaded(args.mode)
        threading.Thread(target=_expire_idle, name="expire-idle", daemon=True,
                         args=(engine, min(5.0, args.idle_release_s / 2), stop_expiry)).start()

        def ready(bound: int) -> None:
            readiness.listening(f"{host}:{bound}")
            print(json.dumps({"listen": f"{host}:{bound}", "metrics": None if http is None
                              else f"127.0.0.1:{http.server_address[1]}"}), flush=True)

        serve(engine, engine.hello(), host, port, key=key, ready=ready)  # until SIGTERM/SIGINT
    finally:
        readiness.listening(None)
        stop_expiry.set()
        if http is not None:
            http.shutdown()
    print("specpair drafter serve: stopped", file=sys.stderr)
    return 0
