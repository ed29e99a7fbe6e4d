"""The WSGI application's two chains: the REST API without the pages' middleware, every page with all of it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import RequestFactory

from core.handlers import PathChains, api_middleware
from core.scopes import SCOPES
from notifier.clients.services import api_client_create


def serve(app: PathChains, method: str, path: str, **extra: Any) -> tuple[int, dict[str, str], bytes]:
    """Call the WSGI application as gunicorn does; return the status, the headers and the body."""
    environ = RequestFactory().generic(method, path, **extra).environ
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        answer["status"] = int(status.split()[0])
        answer["headers"] = {name.lower(): value for name, value in headers}

    # As Django's test client: the test's transaction is the connection, which a finished request would close.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        body = b"".join(app(environ, start_response))
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    return answer["status"], answer["headers"], body


def test_the_api_chain_is_the_whole_chain_without_the_pages_middleware_in_the_same_order() -> None:
    chain = api_middleware()
    assert chain == [path for path in settings.MIDDLEWARE if path not in settings.PAGE_MIDDLEWARE]
    assert "notifier.clients.middleware.RequestContextMiddleware" in chain
    assert "core.bodies.BodyLimitMiddleware" in chain
    assert not set(chain) & set(settings.PAGE_MIDDLEWARE)


@pytest.mark.django_db
def test_an_api_request_skips_sessions_csrf_and_frames_and_a_page_keeps_them() -> None:
    app = PathChains()
    _, raw_key = api_client_create(name="chains", scopes=list(SCOPES))

    status, headers, body = serve(app, "GET", "/api/v1/templates", HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    assert status == 200, body
    assert "results" in json.loads(body)
    assert "traceparent" in headers  # the request context ran
    assert "x-frame-options" not in headers
    assert "set-cookie" not in headers
    assert "cookie" not in headers.get("vary", "").lower()
    assert headers.get("x-content-type-options") == "nosniff"  # SecurityMiddleware stays on the API

    # An API error is still the API's JSON error body through the short chain.
    status, _, body = serve(app, "POST", "/api/v1/notifications", content_type="application/json", data="{}")
    assert status == 401
    assert json.loads(body)["error"]["code"]

    status, headers, _ = serve(app, "GET", "/admin/login/")
    assert status == 200
    assert headers["x-frame-options"] == "DENY"
    assert "csrftoken" in headers.get("set-cookie", "")
    # A form posted to a page without its CSRF token is still refused.
    status, _, _ = serve(
        app,
        "POST",
        "/admin/login/",
        content_type="application/x-www-form-urlencoded",
        data="username=a&password=b",
    )
    assert status == 403
