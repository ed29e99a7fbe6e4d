"""Stand-ins for SES v2 and SNS: moto's server behind a programmable fault proxy.

Moto implements the APIs (verified identities, MessageRejected for an unverified sender, InvalidParameter
for a malformed phone number) but cannot throttle or fail on demand. The proxy forwards to moto unless a
rule says otherwise, and records every request so a test can see what boto3 put on the wire.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable
from typing import Any
from xml.sax.saxutils import escape

import boto3
import requests
from moto.server import ThreadedMotoServer

from tests.stubs.http import RecordedRequest, StubHTTPServer, StubResponse

REGION = "us-east-1"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"


class MotoServer:
    """moto's threaded server on 127.0.0.1 with a random port."""

    def __init__(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def start(self) -> MotoServer:
        """Start serving."""
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        self._warm_up()
        return self

    def _warm_up(self) -> None:
        # moto loads a service's backend on its first call (over a second): do it now, not under a test's
        # short read timeout.
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
        )
        session.client("sesv2", endpoint_url=self.url).list_email_identities()
        session.client("sns", endpoint_url=self.url).list_topics()

    def stop(self) -> None:
        """Stop serving."""
        self.server.stop()

    def reset(self) -> None:
        """Drop every backend's state (identities, sent messages)."""
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()


class AwsFaultProxy(StubHTTPServer):
    """Forwards to moto by default; rules answer SES (rest-json) or SNS (query) errors instead."""

    def __init__(self, upstream: str) -> None:
        super().__init__()
        host, port = upstream.removeprefix("http://").split(":")
        self._upstream = (host, int(port))

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Forward the request to moto unchanged and relay its answer."""
        conn = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in {"connection", "content-length"}}
            conn.request(request.method, request.path, body=request.body, headers=headers)
            upstream = conn.getresponse()
            body = upstream.read()
            passed = {
                k: v
                for k, v in upstream.getheaders()
                if k.lower() not in {"content-length", "connection", "transfer-encoding", "server", "date"}
            }
            return StubResponse(upstream.status, body, passed)
        finally:
            conn.close()

    # --- SES v2 (rest-json): the error type travels in a header and the body -------------------------
    @staticmethod
    def is_ses_send(request: RecordedRequest) -> bool:
        """Match SES v2 SendEmail calls."""
        return request.route == "/v2/email/outbound-emails"

    def ses_error(
        self, status: int, error_type: str, *, retry_after: str | None = None, times: int | None = None
    ) -> None:
        """Answer SES v2 SendEmail with `error_type` (TooManyRequestsException, MessageRejected, ...)."""
        headers = {"x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.ses/"}
        if retry_after:
            headers["Retry-After"] = retry_after
        body = json.dumps({"message": f"stub {error_type}"}).encode()
        self.add_rule(StubResponse(status, body, headers), match=self.is_ses_send, times=times)

    def ses_sends(self) -> list[RecordedRequest]:
        """Return the SES v2 SendEmail requests received."""
        return [r for r in self.requests if self.is_ses_send(r)]

    # --- SNS (query protocol): XML error documents ---------------------------------------------------
    @staticmethod
    def match_sns_publish(phone: str | None = None) -> Callable[[RecordedRequest], bool]:
        """Match SNS Publish calls, only those to `phone` when given."""

        def match(request: RecordedRequest) -> bool:
            if request.method != "POST":
                return False
            form = request.form()
            return form.get("Action") == "Publish" and (phone is None or form.get("PhoneNumber") == phone)

        return match

    def sns_error(
        self, status: int, code: str, message: str = "stub error", *, phone: str | None = None, times: int | None = None
    ) -> None:
        """Answer SNS Publish with an error document carrying `code` (Throttling, InvalidParameter, ...)."""
        kind = "Receiver" if status >= 500 else "Sender"
        body = (
            '<ErrorResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/">'
            f"<Error><Type>{kind}</Type><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
            "<RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>"
        ).encode()
        self.add_rule(
            StubResponse(status, body, {"Content-Type": "text/xml"}), match=self.match_sns_publish(phone), times=times
        )

    def sns_publishes(self) -> list[dict[str, str]]:
        """Return the forms of the SNS Publish calls received."""
        return [r.form() for r in self.requests if self.match_sns_publish()(r)]


def archive_bucket(server: MotoServer, settings: Any, *, prefix: str) -> Any:
    """Create a fresh bucket on moto's S3, configure it as the archive's, and return a boto3 client of it."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    settings.ARCHIVE_BUCKET = name
    settings.ARCHIVE_PREFIX = "notifier"
    settings.ARCHIVE_S3_ENDPOINT_URL = server.url
    settings.ARCHIVE_S3_REGION = REGION
    settings.ARCHIVE_AWS_ACCESS_KEY_ID = ACCESS_KEY
    settings.ARCHIVE_AWS_SECRET_ACCESS_KEY = SECRET_KEY
    client = boto3.client(
        "s3",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    client.create_bucket(Bucket=name)
    return client
