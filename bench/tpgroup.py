"""A real tensor-parallel group of vLLM on CPU, for the benchmarks and tests of the drafting
protocol's sharing and guard (``specpair.vllm.drafting``, ``specpair.vllm.tp``).

``run_ranks(fn, *args)`` starts ``size`` processes (spawned), sets up vLLM's distributed
state in each as a vLLM worker does (``init_distributed_environment`` over gloo on
127.0.0.1, ``initialize_model_parallel`` with tensor parallelism ``size``: the TP group's
CPU group and its shared-memory message queue), calls ``fn(rank, *args)`` in each and
returns their results by rank. ``fn`` must be importable (a module-level function); an
exception in a rank comes back as ``RankError`` (its type name and message) instead of a
result, so a test can assert that every rank raised.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.multiprocessing as mp

__all__ = ["RankError", "run_ranks"]


@dataclass(frozen=True)
class RankError:
    """What a rank raised instead of returning."""

    kind: str  # the exception's class name
    message: str  # its message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, size: int, port: int, fn: Callable[..., Any], args: tuple,
          out: Any) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    torch.set_num_threads(1)
    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(world_size=size, rank=rank, local_rank=rank,
                                        distributed_init_method=f"tcp://127.0.0.1:{port}",
                                        backend="gloo")
        ps.initialize_model_parallel(tensor_model_parallel_size=size)
    try:
        result: Any = fn(rank, *args)
    except Exception as exc:
        result = RankError(type(exc).__name__, str(exc))
    # pickled here: a queue would share tensors by file descriptor, gone once the rank exits
    out.put((rank, pickle.dumps(result)))


def run_ranks(fn: Callable[..., Any], *args: Any, size: int = 2,
              timeout_s: float = 300.0) -> list[Any]:
    """``fn(rank, *args)`` in each of ``size`` ranks of a real TP group; results by rank."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, size, port, fn, args, out), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(size):
            rank, result = out.get(timeout=timeout_s)
            results[rank] = pickle.loads(result)
    except queue.Empty:
        raise TimeoutError(f"a rank of the TP group gave no result within {timeout_s:g} s "
                           f"(got ranks {sorted(results)})") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(size)]
