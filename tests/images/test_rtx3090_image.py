"""The rtx3090 drafter image serves a real round to a client on the host.

`docker run` the built image (host network) with its own `specpair drafter serve`, overriding
the image's default `--device cuda` with `--device cpu` (this host has no GPU), then drive it
from the host with the real DraftClient and DraftSession: the host's tiny target scores the
drafts and the reference verifier accepts or rejects them under the q the image shipped. Runs
when the image is loaded in Docker (`make image PROFILE=rtx3090`); skips, saying so, otherwise
(CI does not build the hardware images: images/README.md "Hardware profiles").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator

import pytest
import torch
from bench.pairprocs import new_key_file, read_ready

from specpair.deploy.release import image_tag
from specpair.models.tiny import TinyPair
from specpair.models.tokenizer import fingerprint
from specpair.sampling import SamplingParams
from specpair.verify import verify
from specpair.wire.assemble import to_proposal
from specpair.wire.client import DraftClient
from specpair.wire.frames import RequestParams
from specpair.wire.session import DraftSession, StepRequest

from .conftest import ROOT

IMAGE = image_tag("drafter", "rtx3090", ROOT)
V, K, ROUNDS = 512, 3, 4
START_TIMEOUT_S = 240  # the container imports CUDA torch + transformers on a busy 2-core box
KEY_IN_IMAGE = "/run/secrets/specpair.key"


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None:
        pytest.skip("no docker command on this host: the rtx3090 image test needs Docker")
    if _docker("image", "inspect", IMAGE).returncode != 0:
        pytest.skip(f"{IMAGE} is not loaded in docker (build it: make image PROFILE=rtx3090)")
    return IMAGE


@pytest.fixture(scope="module")
def served(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    key_file = new_key_file(tmp_path_factory.mktemp("rtx3090-key") / "wire.key")
    name = f"specpair-rtx3090-image-test-{os.getpid()}"
    proc = subprocess.Popen(
        [
            "docker",
            "run",
            "--rm",
            "--name",
            name,
            "--network",
            "host",
            "-v",
            f"{key_file}:{KEY_IN_IMAGE}:ro",
            image,
            "specpair",
            "drafter",
            "serve",
            "--model",
            "/opt/specpair/models/draft",
            "--device",
            "cpu",
            "--listen",
            "127.0.0.1:0",
            "--key-file",
            KEY_IN_IMAGE,
            "--metrics-port",
            "0",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()
    info = read_ready(proc.stdout, START_TIMEOUT_S)
    try:
        if info is None:
            raise AssertionError(
                f"the drafter in {image} did not start within "
                f"{START_TIMEOUT_S}s: {''.join(stderr)[-2000:]}"
            )
        yield {
            "port": int(info["listen"].rsplit(":", 1)[1]),
            "metrics": info["metrics"],
            "key": key_file.read_bytes().strip(),
            "stderr": stderr,
        }
    finally:
        _docker("stop", "--time", "10", name, timeout=60)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_images_default_command_drafts_on_cuda(image: str) -> None:
    cmd = json.loads(_docker("image", "inspect", "--format", "{{json .Config.Cmd}}", image).stdout)
    assert cmd[:3] == ["specpair", "drafter", "serve"]
    assert cmd[cmd.index("--device") + 1] == "cuda"


@torch.no_grad()
def test_a_live_round_from_the_host_is_verified(served: dict, tiny_pair: TinyPair) -> None:
    from transformers import AutoModelForCausalLM

    client = DraftClient(
        "127.0.0.1",
        served["port"],
        served["key"],
        vocab_size=V,
        tokenizer_fingerprint=fingerprint(tiny_pair.target),
        connect_timeout_s=10.0,
    )
    hello = client.connect()  # the handshake checks the image's tokenizer is the host's
    assert hello.vocab_size == V and hello.max_depth >= K
    target = AutoModelForCausalLM.from_pretrained(tiny_pair.target, local_files_only=True).eval()
    ctx = {r: [1, 10 + r, 20 + r, 30 + r] for r in range(3)}
    sampled = dict.fromkeys(ctx, 1)
    params = SamplingParams.make(len(ctx), temperature=1.0, seed=[100 + r for r in ctx])
    session = DraftSession(client, V, 30.0)
    accepted = 0
    try:
        for _ in range(ROUNDS):
            session.begin({str(r) for r in ctx})
            steps = []
            for r, c in ctx.items():
                start = session.needed_from(str(r), len(c))
                steps.append(
                    StepRequest(
                        str(r),
                        len(c),
                        torch.tensor(c[start:]),
                        sampled[r],
                        K,
                        RequestParams(1.0, 0, 1.0, 100 + r),
                    )
                )
            drafts = session.step(steps)
            assert all(d is not None for d in drafts), (session.counters, client.last_error)
            prop = to_proposal(drafts, K, V)
            logits = torch.stack(
                [
                    target(torch.tensor([c + prop.tokens[i].tolist()])).logits[0, -K - 1 :]
                    for i, c in enumerate(ctx.values())
                ]
            )
            pos = torch.tensor([len(c) for c in ctx.values()])
            verdict = verify(logits, prop, params, pos, on_missing="drop")
            assert not bool(verdict.dropped.any())
            accepted += int(verdict.num_accepted.sum())
            for i, r in enumerate(ctx):
                emitted = verdict.tokens[i, : int(verdict.num_emitted[i])].tolist()
                ctx[r] = ctx[r] + emitted
                sampled[r] = len(emitted)
    finally:
        client.close()
    assert accepted > 0  # 12 request-rounds at ~1.5 accepted each: 0 would mean garbage q
    with urllib.request.urlopen(f"http://{served['metrics']}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f"specpair_drafter_rounds_total {ROUNDS}" in text
    assert f'specpair_drafter_requests_total{{status="ok"}} {ROUNDS * len(ctx)}' in text
    with urllib.request.urlopen(f"http://{served['metrics']}/healthz", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "ready" and body["mode"] == "sampled"
