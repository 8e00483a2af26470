"""The drafter's metrics, served as Prometheus text (exposition format 0.0.4), and its health.

Counters: rounds, requests by status, drafted tokens, history disagreements,
drafting failures (bugs: the request was answered REFUSED), requests evicted over
``--max-requests``, target connections authenticated and connections closed idle or
stalled; a gauge of live
requests and of the objects frozen out of the garbage collector's scans at start
(``specpair.drafter.engine.freeze_heap``); a histogram of the time to answer one PROPOSE.
``serve_metrics`` exposes them on ``GET /metrics`` with a plain http.server,
and ``GET /healthz``: 200 and a small JSON object once the draft model is
loaded and the wire server listens, 503 before (and while stopping). Health
checks use it instead of a TCP connect to the wire port, which the wire server
would count and log as a refused handshake.
"""

from __future__ import annotations

import bisect
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specpair.wire.frames import ItemStatus

__all__ = ["Metrics", "Readiness", "serve_metrics", "LATENCY_BUCKETS"]

# Upper bounds (seconds) of the round-latency histogram buckets; +Inf is implicit.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Metrics:
    """Thread-safe counters of one drafter process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rounds = 0  # handler calls answered: PROPOSE rounds, or chunks of a large one
        self.requests = {s: 0 for s in ItemStatus}  # request-rounds by answer status
        self.drafted = 0  # draft tokens sent
        self.disagreements = 0  # rounds whose committed tokens contradicted our drafts
        self.live = 0  # requests with state held
        self.draft_failures = 0  # requests whose drafting raised (answered REFUSED; a bug)
        self.evicted = 0  # requests evicted least recently used over the live-request bound
        self.stalled = 0  # connections closed idle or mid-frame past their timeout
        self.connections = 0  # target connections that passed the handshake
        self.frozen = 0  # objects frozen out of the garbage collector's scans at start
        self._buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # last one is +Inf
        self._sum = 0.0  # total seconds observed

    def observe_round(self, seconds: float, statuses: list[ItemStatus], drafted: int,
                      disagreements: int, live: int) -> None:
        with self._lock:
            self.rounds += 1
            for s in statuses:
                self.requests[s] += 1
            self.drafted += drafted
            self.disagreements += disagreements
            self.live = live
            self._buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self._sum += seconds

    def count_draft_failure(self) -> None:
        with self._lock:
            self.draft_failures += 1

    def count_evicted(self, n: int) -> None:
        with self._lock:
            self.evicted += n

    def count_stalled(self) -> None:
        with self._lock:
            self.stalled += 1

    def count_connection(self) -> None:
        with self._lock:
            self.connections += 1

    def set_frozen(self, objects: int) -> None:
        with self._lock:
            self.frozen = objects

    def set_live(self, live: int) -> None:
        with self._lock:
            self.live = live

    def render(self) -> str:
        """The metrics in Prometheus text format."""
        p = "specpair_drafter_"
        with self._lock:
            lines = [
                f"# HELP {p}rounds_total PROPOSE rounds answered (a round split into chunks "
                "counts once per chunk).",
                f"# TYPE {p}rounds_total counter",
                f"{p}rounds_total {self.rounds}",
                f"# HELP {p}requests_total Request-rounds answered, by status.",
                f"# TYPE {p}requests_total counter",
                *(f'{p}requests_total{{status="{s.name.lower()}"}} {n}'
                  for s, n in self.requests.items()),
                f"# HELP {p}drafted_tokens_total Draft tokens sent.",
                f"# TYPE {p}drafted_tokens_total counter",
                f"{p}drafted_tokens_total {self.drafted}",
                f"# HELP {p}history_disagreements_total Rounds whose committed tokens "
                "contradicted the drafts the target said it accepted (state rebuilt).",
                f"# TYPE {p}history_disagreements_total counter",
                f"{p}history_disagreements_total {self.disagreements}",
                f"# HELP {p}draft_failures_total Requests whose drafting raised (a bug, "
                "logged with its traceback); each was answered REFUSED.",
                f"# TYPE {p}draft_failures_total counter",
                f"{p}draft_failures_total {self.draft_failures}",
                f"# HELP {p}evicted_requests_total Requests evicted least recently used "
                "over the live-request bounds (answered RESYNC when asked for again).",
                f"# TYPE {p}evicted_requests_total counter",
                f"{p}evicted_requests_total {self.evicted}",
                f"# HELP {p}stalled_connections_total Connections closed idle or stalled "
                "mid-frame past their timeout.",
                f"# TYPE {p}stalled_connections_total counter",
                f"{p}stalled_connections_total {self.stalled}",
                f"# HELP {p}connections_total Target connections that passed the handshake "
                "(a target opens one per engine, from its first tensor-parallel rank).",
                f"# TYPE {p}connections_total counter",
                f"{p}connections_total {self.connections}",
                f"# HELP {p}live_requests Requests whose state the drafter holds.",
                f"# TYPE {p}live_requests gauge",
                f"{p}live_requests {self.live}",
                f"# HELP {p}gc_frozen_objects Objects frozen out of the garbage collector's "
                "scans once the model was loaded (0: every collection scans them).",
                f"# TYPE {p}gc_frozen_objects gauge",
                f"{p}gc_frozen_objects {self.frozen}",
                f"# HELP {p}round_seconds Time to answer one PROPOSE.",
                f"# TYPE {p}round_seconds histogram",
            ]
            total = 0
            for le, n in zip((*LATENCY_BUCKETS, "+Inf"), self._buckets, strict=True):
                total += n
                lines.append(f'{p}round_seconds_bucket{{le="{le}"}} {total}')
            lines += [f"{p}round_seconds_sum {self._sum!r}", f"{p}round_seconds_count {total}"]
        return "\n".join(lines) + "\n"


class Readiness:
    """Whether the drafter can serve: its engine is loaded and its wire server listens."""

    def __init__(self, metrics: Metrics) -> None:
        self._lock = threading.Lock()
        self._metrics = metrics  # for the live-request count in the answer
        self.mode: str | None = None  # drafting mode once the engine is loaded, else None
        self.listen: str | None = None  # HOST:PORT while the wire server listens, else None

    def engine_loaded(self, mode: str) -> None:
        with self._lock:
            self.mode = mode

    def listening(self, address: str | None) -> None:
        """The wire server listens on ``address`` (None: it stopped)."""
        with self._lock:
            self.listen = address

    def answer(self) -> tuple[int, dict]:
        """(HTTP status, JSON body) of ``GET /healthz``."""
        with self._lock:
            ready = self.mode is not None and self.listen is not None
            body = {"status": "ready" if ready else "not ready",
                    "engine_loaded": self.mode is not None, "mode": self.mode,
                    "listen": self.listen, "live_requests": self._metrics.live}
        return (200 if ready else 503), body


def serve_metrics(metrics: Metrics, host: str, port: int,
                  readiness: Readiness | None = None) -> ThreadingHTTPServer:
    """Serve ``GET /metrics`` (and ``GET /healthz`` when ``readiness`` is given) on host:port
    from a daemon thread; call ``shutdown()`` to stop."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path == "/metrics":
                code, body = 200, metrics.render().encode()
                ctype = "text/plain; version=0.0.4; charset=utf-8"
            elif path == "/healthz" and readiness is not None:
                code, answer = readiness.answer()
                body, ctype = (json.dumps(answer) + "\n").encode(), "application/json"
            else:
                self.send_error(404, "only /metrics and /healthz are served")
                return
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # one line per scrape or health check would drown the drafter's log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
