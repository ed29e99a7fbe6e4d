"""A notifications cursor that is not one this API made is a 400 naming `cursor`, whatever is inside it."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from core.pagination import encode_cursor

pytestmark = pytest.mark.django_db


def b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "%%%",
        b64([1, 2]),
        b64({}),
        b64({"c": "2026-01-01T00:00:00+00:00", "i": "not-a-uuid"}),
        b64({"c": "2026-01-01T00:00:00+00:00", "i": 42}),
        b64({"c": 5, "i": "7d1b8c1e-0b0f-4a7e-9a39-4c2d6f1f5a10"}),
        b64({"c": "yesterday", "i": "7d1b8c1e-0b0f-4a7e-9a39-4c2d6f1f5a10"}),
        b64({"c": "2026-01-01T00:00:00", "i": "7d1b8c1e-0b0f-4a7e-9a39-4c2d6f1f5a10"}),
        b64({"c": ["x"], "i": {"y": 1}}),
    ],
)
def test_bad_cursor_parts_are_400(api: Any, cursor: str) -> None:
    response = api.get("/api/v1/notifications", {"cursor": cursor})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["fields"] == {"cursor": ["Invalid cursor."]}


def test_a_good_cursor_still_pages(api: Any) -> None:
    cursor = encode_cursor({"c": "2026-01-01T00:00:00+00:00", "i": "7d1b8c1e-0b0f-4a7e-9a39-4c2d6f1f5a10"})
    response = api.get("/api/v1/notifications", {"cursor": cursor})
    assert response.status_code == 200 and response.json()["results"] == []
