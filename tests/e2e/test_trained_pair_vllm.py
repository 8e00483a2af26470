"""The committed trained pair (models/trained) served as `make up` serves it, in-process.

vLLM 0.32.0 (cpu, an overlaid symlinked copy first on PYTHONPATH) serves the trained target
with the remote sampled speculator (K = 3) and a real `specpair drafter serve` on the trained
draft: one greedy completion of a Python prompt and one chat completion, both read as text
(printable, Python-looking), and drafts were accepted. Slow (an engine start); skipped
without vllm or without the committed pair.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from vllm_e2e_support import (
    NEEDS_TRAINED_PAIR,
    NEEDS_VLLM,
    ApiServer,
    Drafter,
    free_port,
    new_key_file,
    overlaid_vllm,
)

from specpair.models.train import PINNED_DIR

pytestmark = [
    pytest.mark.slow,
    NEEDS_VLLM,
    NEEDS_TRAINED_PAIR,
]

MODEL = "specpair-trained"  # the name bench-live serves it under too (bench.live.run)
PROMPT = "import os\n\n\ndef read_config(path):\n    "
PY_WORDS = re.compile(r"\b(self|def|return|if|else|for|in|import|not|None|is|and|or|the)\b")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained-pair")
    key = new_key_file(root / "key")
    prom = root / "prometheus"
    prom.mkdir()
    drafter = Drafter(PINNED_DIR / "draft", key, root / "drafter.log")
    env = {"SPECPAIR_DRAFTER": drafter.address, "SPECPAIR_DRAFTER_KEY_FILE": str(key),
           "SPECPAIR_DRAFT_DEADLINE_MS": "2000", "PROMETHEUS_MULTIPROC_DIR": str(prom),
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "HF_HUB_OFFLINE": "1"}
    spec = ('{"method": "custom_class", "model": "specpair.vllm.v1.RemoteProposer", '
            '"num_speculative_tokens": 3}')
    api = ApiServer(overlaid_vllm(root / "vllm"), PINNED_DIR / "target", root / "vllm.log",
                    free_port(), ["--served-model-name", MODEL, "--dtype", "float32",
                                  "--max-model-len", "256", "--max-num-seqs", "8",
                                  "--enforce-eager", "--seed", "0", "--speculative-config",
                                  spec], env)
    try:
        api.wait_healthy(600)
        yield api
    finally:
        api.stop()
        drafter.stop()


def _post(api: ApiServer, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{api.url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _reads_as_text(text: str) -> bool:
    printable = sum(c.isprintable() or c in "\n\t" for c in text)
    return (len(text) >= 40 and printable == len(text)
            and len(PY_WORDS.findall(text)) >= 2)  # words of Python, not byte soup


def test_completion_and_chat_read_as_python(server) -> None:
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 48,
                                          "temperature": 0.0, "ignore_eos": True})
    text = r["choices"][0]["text"]
    print(f"completion: {PROMPT + text!r}")
    assert _reads_as_text(text), repr(text)
    # a T = 1 sample of a small model may come out as soup: most of three must read as text
    # (which draws the verifier makes depends on the depths the adaptive policy chose, and
    # those on step timing, so a seed does not fix the reply)
    replies = []
    for seed in range(3):
        chat = _post(server, "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 48, "temperature": 1.0, "seed": seed,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "a function that sorts a list"}]})
        replies.append(chat["choices"][0]["message"]["content"])
        print(f"chat (seed {seed}): {replies[-1]!r}")
    assert sum(map(_reads_as_text, replies)) >= 2, replies
    metrics = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()
    accepted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("specpair_accepted_drafts_total{"))
    print(f"accepted drafts: {accepted}")
    assert accepted > 0
