"""The `make up` pair in containers for the pair tests (test_pair_restart.py at TP = 1,
test_rank_restart.py at TP = 2): started by scripts/local-pair.sh from the cpu images under a
compose project and ports of its own, so it runs beside anyone's `make up`; its HTTP and
/metrics read back, and its containers inspected by compose service."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from specpair.deploy.release import image_tag

ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 900  # a target start on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 120.0) -> str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def samples(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}, and each name summed over its label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def local_pair(root: Path, tp: int, **extra: str) -> Iterator[dict]:
    """A module fixture's body: the pair up (`scripts/local-pair.sh up` with SPECPAIR_TP=tp),
    its environment yielded, then down."""
    missing = [t for t in (image_tag("drafter", "cpu", ROOT), image_tag("target", "cpu", ROOT))
               if subprocess.run(["docker", "image", "inspect", t],
                                 capture_output=True).returncode != 0]
    assert not missing, f"images {missing} are not in Docker: `make image` builds them"
    env = dict(
        os.environ,
        SPECPAIR_TP=str(tp),
        SPECPAIR_PROJECT=f"specpair-pair-test-{tp}-{os.getpid()}",
        SPECPAIR_KEY_FILE=str(root / "specpair.key"),
        SPECPAIR_TARGET_PORT=str(free_port()),
        SPECPAIR_DRAFTER_PORT=str(free_port()),
        SPECPAIR_METRICS_PORT=str(free_port()),
        SPECPAIR_MASTER_PORT=str(free_port()),
        UP_TIMEOUT_S=str(UP_TIMEOUT_S),
        **extra,
    )
    script = str(ROOT / "scripts" / "local-pair.sh")
    try:
        # stdout inherited: its progress is live under `pytest -s` (make pair-test)
        up = subprocess.run([script, "up"], env=env, timeout=UP_TIMEOUT_S + 300)
        assert up.returncode == 0, f"scripts/local-pair.sh up exited {up.returncode}"
        yield env
    finally:
        subprocess.run([script, "down"], env=env, timeout=120)


def container(env: dict, service: str) -> dict:
    """`docker inspect` of the pair's one container of compose service `service`."""
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter",
         f"label=com.docker.compose.project={env['SPECPAIR_PROJECT']}",
         "--filter", f"label=com.docker.compose.service={service}"],
        capture_output=True, text=True, check=True).stdout.split()
    assert len(ids) == 1, f"{service}: containers {ids}"
    out = subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)[0]
