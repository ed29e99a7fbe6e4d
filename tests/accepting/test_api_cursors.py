"""One cursor paginator: every list hands out cursors in one format and still takes the older ones.

Before the format was unified, sandbox messages, inboxes and event attempts handed out a bare id ("42") and
suppressions the base64 of one; a caller may have saved such a cursor, so it pages exactly as the new one does.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from channels_app.models import SandboxMessage
from core.pagination import decode_cursor, encode_cursor
from tests import factories

pytestmark = pytest.mark.django_db


def _legacy_base64(last_id: int) -> str:
    return base64.urlsafe_b64encode(str(last_id).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("cursor", "position"),
    [
        ("42", {"i": 42}),
        (_legacy_base64(42), {"i": 42}),
        (encode_cursor({"i": 42}), {"i": 42}),
        (encode_cursor({"c": "2026-01-01T00:00:00+00:00", "i": "x"}), {"c": "2026-01-01T00:00:00+00:00", "i": "x"}),
    ],
)
def test_every_cursor_format_decodes_to_its_position(cursor: str, position: dict[str, Any]) -> None:
    assert decode_cursor(cursor) == position


@pytest.mark.parametrize(
    "cursor",
    [
        "!!",
        "abc",
        encode_cursor([1, 2]),  # type: ignore[arg-type]  # a position that is no object, as a forged cursor has
        "-1",
        "1.5",
        "eyJpIjo",
    ],
)
def test_a_cursor_this_api_did_not_make_is_refused(cursor: str) -> None:
    with pytest.raises(ValueError):
        decode_cursor(cursor)


def _pages(api: Any, url: str, items_key: str, params: dict[str, Any], first_cursor: str | None = None) -> list[Any]:
    ids, cursor = [], first_cursor
    while True:
        response = api.get(url, {**params, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.json()
        body = response.json()
        ids += [item["id"] for item in body[items_key]]
        cursor = body["next_cursor"]
        if cursor is None:
            return ids
        assert decode_cursor(cursor) == {"i": ids[-1]}  # the one format, naming the last item seen


def test_suppressions_page_with_new_and_old_cursors(api: Any) -> None:
    for i in range(5):
        api.post("/api/v1/suppressions", {"channel": "sms", "address": f"+1555000010{i}"}, format="json")
    everything = _pages(api, "/api/v1/suppressions", "results", {"channel": "sms", "limit": 2})
    assert len(everything) == 5 and everything == sorted(everything)
    rest = _pages(api, "/api/v1/suppressions", "results", {"channel": "sms", "limit": 2}, _legacy_base64(everything[1]))
    assert rest == everything[2:]


def test_sandbox_messages_and_inboxes_take_a_bare_id_as_before(api: Any, service: Any) -> None:
    first = factories.make_delivery(channel="inapp", content={"title": "t", "body": "b"})
    recipient = first.recipient
    inbox = [first.pk] + [
        factories.make_delivery(channel="inapp", content={"title": "t", "body": "b"}, recipient=recipient).pk
        for _ in range(4)
    ]
    url = f"/api/v1/recipients/{recipient.user_id}/inbox"
    newest_first = _pages(api, url, "items", {"limit": 2})
    assert newest_first == sorted(inbox, reverse=True)
    assert _pages(api, url, "items", {"limit": 2}, str(newest_first[1])) == newest_first[2:]

    for delivery_id in inbox:
        SandboxMessage.objects.create(
            delivery_id=delivery_id, client_id=service.pk, channel="inapp", address="-", content={}
        )
    listed = api.get("/api/v1/sandbox/messages", {"channel": "inapp"}).json()["results"]
    ids = [m["id"] for m in listed]
    older = api.get("/api/v1/sandbox/messages", {"channel": "inapp", "cursor": str(ids[1])}).json()
    assert [m["id"] for m in older["results"]] == ids[2:] and older["next_cursor"] is None


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/suppressions",
        "/api/v1/sandbox/messages",
        "/api/v1/dead-letters",
        "/api/v1/notifications",
        "/api/v1/templates",
        "/api/v1/topics",
        "/api/v1/recipients",
    ],
)
def test_a_bad_cursor_is_a_400_naming_it_on_every_list(api: Any, url: str) -> None:
    response = api.get(url, {"cursor": "!!"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert response.json()["error"]["fields"] == {"cursor": ["Invalid cursor."]}


def _raw_cursor(text: str) -> str:
    """Return the cursor of a JSON text as this API encodes one (JSON that `encode_cursor` cannot make)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


