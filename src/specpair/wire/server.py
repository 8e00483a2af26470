"""The drafter side of the wire: an asyncio TCP server around a synchronous handler.

    handler = MyDrafter(...)          # .handle(Propose) -> ProposalFrame, .release(ids)
    serve(handler, hello, host="127.0.0.1", port=7000, key=load_key("wire.key"))

Per connection: CHALLENGE, then a valid AUTH within ``handshake_timeout_s`` (else
ERROR AUTH_FAILED and the close), AUTH_OK + HELLO, then PROPOSE / RELEASE frames.
Frames go through a bounded queue (``queue_depth``; a full queue stops reading,
so TCP pushes back on the target) to one worker thread shared by all connections:
the handler never runs concurrently with itself. Each PROPOSE gets exactly one
PROPOSAL.

Fairness: a round is handed to the worker thread in chunks of at most
``chunk_items`` items and ``chunk_tokens`` new tokens, one chunk at a time, and the
worker serves the connections that wait for it in turn (FIFO over chunks); the chunks,
pieces and each connection's request ids are ``specpair.wire.rounds``'s.

Bounds: at most ``max_requests_per_connection`` requests are held per connection
(past it the least recently asked for are released: RESYNC when asked again); a
connection that sends nothing for ``idle_timeout_s`` after authentication is closed,
and so is one whose frame, once its header arrived, is not complete within
``frame_timeout_s`` (ERROR MALFORMED). ``limits.frame_bytes`` bounds a frame.

If the handler raises, or answers with a frame that does not encode or does not
match the round, every item of that chunk is answered RESYNC (the target resends
those histories whole). A malformed frame, a kind out of its place (never decoded)
or a frame the decoder fails on (ERROR INTERNAL) gets ERROR and the close of that
connection only. When a connection ends, the requests it carried are released.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specpair.proposal import QKind
from specpair.wire import auth
from specpair.wire.codec import decode, encode
from specpair.wire.codec.header import HEADER, LIMITS, Kind, Limits, parse_header
from specpair.wire.errors import AuthFailed, ErrorCode, InternalError, UnexpectedFrame, WireError
from specpair.wire.frames import (
    AuthOk,
    Challenge,
    DraftItem,
    ErrorFrame,
    Hello,
    ItemStatus,
    ProposalFrame,
    Propose,
    Release,
)
from specpair.wire.rounds import RequestIds, chunks, draft_round, one_chunk, pieces, to_target

# chunks and pieces: the splitting the server applies (specpair.wire.rounds), as it exposed them
__all__ = ["Handler", "ServerStats", "WireServer", "serve", "ServerThread", "chunks", "pieces"]

log = logging.getLogger("specpair.wire.server")


class Handler(Protocol):
    """What the drafter supplies. Called from one worker thread, never concurrently. The
    request ids it sees are the server's, unique over connections (two targets both number
    their requests from 1); the answers go back under each target's own ids."""

    def handle(self, propose: Propose) -> ProposalFrame: ...

    def release(self, request_ids: tuple[int, ...]) -> None: ...


@dataclass
class ServerStats:
    """Counters since start (read them from any thread; approximate while running)."""

    connections: int = 0  # connections accepted
    authenticated: int = 0  # connections that passed the challenge
    auth_failures: int = 0  # connections refused at the handshake
    rounds: int = 0  # PROPOSE frames answered
    handler_failures: int = 0  # rounds answered RESYNC because the handler failed
    malformed: int = 0  # connections closed on a malformed or unexpected frame
    idle_closed: int = 0  # connections closed: nothing sent for idle_timeout_s
    stalled: int = 0  # connections closed: a frame incomplete frame_timeout_s after its header
    evicted: int = 0  # requests released over max_requests_per_connection
    errors: dict[str, int] = field(default_factory=dict)  # failures by exception class


class _Idle(Exception):
    """No frame started within the idle timeout (a quiet close, not a refusal)."""


class _Stalled(Exception):
    """A frame started but did not complete within the frame timeout."""


