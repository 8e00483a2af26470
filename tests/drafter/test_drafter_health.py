"""The drafter's /healthz (real HTTP on 127.0.0.1) and the release of idle requests."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import torch

from specpair.drafter.engine import DrafterEngine
from specpair.drafter.metrics import Metrics, Readiness, serve_metrics
from specpair.drafter.model import HFDraftModel
from specpair.models.tiny import TinyPair
from specpair.wire.frames import ItemStatus, Propose, ProposeItem, RequestParams


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_healthz_is_503_until_the_engine_is_loaded_and_the_wire_listens() -> None:
    metrics = Metrics()
    readiness = Readiness(metrics)
    http = serve_metrics(metrics, "127.0.0.1", 0, readiness)
    base = f"http://127.0.0.1:{http.server_address[1]}"
    try:
        code, body = _get(f"{base}/healthz")
        assert code == 503 and json.loads(body)["engine_loaded"] is False
        readiness.engine_loaded("sampled")
        code, body = _get(f"{base}/healthz")
        assert code == 503 and json.loads(body)["listen"] is None  # loaded, not listening
        readiness.listening("127.0.0.1:7360")
        metrics.set_live(2)
        code, body = _get(f"{base}/healthz")
        assert code == 200
        assert json.loads(body) == {"status": "ready", "engine_loaded": True,
                                    "mode": "sampled", "listen": "127.0.0.1:7360",
                                    "live_requests": 2}
        readiness.listening(None)  # stopping
        assert _get(f"{base}/healthz")[0] == 503
        assert _get(f"{base}/metrics")[0] == 200
        assert _get(f"{base}/other")[0] == 404
    finally:
        http.shutdown()


def test_idle_requests_are_released_and_the_gauge_reads_zero(tiny_pair: TinyPair) -> None:
    """The target sends RELEASE only from its next step: an idle target's last requests
    must not stay held (specpair_drafter_live_requests stuck at 1)."""
    engine = DrafterEngine(HFDraftModel(tiny_pair.draft), tokenizer_fingerprint=bytes(32),
                           wire_version=1, idle_release_s=30.0)
    p = RequestParams(1.0, 0, 1.0, 5)
    whole = [ProposeItem(r, torch.tensor([1, 5 + r, 6]), 0, 3, 3, p, None) for r in (1, 2)]
    assert [i.status for i in engine.handle(Propose(1, tuple(whole))).items] == \
        [ItemStatus.OK, ItemStatus.OK]
    assert "specpair_drafter_live_requests 2" in engine.metrics.render()
    t = time.monotonic()
    assert engine.expire(t + 10.0) == 0  # recently touched: kept
    assert engine.expire(t + 31.0) == 2
    assert engine.live_requests() == 0
    assert "specpair_drafter_live_requests 0" in engine.metrics.render()
    # A request freed too early costs one RESYNC (the target resends it whole), never a draft.
    later = ProposeItem(1, torch.tensor([7]), 0, 4, 3, p, None)
    assert engine.handle(Propose(2, (later,))).items[0].status == ItemStatus.RESYNC
    with pytest.raises(ValueError, match="idle_release_s"):
        DrafterEngine(engine.model, tokenizer_fingerprint=bytes(32), wire_version=1,
                      idle_release_s=0)
