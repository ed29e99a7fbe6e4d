"""Stand-in for Twilio's Messages API (2010-04-01), for the real twilio SDK."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable

from tests.stubs.http import RecordedRequest, StubHTTPServer, StubResponse

ACCOUNT_SID = "AC" + "0" * 32
AUTH_TOKEN = "stub-auth-token"


class TwilioStub(StubHTTPServer):
    """Accepts message creations with 201 and a fresh SM sid; checks Basic auth like Twilio does.

    `accounts` are the account SIDs it knows with their auth tokens (a test adds a project's own account); a
    message is created under the account of its URL, whose credentials the request must carry.
    """

    def __init__(self) -> None:
        super().__init__()
        self.accounts = {ACCOUNT_SID: AUTH_TOKEN}

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Create the message, or answer 401 when the credentials are wrong."""
        account_sid = self.account_of(request)
        token = self.accounts.get(account_sid, "")
        expected = "Basic " + base64.b64encode(f"{account_sid}:{token}".encode()).decode()
        if not token or request.header("Authorization") != expected:
            return self._error(401, 20003, "Authenticate")
        if not request.route.endswith("/Messages.json"):
            return self._error(404, 20404, "The requested resource was not found")
        form = request.form()
        if not form.get("Body") and not form.get("ContentSid"):
            return self._error(400, 21602, "Message body is required")
        if form.get("To", "").startswith("whatsapp:") and not (
            form.get("From", "").startswith("whatsapp:") or form.get("MessagingServiceSid")
        ):
            return self._error(400, 63007, "Twilio could not find a Channel with the specified From address")
        body = {
            "sid": "SM" + uuid.uuid4().hex,
            "account_sid": account_sid,
            "to": form.get("To"),
            "from": form.get("From"),
            "messaging_service_sid": form.get("MessagingServiceSid"),
            "body": form.get("Body"),
            "status": "queued",
            "num_segments": "1",
            "direction": "outbound-api",
            "api_version": "2010-04-01",
            "uri": f"/2010-04-01/Accounts/{account_sid}/Messages/x.json",
        }
        return StubResponse(201, json.dumps(body).encode())

    @staticmethod
    def _error(status: int, code: int, message: str, headers: dict[str, str] | None = None) -> StubResponse:
        body = {
            "code": code,
            "message": message,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        }
        return StubResponse(status, json.dumps(body).encode(), headers or {})

    @staticmethod
    def account_of(request: RecordedRequest) -> str:
        """Return the account SID of a request's URL (/2010-04-01/Accounts/<sid>/…), or ""."""
        parts = request.route.split("/")
        return parts[3] if len(parts) > 3 and parts[2] == "Accounts" else ""

    def messages(self) -> list[dict[str, str]]:
        """Return the forms of the message creations received."""
        return [r.form() for r in self.requests if r.route.endswith("/Messages.json")]

    def fail(
        self,
        status: int,
        code: int,
        *,
        to: str | None = None,
        retry_after: str | None = None,
        times: int | None = None,
    ) -> None:
        """Answer message creations (to `to`, or all) with a Twilio error."""
        headers = {"Retry-After": retry_after} if retry_after else {}
        self.add_rule(self._error(status, code, f"stub error {code}", headers), match=self.match_to(to), times=times)

    @staticmethod
    def match_to(to: str | None) -> Callable[[RecordedRequest], bool]:
        """Match message creations, only those to `to` when given."""

        def match(request: RecordedRequest) -> bool:
            return request.route.endswith("/Messages.json") and (to is None or request.form().get("To") == to)

        return match
