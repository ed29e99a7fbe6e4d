"""A total deadline for one HTTP call made with requests: connect, send and the whole answer.

requests' timeouts bound each socket operation, not the call: a receiver that drips its answer a byte at a
time, each byte within the read timeout, holds a call (and the batch behind it) for as long as it likes.
`CallDeadline` is a timer that, when it fires, shuts down the sockets the call opened or reused, so the
blocked read returns at once. Connections register themselves with the call running on their thread.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType
from typing import Any

import requests
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from channels_app.providers.base import DeadlineExceeded, ProviderError, RetriableError, connection_not_made

_current = threading.local()


class CallDeadline:
    """Abort the HTTP connections used on this thread inside the `with` block once `seconds` have passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._connections: list[HTTPConnection] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._abort)
        self._timer.daemon = True

    def register(self, connection: HTTPConnection) -> None:
        """Remember a connection this call uses (aborted if the deadline passes)."""
        with self._lock:
            self._connections.append(connection)
            expired = self.expired
        if expired:
            _shutdown(connection)

    def _abort(self) -> None:
        with self._lock:
            self.expired = True
            connections = list(self._connections)
        for connection in connections:
            _shutdown(connection)

    def __enter__(self) -> CallDeadline:
        _current.call = self
        self._timer.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._timer.cancel()
        _current.call = None


def _shutdown(connection: HTTPConnection) -> None:
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class _Registering:
    """Mixin for urllib3 connections: register with the deadline of the call running on this thread."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        call = getattr(_current, "call", None)
        if call is not None:
            call.register(self)
        # A mixin: `request` is HTTPConnection's, next in the MRO of the classes below, unknown to this class.
        return super().request(*args, **kwargs)  # type: ignore[misc]


class DeadlineHTTPConnection(_Registering, HTTPConnection):
    """An HTTP connection that a CallDeadline can abort."""


class DeadlineHTTPSConnection(_Registering, HTTPSConnection):
    """An HTTPS connection that a CallDeadline can abort."""


class DeadlineHTTPConnectionPool(HTTPConnectionPool):
    """A pool of abortable HTTP connections."""

    ConnectionCls = DeadlineHTTPConnection


class DeadlineHTTPSConnectionPool(HTTPSConnectionPool):
    """A pool of abortable HTTPS connections."""

    ConnectionCls = DeadlineHTTPSConnection


POOL_CLASSES = {"http": DeadlineHTTPConnectionPool, "https": DeadlineHTTPSConnectionPool}


class DeadlinePools:
    """Mixin for a requests adapter: its connection pools hold connections a CallDeadline can abort."""

    poolmanager: Any

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Build the pool manager with abortable connection pools."""
        super().init_poolmanager(*args, **kwargs)  # type: ignore[misc]  # a mixin: the adapter's method
        self.poolmanager.pool_classes_by_scheme = dict(POOL_CLASSES)


def request_failure(exc: requests.exceptions.RequestException, call: CallDeadline) -> ProviderError | None:
    """Sort a requests transport error of a call made within `call`; None for one that is no transport error.

    A refused or timed-out connect sent nothing (another provider may take the message); a read timeout, a
    connection lost after the request was written, or the deadline cut may have been acted on (`maybe_sent`).
    """
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return RetriableError("connect timeout", code="connect_timeout")
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return RetriableError("read timeout", code="read_timeout", maybe_sent=True)
    if call.expired:
        return DeadlineExceeded(call.seconds)
    if isinstance(exc, requests.exceptions.ConnectionError):
        not_made = connection_not_made(exc)
        return RetriableError(
            "connection refused" if not_made else "connection lost", code="connection_error", maybe_sent=not not_made
        )
    return None
