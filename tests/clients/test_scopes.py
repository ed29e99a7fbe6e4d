"""Scopes: every /api/v1/ endpoint declares one, refuses a key without it (403 scope_missing) and admits one with it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver

from core.errors import ApiError
from core.scopes import SCOPES, parse_scopes, view_scope
from notifier.clients.models import ApiClient
from tests.factories import make_api_client

METHODS = ("get", "post", "put", "patch", "delete")
SAMPLE = {"id": "1", "int": "1", "uuid": str(uuid.uuid4()), "slug": "k", "str": "x", "path": "x"}


def _api_patterns(resolver: URLResolver | None = None, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (route, view class) for every URL pattern under /api/v1/."""
    for entry in (resolver or get_resolver()).url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _api_patterns(entry, route)
        elif isinstance(entry, URLPattern) and route.startswith("api/v1/"):
            yield route, entry.callback.view_class  # type: ignore[attr-defined]  # set by APIView.as_view()


def _concrete(route: str) -> str:
    """Turn a route such as `recipients/<str:user_id>` into a path with sample values."""
    return "/" + re.sub(r"<(\w+):\w+>", lambda m: SAMPLE[m.group(1)], route)


def _endpoints() -> list[tuple[str, str, Any]]:
    out = []
    for route, view in _api_patterns():
        for method in METHODS:
            if hasattr(view, method):
                out.append((route, method.upper(), view))
    return out


ENDPOINTS = _endpoints()


@pytest.mark.pure
def test_every_api_view_declares_a_scope_for_each_method() -> None:
    assert len(ENDPOINTS) >= 30, ENDPOINTS  # the walk found the API, not an empty list
    undeclared = [(route, method) for route, method, view in ENDPOINTS if view_scope(view, method) not in SCOPES]
    assert undeclared == []


def test_an_undeclared_view_is_refused(api: Any) -> None:
    from rest_framework.views import APIView

    from notifier.clients.auth import ScopePermission

    class Bare(APIView):
        pass

    request = type("R", (), {"user": ApiClient(scopes=list(SCOPES)), "method": "GET"})()
    with pytest.raises(ApiError) as info:
        ScopePermission().has_permission(request, Bare())
    assert info.value.error_code == "scope_missing"


@pytest.mark.django_db
@pytest.mark.parametrize(("route", "method", "view"), ENDPOINTS, ids=[f"{m} {r}" for r, m, _ in ENDPOINTS])
def test_endpoint_needs_its_scope(api_client_factory: Callable[..., Any], route: str, method: str, view: Any) -> None:
    scope = view_scope(view, method)
    path = _concrete(route)
    _, without = api_client_factory(scopes=[s for s in SCOPES if s != scope])
    response = without.generic(method, path, "{}", content_type="application/json")
    assert response.status_code == 403, (path, response.content)
    assert response.json()["error"]["code"] == "scope_missing"
    assert scope in response.json()["error"]["message"]
    assert response.json()["error"]["fields"] == {"scope": [scope]}

    _, with_it = api_client_factory(scopes=[scope])
    response = with_it.generic(method, path, "{}", content_type="application/json")
    # Past the permission check: a 2xx, or the endpoint's own answer to the sample input (400, 404, 409).
    assert response.status_code in {200, 201, 202, 204, 400, 404, 409}, (path, response.status_code, response.content)


def test_without_a_key_is_401_not_403(api: Any) -> None:
    from rest_framework.test import APIClient

    response = APIClient().get("/api/v1/suppressions")
    assert response.status_code == 401


@pytest.mark.pure
def test_parse_scopes() -> None:
    assert parse_scopes("all") == list(SCOPES)
    assert parse_scopes("topics, send") == ["send", "topics"]
    with pytest.raises(ValueError, match="nope"):
        parse_scopes("send,nope")


@pytest.mark.django_db
def test_create_api_client_scopes(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("create_api_client", "plain")
    call_command("create_api_client", "ops", "--scopes", "operations,recipients:read")
    call_command("create_api_client", "everything", "--scopes", "all")
    assert ApiClient.objects.get(name="plain").scopes == ["send"]
    assert ApiClient.objects.get(name="ops").scopes == ["recipients:read", "operations"]
    assert ApiClient.objects.get(name="everything").scopes == list(SCOPES)
    assert capsys.readouterr().out.count("ntf_") == 3


@pytest.mark.django_db
def test_demo_key_has_every_scope(tmp_path: Any, settings: Any) -> None:
    settings.BASE_DIR = tmp_path
    make_api_client(name="demo", key_prefix="old", key_hash="0" * 64)  # from before scopes: send only
    call_command("bootstrap_demo")
    assert ApiClient.objects.get(name="demo").scopes == list(SCOPES)
