"""A TCP relay on 127.0.0.1 that a test can cut and restore: a network partition between workers and a server.

Workers are given the relay's address (DATABASE_URL through it) instead of the server's; `cut()` drops every
relayed connection and refuses new ones, `restore()` lets them through again; `delay` holds back what the
server sends by that many seconds (a slow server or link). The server itself never stops.
"""

from __future__ import annotations

import socket
import threading
import time


class TcpRelay:
    """Forward 127.0.0.1:<port> to `target`, until cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-relay", daemon=True)
        self.delay = 0.0  # seconds each chunk from the server waits before it is passed on

    @property
    def port(self) -> int:
        """Return the port the relay listens on."""
        return int(self._listener.getsockname()[1])

    def start(self) -> TcpRelay:
        """Start relaying in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop relaying and close everything."""
        self._stop.set()
        self._drop_all()
        self._listener.close()

    def cut(self) -> None:
        """Drop every relayed connection and refuse new ones (they are closed as soon as accepted)."""
        self._cut.set()
        self._drop_all()

    def restore(self) -> None:
        """Relay new connections again."""
        self._cut.clear()

    def _drop_all(self) -> None:
        with self._lock:
            sockets = list(self._open)
            self._open.clear()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for src, dst, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pipe, args=(src, dst, answers), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answers and self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
