"""A TCP relay on 127.0.0.1 between a target and its drafter that holds back some of the
drafter's answers past the round deadline: real late rounds, on the real wire, for the
tensor-parallel tests (a round late on rank 0 must be "no drafts" on every rank).

``LateProxy(drafter_port, every_s=G, delay_s=D)``: the drafter's first answer (a read after its
handshake) once at least G seconds have passed since the last one held back is delivered D
seconds late, so at most one round in G seconds is late; everything else is relayed at once.
``address`` is what the target connects to; ``delayed`` counts the reads held back.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

__all__ = ["LateProxy"]


class LateProxy:
    HANDSHAKE_READS = 4  # the drafter's first reads on a connection: never held back

    def __init__(self, drafter_port: int, every_s: float = 1.0, delay_s: float = 0.3) -> None:
        self.drafter_port, self.every_s, self.delay_s = drafter_port, every_s, delay_s
        self.delayed = 0  # drafter reads held back
        self._last = time.monotonic()  # when a read was last held back
        self._listen = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listen.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                target, _ = self._listen.accept()
            except OSError:
                return
            drafter = socket.create_connection(("127.0.0.1", self.drafter_port))
            for a, b, late in ((target, drafter, False), (drafter, target, True)):
                threading.Thread(target=self._pump, args=(a, b, late), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, late: bool) -> None:
        reads = 0
        try:
            while data := src.recv(1 << 16):
                reads += 1
                if (late and reads > self.HANDSHAKE_READS
                        and time.monotonic() - self._last >= self.every_s):
                    self.delayed += 1
                    time.sleep(self.delay_s)
                    self._last = time.monotonic()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._listen.close()
