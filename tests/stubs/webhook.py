"""Stand-in webhook receiver: records what arrives and answers as each test programs it."""

from __future__ import annotations

from tests.stubs.http import RecordedRequest, StubHTTPServer, StubResponse


class WebhookReceiver(StubHTTPServer):
    """Accepts every POST with 200 unless a rule says otherwise."""

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Accept the delivery."""
        return StubResponse(200, b'{"ok":true}')

    def redirect_to(self, location: str, *, status: int = 302) -> None:
        """Answer every request with a redirect to `location`."""
        self.respond(status, b"", headers={"Location": location})
