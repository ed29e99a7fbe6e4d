"""Stand-in for FCM HTTP v1 and Google's OAuth token endpoint, for the real firebase-admin SDK."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.stubs.http import RecordedRequest, StubHTTPServer, StubResponse

PROJECT_ID = "notifier-test"
FCM_ERROR_TYPE = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
# The HTTP status and google.rpc status FCM answers with for each of its error codes.
FCM_ERRORS: dict[str, tuple[int, str]] = {
    "UNREGISTERED": (404, "NOT_FOUND"),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED"),
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED"),
    "UNAVAILABLE": (503, "UNAVAILABLE"),
    "INTERNAL": (500, "INTERNAL"),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED"),
}


def write_service_account(path: Path, *, token_uri: str, project_id: str = PROJECT_ID) -> Path:
    """Write a service-account JSON file with a fresh RSA key whose tokens come from `token_uri`."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": project_id,
                "private_key_id": uuid.uuid4().hex,
                "private_key": pem,
                "client_email": f"notifier@{project_id}.iam.gserviceaccount.com",
                "client_id": "1234567890",
                "token_uri": token_uri,
            }
        )
    )
    return path


class FcmStub(StubHTTPServer):
    """Answers the OAuth token exchange at /token and FCM sends at /v1/projects/<id>/messages:send."""

    token_path = "/token"

    def default_response(self, request: RecordedRequest) -> StubResponse:
        """Issue a token, or accept a message with a fresh message name."""
        if request.route == self.token_path:
            body = {"access_token": f"ya29.stub-{uuid.uuid4().hex}", "expires_in": 3600, "token_type": "Bearer"}
            return StubResponse(200, json.dumps(body).encode())
        project = request.route.split("/")[3] if request.route.count("/") >= 3 else PROJECT_ID
        return StubResponse(200, json.dumps({"name": f"projects/{project}/messages/{uuid.uuid4().hex}"}).encode())

    @property
    def token_uri(self) -> str:
        """Return the OAuth token endpoint URL."""
        return f"{self.url}{self.token_path}"

    def sends(self) -> list[RecordedRequest]:
        """Return the message sends received (token requests left out)."""
        return [r for r in self.requests if r.route.endswith("/messages:send")]

    def fail(
        self,
        fcm_code: str,
        *,
        token: str | None = None,
        retry_after: str | None = None,
        times: int | None = None,
    ) -> None:
        """Answer sends (to `token`, or all) with FCM's error response for `fcm_code`."""
        status, rpc_status = FCM_ERRORS[fcm_code]
        body = {
            "error": {
                "code": status,
                "message": f"stub {fcm_code}",
                "status": rpc_status,
                "details": [{"@type": FCM_ERROR_TYPE, "errorCode": fcm_code}],
            }
        }
        headers = {"Retry-After": retry_after} if retry_after else {}
        self.respond(status, body, headers=headers, match=self.match_token(token), times=times)

    @staticmethod
    def match_token(token: str | None) -> Callable[[RecordedRequest], bool]:
        """Match message sends, only those to `token` when given."""

        def match(request: RecordedRequest) -> bool:
            if not request.route.endswith("/messages:send"):
                return False
            return token is None or request.json()["message"].get("token") == token

        return match
