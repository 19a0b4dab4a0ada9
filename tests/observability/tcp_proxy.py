"""A TCP proxy on loopback that a test can cut and restore: a store outage on demand."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to `target`. `cut()` drops every connection and refuses
    new ones (connection refused, as a stopped database); `restore()` accepts again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.listener: socket.socket | None = None

    def start(self) -> CuttableProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    restore = start

    def cut(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            doomed, self.sockets = self.sockets, set()
        if listener is not None:
            listener.close()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    stop = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                if self.listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self.sockets |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
