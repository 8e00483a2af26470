"""Live loopback: a real `specpair drafter serve` process and the real DraftClient.

One drafter process serves the first tests; the last test kills it mid-round,
restarts it on the same port and stops the restart with SIGTERM (two process
starts in all: each costs seconds on a 2-core machine). The target side is the
tiny target model in this process with the reference verifier.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from bench.pairprocs import new_key_file, read_ready
from transformers import AutoModelForCausalLM

from specpair.models.tiny import TinyPair
from specpair.models.tokenizer import fingerprint
from specpair.proposal import Proposal
from specpair.rng import Stream, uniform
from specpair.sampling import SamplingParams, process_logits, sample_from_weights
from specpair.verify import Verdict, verify
from specpair.wire.assemble import to_proposal
from specpair.wire.client import DraftClient
from specpair.wire.codec import encode
from specpair.wire.conn import Connection
from specpair.wire.errors import AuthFailed
from specpair.wire.frames import ItemStatus, Propose, ProposeItem, RequestParams
from specpair.wire.session import DraftSession, StepRequest
from specpair.wire.source import Missing, MissingReason

V, K = 512, 3
START_TIMEOUT_S = 120  # a drafter process imports torch + transformers: slow on a busy box
IDLE_RELEASE_S = 4.0  # the drafter frees requests idle this long (rounds here come ms apart)
PINNED = max(os.sched_getaffinity(0))  # the drafter's --cpus: one of this process's CPUs


@dataclass
class Drafter:
    proc: subprocess.Popen
    port: int
    metrics: str | None
    stderr: list[str] = field(default_factory=list)


def start_drafter(model: Path, key_file: Path, port: int = 0) -> Drafter:
    cmd = [sys.executable, "-m", "specpair", "drafter", "serve", "--model", str(model),
           "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file),
           "--metrics-port", "0", "--threads", "1", "--idle-release-s", str(IDLE_RELEASE_S),
           "--cpus", str(PINNED)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    info = read_ready(proc.stdout, START_TIMEOUT_S)
    if info is None:
        proc.kill()
        raise AssertionError(f"drafter did not start: {''.join(lines)[-2000:]}")
    return Drafter(proc, int(info["listen"].rsplit(":", 1)[1]), info["metrics"], lines)


class Target:
    """The target side: committed histories, the tiny target's logits, the verifier."""

    def __init__(self, pair: TinyPair, n: int) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(pair.target,
                                                          local_files_only=True).eval()
        self.ctx = {r: [1, 10 + r, 20 + r, 30 + r] for r in range(n)}
        self.sampled = dict.fromkeys(self.ctx, 1)  # tokens committed by the last round
        self.params = SamplingParams.make(n, temperature=1.0, seed=[100 + r for r in range(n)])

    def whole(self, r: int) -> ProposeItem:
        """Request r's whole history as one wire item."""
        c = self.ctx[r]
        return ProposeItem(r, torch.tensor(c), 0, len(c), K, RequestParams(1.0, 0, 1.0, 100 + r),
                           None)

    def steps(self, session: DraftSession) -> list[StepRequest]:
        """This step's requests, as an adapter hands them to the session."""
        session.begin({str(r) for r in self.ctx})
        out = []
        for r, c in self.ctx.items():
            start = session.needed_from(str(r), len(c))
            out.append(StepRequest(str(r), len(c), torch.tensor(c[start:]), self.sampled[r], K,
                                   RequestParams(1.0, 0, 1.0, 100 + r)))
        return out

    @torch.no_grad()
    def logits(self, proposal: Proposal) -> torch.Tensor:
        rows = [self.model(torch.tensor([c + proposal.tokens[i].tolist()])).logits[0, -K - 1:]
                for i, c in enumerate(self.ctx.values())]
        return torch.stack(rows)  # [B, K+1, V]

    def round(self, session: DraftSession,
              deadline_s: float) -> tuple[list, Verdict, torch.Tensor]:
        session.deadline_s = deadline_s
        drafts = session.step(self.steps(session))
        prop = to_proposal(drafts, K, V)
        logits = self.logits(prop)
        pos = torch.tensor([len(c) for c in self.ctx.values()])
        verdict = verify(logits, prop, self.params, pos, on_missing="drop")
        for i, r in enumerate(self.ctx):
            emitted = verdict.tokens[i, : int(verdict.num_emitted[i])].tolist()
            self.ctx[r] = self.ctx[r] + emitted
            self.sampled[r] = len(emitted)
        return drafts, verdict, logits


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_key_file(tmp_path_factory.mktemp("key") / "wire.key")