# Python's JSON parser reads these (as infinities or NaN); no cursor this API makes holds one.
NON_FINITE_CURSORS = [
    '{"i": Infinity}',
    '{"i": -Infinity}',
    '{"i": NaN}',
    '{"i": 1e999}',
    '{"c": Infinity, "i": "x"}',
    '{"c": "2026-01-01T00:00:00+00:00", "i": NaN}',
    "Infinity",
]


@pytest.mark.parametrize("text", NON_FINITE_CURSORS)
def test_a_cursor_holding_a_number_no_double_holds_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode_cursor(_raw_cursor(text))


def test_a_cursor_holding_infinity_or_nan_is_a_400_naming_it_on_every_list(api: Any, service: Any) -> None:
    # Dozens of requests in a burst: a rate limit (or its per-process fallback, which an earlier test's Redis outage
    # may leave on for a moment) is not what this test is about.
    service.rate_limit = "100000/s"
    service.save(update_fields=["rate_limit"])
    for url in [*_every_list(service), "/api/v1/workflows"]:
        for text in NON_FINITE_CURSORS:
            separator = "&" if "?" in url else "?"
            response = api.get(f"{url}{separator}cursor={_raw_cursor(text)}")
            assert response.status_code == 400, (url, text, response.content)
            assert response.json()["error"]["code"] == "invalid"
            assert response.json()["error"]["fields"] == {"cursor": ["Invalid cursor."]}, (url, text)


def _every_list(service: Any) -> list[str]:
    """Return the URL of every cursor-paginated list, with what each needs to answer at all."""
    recipient = factories.make_recipient()
    factories.make_event_endpoint(client=service)
    return [
        "/api/v1/suppressions",
        "/api/v1/sandbox/messages",
        "/api/v1/dead-letters",
        "/api/v1/notifications",
        f"/api/v1/recipients/{recipient.user_id}/inbox",
        "/api/v1/event-endpoint/attempts",
        "/api/v1/templates",
        "/api/v1/topics",
        "/api/v1/recipients?email=nobody@example.com",
    ]


def test_an_empty_cursor_and_an_empty_limit_are_the_first_page_of_every_list(api: Any, service: Any) -> None:
    for url in _every_list(service):
        response = api.get(f"{url}{'&' if '?' in url else '?'}cursor=&limit=")
        assert response.status_code == 200, (url, response.json())
        body = response.json()
        assert body["results"] == [] and body["next_cursor"] is None, url


@pytest.mark.parametrize("limit", ["0", "-1", "x", "1.5"])
def test_a_limit_out_of_range_is_a_400_naming_it_on_every_list(api: Any, service: Any, limit: str) -> None:
    for url in _every_list(service):
        response = api.get(url, {"limit": limit})
        assert response.status_code == 400, (url, response.json())
        assert list(response.json()["error"]["fields"]) == ["limit"], url


def test_every_list_pages_by_limit_up_to_200(api: Any, service: Any) -> None:
    recipient = factories.make_recipient()
    inbox = [
        factories.make_delivery(channel="inapp", content={"title": "t", "body": "b"}, recipient=recipient).pk
        for _ in range(3)
    ]
    url = f"/api/v1/recipients/{recipient.user_id}/inbox"
    first = api.get(url, {"limit": 1}).json()
    assert [i["id"] for i in first["results"]] == [max(inbox)] and first["items"] == first["results"]
    assert api.get(url, {"limit": 200}).status_code == 200
    assert api.get(url, {"limit": 201}).status_code == 400
    # The two lists that allowed larger pages before keep their maximum.
    assert api.get("/api/v1/suppressions", {"limit": 1000}).status_code == 200
    assert api.get("/api/v1/suppressions", {"limit": 1001}).status_code == 400
    assert api.get("/api/v1/dead-letters", {"limit": 500}).status_code == 200
    assert api.get("/api/v1/dead-letters", {"limit": 501}).status_code == 400


def test_the_notification_list_takes_a_page_size(api: Any, service: Any) -> None:
    made = [factories.make_notification(client=service).pk for _ in range(3)]
    first = api.get("/api/v1/notifications", {"limit": 2}).json()
    assert len(first["results"]) == 2 and first["next_cursor"]
    rest = api.get("/api/v1/notifications", {"limit": 2, "cursor": first["next_cursor"]}).json()
    seen = [n["id"] for n in first["results"] + rest["results"]]
    assert sorted(seen) == sorted(str(pk) for pk in made) and rest["next_cursor"] is None
