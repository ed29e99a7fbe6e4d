"""Stand-in webhook receiver: records what arrives and answers as each test programs it."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

from tests.stubs.http import RecordedRequest, StubHTTPServer, StubResponse


class WebhookReceiver(StubHTTPServer):
    """Accepts every POST with 200 unless a rule says otherwise."""

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Accept the delivery."""
        return StubResponse(200, b'{"ok":true}')

    def redirect_to(self, location: str, *, status: int = 302) -> None:
        """Answer every request with a redirect to `location`."""
        self.respond(status, b"", headers={"Location": location})


@dataclass(frozen=True)
class Hit:
    """One request the receiver saw: wall-clock arrival time, delivery id and the status it answered."""

    at: float
    delivery_id: int
    status: int


class TimedReceiver(WebhookReceiver):
    """A webhook receiver that timestamps every request and can be switched to 429 or 503 while a flag is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[Hit] = []
        self.throttling = threading.Event()
        self.down = threading.Event()
        self.retry_after = "1"
        self.add_rule(self._throttled, match=lambda _: self.throttling.is_set())
        self.add_rule(StubResponse(503, b'{"error":"down"}'), match=lambda _: self.down.is_set())

    def _throttled(self, request: RecordedRequest) -> StubResponse:
        return StubResponse(429, b'{"error":"slow down"}', {"Retry-After": self.retry_after})

    def _dispatch(self, request: RecordedRequest) -> StubResponse:
        arrived = time.time()
        response = super()._dispatch(request)
        webhook_id = request.header("webhook-id") or "dlv_0"
        with self._lock:
            self.hits.append(Hit(arrived, int(webhook_id.removeprefix("dlv_")), response.status))
        return response

    def snapshot(self) -> list[Hit]:
        """Return a copy of the hits so far, in arrival order."""
        with self._lock:
            return sorted(self.hits, key=lambda h: h.at)

    def ok_per_delivery(self) -> Counter[int]:
        """Return how many 2xx answers each delivery id got."""
        return Counter(h.delivery_id for h in self.snapshot() if 200 <= h.status < 300)
