"""A small threaded HTTP server on 127.0.0.1, programmable per test.

Each stand-in (FCM, Twilio, webhook receiver, the AWS fault proxy) subclasses `StubHTTPServer` and answers
with its provider's success response by default. A test queues rules that override it for matching
requests: an error status and body, a 429 with Retry-After, a redirect, or a hang. Every request is
recorded, so a test can check what the real SDK actually put on the wire.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@dataclass
class RecordedRequest:
    """One request the stub received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    # When it arrived (time.monotonic()): tests check that a client waited as long as it was told to.
    received_at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        """Return the body parsed as JSON."""
        return json.loads(self.body)

    def form(self) -> dict[str, str]:
        """Return the body parsed as a form (last value wins)."""
        return {k: v[-1] for k, v in parse_qs(self.body.decode(), keep_blank_values=True).items()}

    def header(self, name: str) -> str | None:
        """Return a header, case-insensitively."""
        lowered = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == lowered), None)

    @property
    def route(self) -> str:
        """Return the path without its query string."""
        return urlsplit(self.path).path


@dataclass
class StubResponse:
    """What the stub answers."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds to wait before answering (longer than the client's read timeout makes a hang).
    delay: float = 0.0
    # Seconds over which the whole answer (status line, headers, body) is written one byte at a time: each
    # byte arrives well within any read timeout, but the answer takes this long.
    drip: float = 0.0


Matcher = Callable[[RecordedRequest], bool]


@dataclass
class Rule:
    """Answer `response` to requests that `match`, `times` times (None: until reset)."""

    response: StubResponse | Callable[[RecordedRequest], StubResponse]
    match: Matcher | None = None
    times: int | None = None


class _ListeningServer(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5. A provider opens a connection per call in flight (sixteen at once)
    # while the serving thread may not be scheduled for a while on a busy box: past the backlog the kernel drops
    # the SYN, the client tries again a second later, and a call can run out of its connect timeout and be
    # retried, which the stand-in's counts then show as a second attempt that no provider caused.
    request_queue_size = 128


class StubHTTPServer:
    """A threaded HTTP/1.1 server (keep-alive) on 127.0.0.1 with a random port."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = RecordedRequest(self.command, self.path, dict(self.headers.items()), body)
                response = stub._dispatch(request)
                if response.delay:
                    stub._stopping.wait(response.delay)
                if response.drip:
                    self._drip(response)
                    return
                try:
                    self.send_response(response.status)
                    headers = {"Content-Type": "application/json", **response.headers}
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(response.body)))
                    self.end_headers()
                    self.wfile.write(response.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def _drip(self, response: StubResponse) -> None:
                head = f"HTTP/1.1 {response.status} OK\r\nContent-Type: application/json\r\n"
                head += "".join(f"{k}: {v}\r\n" for k, v in response.headers.items())
                head += f"Content-Length: {len(response.body)}\r\n\r\n"
                raw = head.encode() + response.body
                pause = response.drip / len(raw)
                try:
                    for i in range(len(raw)):
                        if stub._stopping.wait(pause):
                            return
                        self.wfile.write(raw[i : i + 1])
                        self.wfile.flush()
                except OSError:
                    pass  # the client gave up (its deadline)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                return  # keep test output clean

        self.server = _ListeningServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name=type(self).__name__, daemon=True)

    @property
    def port(self) -> int:
        """Return the port the stub listens on."""
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        """Return the stub's base URL, without a trailing slash."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release hanging handlers."""
        self._stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        """Forget recorded requests and rules."""
        with self._lock:
            self.requests.clear()
            self._rules.clear()

    def add_rule(
        self,
        response: StubResponse | Callable[[RecordedRequest], StubResponse],
        *,
        match: Matcher | None = None,
        times: int | None = None,
    ) -> None:
        """Answer `response` to matching requests before the default; the oldest matching rule wins."""
        with self._lock:
            self._rules.append(Rule(response, match, times))

    def respond(
        self,
        status: int,
        body: Any = b"",
        *,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        match: Matcher | None = None,
        times: int | None = None,
    ) -> None:
        """Answer with `status` and `body` (dicts are sent as JSON)."""
        raw = json.dumps(body).encode() if isinstance(body, dict | list) else body
        raw = raw.encode() if isinstance(raw, str) else raw
        self.add_rule(StubResponse(status, raw, headers or {}, delay), match=match, times=times)

    def hang(self, seconds: float = 30.0, *, match: Matcher | None = None, times: int | None = None) -> None:
        """Answer only after `seconds` (or when the stub stops): the client's read timeout fires first."""
        self.add_rule(self._hang_response(seconds), match=match, times=times)

    def _hang_response(self, seconds: float) -> Callable[[RecordedRequest], StubResponse]:
        def build(request: RecordedRequest) -> StubResponse:
            response = self.default_response(request)
            response.delay = seconds
            return response

        return build

    def _dispatch(self, request: RecordedRequest) -> StubResponse:
        with self._lock:
            self.requests.append(request)
            for rule in self._rules:
                if rule.match is None or rule.match(request):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    chosen = rule.response
                    break
            else:
                chosen = None
        if chosen is None:
            return self.default_response(request)
        return chosen(request) if callable(chosen) else chosen

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Return the provider's success answer; subclasses override."""
        return StubResponse(200, b"{}")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