class _Throttle:
    """Logs at most one WARNING per ``every_s`` seconds; the next names how many it held back."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last = float("-inf")  # time.monotonic() of the last line logged
        self._held = 0  # lines held back since then

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._held += 1
            return
        if self._held:
            msg += f" ({self._held} more since the previous such line)"
        self._last, self._held = now, 0
        log.warning(msg, *args)


def _resync(propose: Propose) -> ProposalFrame:
    empty = torch.zeros(0, dtype=torch.int64)
    return ProposalFrame(propose.round_id, tuple(
        DraftItem(it.request_id, ItemStatus.RESYNC, empty, QKind.SPARSE, None, None)
        for it in propose.items))


class WireServer:
    """Serves one handler to any number of authenticated targets."""

    def __init__(self, handler: Handler, hello: Hello, key: bytes, host: str = "127.0.0.1",
                 port: int = 0, *, limits: Limits = LIMITS, queue_depth: int = 8,
                 handshake_timeout_s: float = 5.0, idle_timeout_s: float = 300.0,
                 frame_timeout_s: float = 60.0, max_requests_per_connection: int = 2048,
                 chunk_items: int = 64, chunk_tokens: int = 512,
                 on_stalled: Callable[[], None] | None = None,
                 on_authenticated: Callable[[], None] | None = None) -> None:
        self.handler = handler
        self.hello = hello
        self.key = auth.check_key(key)
        self.host, self.port = host, port
        self.limits = limits
        self.queue_depth = queue_depth
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s  # no frame started for this long: close
        self.frame_timeout_s = frame_timeout_s  # a started frame incomplete this long: close
        self.max_requests_per_connection = max_requests_per_connection  # LRU past it
        self.chunk_items, self.chunk_tokens = chunk_items, chunk_tokens  # one handler call
        self._on_stalled = on_stalled  # called once per connection closed idle or stalled
        self._on_authenticated = on_authenticated  # called once per connection authenticated
        self._ids = itertools.count(1)  # the handler's request ids, unique over connections
        self.stats = ServerStats()
        self._refusals = _Throttle(60.0)  # handshake refusals: one log line a minute at most
        self._hello_bytes = encode(hello, limits)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wire-handler")
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False

    async def start(self) -> int:
        """Bind and listen; returns the bound port (useful with port=0)."""
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("wire server listening on %s:%d", self.host, self.port)
        return self.port

    async def close(self) -> None:
        """Stop accepting, tell connected targets, close them, stop the worker."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        bye = encode(ErrorFrame(ErrorCode.SHUTTING_DOWN, "drafter shutting down"), self.limits)
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.write(bye)
                w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _count(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1

    async def _read(self, reader: asyncio.StreamReader, *, authenticated: bool,
                    expect: tuple[Kind, ...]):
        """The next frame, one of the kinds ``expect``: any other kind is refused by its
        header (its body is read, so the close is clean, but never decoded). Every failure
        is a WireError: a decoder that fails otherwise (a bug) is logged with its
        traceback and raised as InternalError."""
        if authenticated:  # before it the whole handshake has its own deadline
            # asyncio.timeout, not wait_for: no task per read (a round's latency; 3.11)
            try:
                async with asyncio.timeout(self.idle_timeout_s):
                    head = await reader.readexactly(1)
            except TimeoutError:
                raise _Idle() from None
            try:
                async with asyncio.timeout(self.frame_timeout_s):
                    head += await reader.readexactly(HEADER.size - 1)
                    h = parse_header(head, self.limits, authenticated=authenticated)
                    body = await reader.readexactly(h.body_len)
            except TimeoutError:
                raise _Stalled(f"a frame was not complete {self.frame_timeout_s:g} s after it "
                               "started") from None
        else:
            head = await reader.readexactly(HEADER.size)
            h = parse_header(head, self.limits, authenticated=authenticated)  # before the body
            body = await reader.readexactly(h.body_len)
        if h.kind not in expect:
            raise UnexpectedFrame(f"expected {' or '.join(k.name for k in expect)}, "
                                  f"got {h.kind.name}")
        try:
            return decode(head + body, self.hello, self.limits, authenticated=authenticated)
        except WireError:
            raise
        except Exception as exc:
            log.exception("the decoder failed on a %s frame", h.kind.name)
            raise InternalError(f"the drafter failed to decode the {h.kind.name} frame "
                                f"({type(exc).__name__})") from exc

    async def _handshake(self, reader, writer) -> None:
        nonce = auth.new_nonce()
        writer.write(encode(Challenge(nonce), self.limits))
        await writer.drain()
        frame = await self._read(reader, authenticated=False, expect=(Kind.AUTH,))
        if not auth.macs_equal(auth.target_mac(self.key, nonce, frame.nonce), frame.mac):
            raise AuthFailed("AUTH carries a wrong MAC (the target lacks the key)")
        mac = auth.drafter_mac(self.key, nonce, frame.nonce)
        writer.write(encode(AuthOk(mac), self.limits) + self._hello_bytes)
        await writer.drain()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        self._writers.add(writer)
        seen = RequestIds(self._ids)  # the connection's requests
        worker = None
        try:
            try:
                await asyncio.wait_for(self._handshake(reader, writer), self.handshake_timeout_s)
            except (WireError, TimeoutError, asyncio.IncompleteReadError, OSError) as exc:
                self.stats.auth_failures += 1
                self._count(exc)
                if (isinstance(exc, asyncio.IncompleteReadError) and not exc.partial) or \
                        isinstance(exc, ConnectionResetError | BrokenPipeError):
                    log.debug("a connection closed before its AUTH (a port probe?): %s", exc)
                else:  # a real peer: logged, at most once a minute (all are counted)
                    self._refusals.warning("refused a connection at the handshake: %s", exc)
                msg = str(exc) or "no valid AUTH within the handshake deadline"
                with contextlib.suppress(Exception):
                    writer.write(encode(ErrorFrame(ErrorCode.AUTH_FAILED, msg[:512])))
                return
            self.stats.authenticated += 1
            if self._on_authenticated is not None:
                self._on_authenticated()
            queue: asyncio.Queue = asyncio.Queue(maxsize=self.queue_depth)
            worker = asyncio.create_task(self._work(queue, writer, seen))
            await self._read_loop(reader, writer, queue)
        finally:
            if worker is not None:
                worker.cancel()
                with contextlib.suppress(BaseException):
                    await worker
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()
            if seen and not self._closing:
                # A shutdown may cancel this RELEASE while it waits for the handler thread:
                # then the connection ends quietly (Python 3.11's stream callback would log a
                # cancelled handler task as an error).
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.get_running_loop().run_in_executor(
                        self._executor, self.handler.release, seen.handler_ids())

    async def _read_loop(self, reader, writer, queue: asyncio.Queue) -> None:
        while True:
            try:
                frame = await self._read(reader, authenticated=True,
                                         expect=(Kind.PROPOSE, Kind.RELEASE))
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the target went away
            except _Idle:
                self.stats.idle_closed += 1
                if self._on_stalled is not None:
                    self._on_stalled()
                log.info("closing a connection idle for %g s", self.idle_timeout_s)
                return
            except _Stalled as exc:
                self.stats.stalled += 1
                if self._on_stalled is not None:
                    self._on_stalled()
                log.warning("closing a stalled connection: %s", exc)
                with contextlib.suppress(Exception):
                    writer.write(encode(ErrorFrame(ErrorCode.MALFORMED, str(exc)), self.limits))
                    await writer.drain()
                return
            except WireError as exc:
                self.stats.malformed += 1
                self._count(exc)
                log.warning("closing a connection on a bad frame: %s", exc)
                with contextlib.suppress(Exception):
                    await queue.join()
                    writer.write(encode(ErrorFrame(exc.code, str(exc)[:1024]), self.limits))
                    await writer.drain()
                return
            await queue.put(frame)

    async def _work(self, queue: asyncio.Queue, writer, seen: RequestIds) -> None:
        """Serve one connection's frames in order. Request ids are the target's own (each
        target numbers its requests from 1): the handler sees ids unique over connections."""
        loop = asyncio.get_running_loop()

        async def call(part: Propose) -> tuple[DraftItem, ...]:
            got = await loop.run_in_executor(self._executor, self._answer, seen.to_handler(part))
            return to_target(got, part)

        while True:
            frame = await queue.get()
            try:
                # Ids leave ``seen`` only once the handler released them: a close that cancels
                # this task mid-release then releases them again (releasing is idempotent).
                if isinstance(frame, Release):
                    mine = seen.known(frame.request_ids)
                    if mine:
                        await loop.run_in_executor(self._executor, self._release,
                                                   seen.handler_ids(mine))
                    seen.forget(mine)
                    continue
                old = seen.admit(frame.items, self.max_requests_per_connection)
                if old:  # the least recently asked for, never one of this round
                    self.stats.evicted += len(old)
                    await loop.run_in_executor(self._executor, self._release,
                                               seen.handler_ids(old))
                    seen.forget(old)
                if one_chunk(frame, self.chunk_items, self.chunk_tokens):  # one worker hop
                    data = await loop.run_in_executor(self._executor, self._answer_encoded,
                                                      frame, seen.to_handler(frame))
                else:
                    answers = await draft_round(frame, self.chunk_items, self.chunk_tokens, call)
                    data = await loop.run_in_executor(self._executor, self._encode,
                                                      frame.round_id, answers)
                writer.write(data)
                await writer.drain()
                self.stats.rounds += 1
            finally:
                queue.task_done()

    def _answer_encoded(self, frame: Propose, inner: Propose) -> bytes:
        """Runs in the worker thread: a one-chunk round's PROPOSAL (``inner`` is ``frame``
        under the handler's request ids)."""
        return self._encode(frame.round_id, [(frame, to_target(self._answer(inner), frame))])

    def _release(self, request_ids: tuple[int, ...]) -> None:
        try:
            self.handler.release(request_ids)
        except Exception:
            log.exception("handler.release failed")

    def _answer(self, propose: Propose) -> tuple[DraftItem, ...]:
        """Runs in the worker thread: the handler's answer to one chunk; RESYNC for the
        chunk's items if it fails."""
        try:
            reply = self.handler.handle(propose)
            if not isinstance(reply, ProposalFrame) or reply.round_id != propose.round_id or \
                    [d.request_id for d in reply.items] != [i.request_id for i in propose.items]:
                raise TypeError("handle() must return the ProposalFrame of the same round, "
                                "its items in the round's order")
            return reply.items
        except Exception as exc:
            self._failed(exc, propose.round_id)
            return _resync(propose).items

    def _encode(self, round_id: int, answers: list[tuple[Propose, tuple[DraftItem, ...]]]) -> bytes:
        """Runs in the worker thread: the round's PROPOSAL; a chunk whose answer does not
        encode is answered RESYNC, the others as drafted."""
        items = tuple(d for _, got in answers for d in got)
        try:
            return encode(ProposalFrame(round_id, items), self.limits)
        except Exception:
            pass
        checked: list[DraftItem] = []
        for part, got in answers:
            try:
                encode(ProposalFrame(round_id, got), self.limits)
                checked += got
            except Exception as exc:
                self._failed(exc, round_id)
                checked += _resync(part).items
        try:
            return encode(ProposalFrame(round_id, tuple(checked)), self.limits)
        except Exception as exc:  # each chunk encodes, the whole does not (e.g. frame size)
            self._failed(exc, round_id)
            everything = Propose(round_id, tuple(i for part, _ in answers for i in part.items))
            return encode(_resync(everything), self.limits)

    def _failed(self, exc: Exception, round_id: int) -> None:
        self.stats.handler_failures += 1
        self._count(exc)
        log.error("handler failed on round %d; answering its chunk RESYNC", round_id,
                  exc_info=exc)


def serve(handler: Handler, hello: Hello, host: str = "127.0.0.1", port: int = 0, *,
          key: bytes, ready: Callable[[int], None] | None = None, **options) -> None:
    """Serve until SIGTERM or SIGINT, then close cleanly. ``ready(port)`` runs once bound.
    ``options`` go to ``WireServer`` (limits, queue_depth, timeouts, bounds, chunking)."""

    async def main() -> None:
        server = WireServer(handler, hello, key, host, port, **options)
        bound = await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready(bound)
        try:
            await stop.wait()
        finally:
            await server.close()

    asyncio.run(main())


class ServerThread:
    """A WireServer on its own event loop in a daemon thread (tests, bench, self-test).

    with ServerThread(handler, hello, key) as srv:
        client = DraftClient("127.0.0.1", srv.port, key, ...)
    """

    def __init__(self, handler: Handler, hello: Hello, key: bytes, host: str = "127.0.0.1",
                 port: int = 0, **options) -> None:
        self.server = WireServer(handler, hello, key, host, port, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="wire-server")

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
