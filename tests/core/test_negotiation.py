"""The JSON-first negotiation answers exactly what DRF's own does, only sooner."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from core.negotiation import JsonFirstNegotiation

ACCEPTS = [
    None,
    "",
    "*/*",
    "application/json",
    "application/*",
    "application/json; indent=4",
    "application/json;q=0.9, */*;q=0.1",
    "text/html",
    "text/*",
    "application/xml",
    "text/html, application/xhtml+xml",
]


def chosen(negotiation: DefaultContentNegotiation, accept: str | None, renderers: list[Any], query: str) -> Any:
    """Return (renderer class, media type) chosen, or the exception's class."""
    factory = APIRequestFactory()
    path = f"/api/v1/templates{query}"
    request = Request(factory.get(path) if accept is None else factory.get(path, HTTP_ACCEPT=accept))
    try:
        renderer, media_type = negotiation.select_renderer(request, renderers)
    except NotAcceptable as exc:
        return type(exc)
    return type(renderer), media_type


@pytest.mark.parametrize("query", ["", "?format=json", "?format=api"])
@pytest.mark.parametrize("accept", ACCEPTS)
def test_every_accept_header_gets_what_drf_gives_it(accept: str | None, query: str) -> None:
    for renderers in ([JSONRenderer()], [JSONRenderer(), BrowsableAPIRenderer()]):
        try:
            expected = chosen(DefaultContentNegotiation(), accept, renderers, query)
        except Exception as exc:  # a 404 for an unknown format is DRF's answer too
            expected = type(exc)
        try:
            got = chosen(JsonFirstNegotiation(), accept, renderers, query)
        except Exception as exc:
            got = type(exc)
        assert got == expected, (accept, query, renderers)


def test_an_api_answer_to_a_caller_that_wants_html_is_a_406(api: Any) -> None:
    assert api.get("/api/v1/templates").status_code == 200
    answer = api.get("/api/v1/templates", HTTP_ACCEPT="text/html")
    assert answer.status_code == 406
    assert answer.json()["error"]["code"]