@pytest.fixture(scope="module")
def live(tiny_pair: TinyPair, key_file: Path) -> Iterator[dict]:
    d = start_drafter(tiny_pair.draft, key_file)
    client = DraftClient("127.0.0.1", d.port, key_file.read_bytes().strip(), vocab_size=V,
                         tokenizer_fingerprint=fingerprint(tiny_pair.target),
                         connect_timeout_s=10.0)
    state = {"drafter": d, "client": client, "session": DraftSession(client, V, 10.0),
             "target": Target(tiny_pair, 3)}
    yield state
    client.close()
    for proc in (state["drafter"].proc, d.proc):
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_unauthenticated_client_is_refused(live: dict, tiny_pair: TinyPair) -> None:
    wrong = DraftClient("127.0.0.1", live["drafter"].port, b"not-the-key-" * 3, vocab_size=V,
                        tokenizer_fingerprint=fingerprint(tiny_pair.target),
                        connect_timeout_s=10.0)
    with pytest.raises(AuthFailed):
        wrong.connect()
    assert wrong.propose([live["target"].whole(0)], 0.5) == [Missing(MissingReason.DISCONNECTED)]


def test_live_rounds_are_verified_and_counted(live: dict) -> None:
    client, session, target = live["client"], live["session"], live["target"]
    hello = client.connect()
    assert hello.vocab_size == V and hello.max_depth >= K
    accepted = 0
    for _ in range(6):
        drafts, verdict, _ = target.round(session, deadline_s=10.0)
        assert all(d is not None for d in drafts), session.counters
        assert not bool(verdict.dropped.any())
        accepted += int(verdict.num_accepted.sum())
    assert accepted > 0  # 18 request-rounds at ~1.5 accepted each: 0 would mean garbage q
    with urllib.request.urlopen(f"http://{live['drafter'].metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "specpair_drafter_rounds_total 6" in text
    assert 'specpair_drafter_requests_total{status="ok"} 18' in text
    assert "specpair_drafter_drafted_tokens_total 54" in text


def _gauge(metrics: str, name: str) -> float:
    """The value of the drafter's unlabelled metric ``name``, read from its /metrics."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith(f"{name} ")))


def _live_requests(metrics: str) -> float:
    return _gauge(metrics, "specpair_drafter_live_requests")


def test_the_loaded_heap_is_frozen_out_of_garbage_collection(live: dict) -> None:
    """Once its model is loaded the drafter freezes what the collector tracks (torch,
    transformers, the model: never garbage), so that a full collection does not scan it
    (with the trained pair 377,000 objects, 180 ms a collection on a 2-core box, stalling
    the rounds in flight). Without ``freeze_heap`` the gauge reads 0."""
    frozen = _gauge(live["drafter"].metrics, "specpair_drafter_gc_frozen_objects")
    assert frozen > 50_000  # torch and transformers imported: about 206,000 objects


def test_every_thread_runs_on_the_cpus_given(live: dict) -> None:
    """``--cpus``: the drafter's affinity is set before any thread starts, so every thread
    of the process (torch's, the wire and metrics servers') runs only on the CPU given."""
    tasks = Path(f"/proc/{live['drafter'].proc.pid}/task")
    allowed = {t.name: os.sched_getaffinity(int(t.name)) for t in tasks.iterdir()}
    assert len(allowed) > 1 and all(a == {PINNED} for a in allowed.values()), allowed


def test_healthz_and_idle_requests_are_released(live: dict) -> None:
    """/healthz answers on the metrics port without touching the wire; the requests of
    the last round are freed once idle (the target releases them only at its next step)."""
    d = live["drafter"]
    with urllib.request.urlopen(f"http://{d.metrics}/healthz", timeout=10) as r:
        body = json.loads(r.read())
    assert r.status == 200 and body["status"] == "ready"
    assert body["listen"] == f"127.0.0.1:{d.port}" and body["mode"] == "sampled"
    live["target"].round(live["session"], deadline_s=10.0)
    assert _live_requests(d.metrics) == 3
    deadline = time.monotonic() + IDLE_RELEASE_S + 20
    while _live_requests(d.metrics) != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _live_requests(d.metrics) == 0
    # The wrong-key client of the first test is logged; the health checks are not.
    assert sum("refused a connection at the handshake" in line for line in d.stderr) == 1


def test_kill_mid_round_restart_resync_and_sigterm(live: dict, tiny_pair: TinyPair,
                                                   key_file: Path) -> None:
    session, target, d = live["session"], live["target"], live["drafter"]
    # Freeze the drafter, send a round, kill it while that round is pending.
    os.kill(d.proc.pid, signal.SIGSTOP)
    killer = threading.Timer(0.3, os.kill, (d.proc.pid, signal.SIGKILL))
    killer.start()
    t0 = time.monotonic()
    drafts, verdict, logits = target.round(session, deadline_s=3.0)
    elapsed = time.monotonic() - t0
    killer.join()
    assert d.proc.wait(10) == -signal.SIGKILL
    assert drafts == [None] * 3 and elapsed < 3.0 + 1.0, (drafts, elapsed)
    # No wrong tokens: a dropped round is the target's own draw at position 1 (RECOVER).
    pos = torch.tensor([len(c) - 1 for c in target.ctx.values()])
    p1 = torch.exp(process_logits(logits[:, 0], target.params).double())
    expect = sample_from_weights(p1, uniform(target.params.seed, pos, Stream.RECOVER))
    assert bool(verdict.dropped.all()) and verdict.num_accepted.tolist() == [0, 0, 0]
    assert verdict.tokens[:, 0].tolist() == expect.tolist()
    assert bool((verdict.tokens[:, 1:] == -1).all())

    # Restart on the same port. A drafter without the history answers RESYNC; the
    # whole history makes it OK (raw wire frames, so the partial item really is sent).
    d2 = start_drafter(tiny_pair.draft, key_file, port=d.port)
    live["drafter"] = d2
    key = key_file.read_bytes().strip()
    conn = Connection.open("127.0.0.1", d2.port, key, time.monotonic() + 10,
                           check_hello=lambda hello: None)
    ctx = target.ctx[0]
    params = RequestParams(1.0, 0, 1.0, 100)
    partial = ProposeItem(0, torch.tensor(ctx[-1:]), 0, len(ctx), K, params, None)
    whole = ProposeItem(0, torch.tensor(ctx), 0, len(ctx), K, params, None)
    statuses = []
    for rnd, item in enumerate((partial, whole), start=1):
        conn.send(encode(Propose(rnd, (item,))), time.monotonic() + 10)
        statuses.append(conn.read(time.monotonic() + 10).items[0].status)
    conn.close()
    assert statuses == [ItemStatus.RESYNC, ItemStatus.OK]

    # The client reconnects (after its backoff) and the session resends whole histories.
    for _ in range(40):
        drafts, verdict, _ = target.round(session, deadline_s=10.0)
        if all(x is not None for x in drafts):
            break
        time.sleep(0.1)
    assert all(x is not None for x in drafts), session.counters
    assert session.counters.missing_by_reason["disconnected"] >= 3

    # SIGTERM: the drafter closes its connections and exits 0.
    d2.proc.send_signal(signal.SIGTERM)
    assert d2.proc.wait(30) == 0
    assert any("stopped" in line for line in d2.stderr)
    t0 = time.monotonic()
    session.deadline_s = 1.0
    assert session.step(target.steps(session)) == [None] * 3
    assert time.monotonic() - t0 < 1.5
