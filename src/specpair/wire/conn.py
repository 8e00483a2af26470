"""The target's side of one connection: blocking socket, deadlines, handshake.

Every call takes an absolute ``deadline`` (``time.monotonic()`` seconds) and never
blocks past it. Bytes of a frame that arrives after a deadline stay buffered, so
the next read resumes mid-frame instead of desynchronising the stream.
"""

from __future__ import annotations

import contextlib
import socket
import time

from specpair.wire import auth
from specpair.wire.codec import Frame, decode, encode
from specpair.wire.codec.header import HEADER, LIMITS, VERSION, Limits, parse_header
from specpair.wire.errors import (
    AuthFailed,
    ConnectionLost,
    DeadlineExceeded,
    HelloMismatch,
    PeerError,
    UnexpectedFrame,
)
from specpair.wire.frames import Auth, AuthOk, Challenge, ErrorFrame, Hello

__all__ = ["Connection"]

_RECV = 1 << 20


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded("deadline passed")
    return left


class Connection:
    """An authenticated connection to a drafter; ``hello`` is its checked HELLO."""

    def __init__(self, sock: socket.socket, hello: Hello, limits: Limits) -> None:
        self.sock = sock
        self.hello = hello
        self.limits = limits
        self._buf = bytearray()

    @classmethod
    def open(cls, host: str, port: int, key: bytes, deadline: float, *,
             check_hello, limits: Limits = LIMITS) -> Connection:
        """Connect, answer the challenge, check the drafter's proof and its HELLO.
        ``check_hello(hello)`` raises ``HelloMismatch`` for a drafter this target refuses."""
        try:
            sock = socket.create_connection((host, port), timeout=_remaining(deadline))
        except TimeoutError:
            raise DeadlineExceeded(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(sock, None, limits)  # type: ignore[arg-type]  # hello comes below
        try:
            challenge = conn.read(deadline, authenticated=False)
            if not isinstance(challenge, Challenge):
                raise UnexpectedFrame(f"expected CHALLENGE, got {type(challenge).__name__}")
            mine = auth.new_nonce()
            conn.send(encode(Auth(mine, auth.target_mac(key, challenge.nonce, mine))), deadline)
            ok = conn.read(deadline, authenticated=False)
            if not isinstance(ok, AuthOk):
                raise UnexpectedFrame(f"expected AUTH_OK, got {type(ok).__name__}")
            if not auth.macs_equal(auth.drafter_mac(key, challenge.nonce, mine), ok.mac):
                raise AuthFailed("the drafter's AUTH_OK proof is wrong: it lacks the key")
            hello = conn.read(deadline)
            if not isinstance(hello, Hello):
                raise UnexpectedFrame(f"expected HELLO, got {type(hello).__name__}")
            if hello.version != VERSION:
                raise HelloMismatch(f"drafter speaks wire version {hello.version}, "
                                    f"this target {VERSION}")
            check_hello(hello)
        except BaseException:
            conn.close()
            raise
        conn.hello = hello
        return conn

    def send(self, data: bytes, deadline: float) -> None:
        """Send all of ``data``; a deadline hit mid-frame leaves the stream unusable."""
        try:
            self.sock.settimeout(_remaining(deadline))
            self.sock.sendall(data)
        except TimeoutError:
            raise DeadlineExceeded("send timed out (connection unusable)") from None
        except OSError as exc:
            raise ConnectionLost(f"send failed: {exc}") from None

    def read(self, deadline: float, *, authenticated: bool = True) -> Frame:
        """The next frame. An ERROR frame raises ``PeerError`` (AuthFailed for AUTH_FAILED)."""
        while True:
            if len(self._buf) >= HEADER.size:
                h = parse_header(self._buf, self.limits, authenticated=authenticated)
                need = HEADER.size + h.body_len
                if len(self._buf) >= need:
                    data = bytes(self._buf[:need])
                    del self._buf[:need]
                    frame = decode(data, self.hello, self.limits, authenticated=authenticated)
                    if isinstance(frame, ErrorFrame):
                        cls = AuthFailed if frame.code == AuthFailed.code else PeerError
                        raise cls(f"drafter sent ERROR {frame.code}: {frame.message}")
                    return frame
            try:
                self.sock.settimeout(_remaining(deadline))
                chunk = self.sock.recv(_RECV)
            except TimeoutError:
                raise DeadlineExceeded("read timed out") from None
            except OSError as exc:
                raise ConnectionLost(f"read failed: {exc}") from None
            if not chunk:
                raise ConnectionLost("the drafter closed the connection")
            self._buf += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
