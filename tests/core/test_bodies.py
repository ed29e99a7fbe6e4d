"""Pathological input is a 4xx, never a 500: nesting, lone surrogates, NUL, out-of-range numbers, NUL in
URLs, oversized bodies; in a batch each bad item fails alone and the good ones are written."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.bodies import json_depth, json_loads_checked, value_problems
from notifier.deliveries.models import Notification
from preferences.models import Recipient
from templates_app.services import template_put

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}}}
BATCH = "/api/v1/notifications/batch"


@pytest.fixture(autouse=True)
def _template(db: None) -> None:
    template_put(key="hello", category="transactional", default_locale="en", content=CONTENT)


def item(user_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "recipient": {"user_id": user_id},
        "category": "transactional",
        "template": "hello",
        "channels": ["email"],
        "payload": {"name": user_id},
        **extra,
    }


def raw_post(http: APIClient, path: str, raw: str | bytes, **extra: Any) -> Any:
    return http.post(path, raw, content_type="application/json", **extra)


UNSTORABLE = [
    # Written as JSON escapes: the text of the body is valid JSON, what it decodes to is not storable.
    ('"payload": {"name": "\\ud800"}', "payload"),
    ('"payload": {"\\udfff": 1}', "payload"),
    ('"payload": {"list": ["ok", "a\\udc00b"]}', "payload"),
    ('"dedup_key": "k\\ud800"', "dedup_key"),
    ('"dedup_key": "k\\u0000"', "dedup_key"),
    ('"payload": {"n": 1e999}', "payload"),
    ('"payload": {"n": -1e400}', "payload"),
    ('"payload": {"n": [1, 1.8E+308]}', "payload"),
    ('"payload": {"n":' + "9" * 309 + ".5}", "payload"),
]


@pytest.mark.parametrize(("raw", "field"), UNSTORABLE)
def test_text_postgresql_cannot_store_is_a_400_naming_the_field(api: APIClient, raw: str, field: str) -> None:
    fields = item("u-1")
    del fields["payload"]
    body = json.dumps(fields)[:-1] + ", " + raw + "}"
    response = raw_post(api, "/api/v1/notifications", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["fields"], error
    assert Notification.objects.count() == 0


def test_a_lone_surrogate_in_a_field_name_is_echoed_printable(api: APIClient) -> None:
    response = raw_post(api, "/api/v1/notifications", '{"\\ud800": 1}')
    assert response.status_code == 400
    assert "\ufffd" in response.json()["error"]["fields"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_json_constants_outside_the_standard_are_malformed_json(api: APIClient, constant: str) -> None:
    response = raw_post(api, "/api/v1/notifications", f'{{"payload": {{"n": {constant}}}}}')
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"


def test_a_body_that_is_not_utf8_is_malformed_json(api: APIClient) -> None:
    response = raw_post(api, "/api/v1/notifications", b'{"payload": {"n": "\xff\xfe"}}')
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"


def test_a_batch_of_three_with_a_lone_surrogate_keeps_its_two_good_items(api: APIClient) -> None:
    good = [json.dumps(item("u-1")), json.dumps(item("u-3"))]
    bad = json.dumps(item("u-2"))[:-1] + ', "dedup_key": "x\\ud800"}'
    response = raw_post(api, BATCH, f'{{"notifications": [{good[0]}, {bad}, {good[1]}]}}')
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 400, 202]
    assert results[1]["error"]["code"] == "invalid"
    assert "dedup_key" in results[1]["error"]["fields"]
    assert Notification.objects.count() == 2
    assert set(Recipient.objects.values_list("user_id", flat=True)) >= {"u-1", "u-3"}


@pytest.mark.parametrize(("raw", "field"), UNSTORABLE)
def test_a_batch_item_postgresql_cannot_store_fails_alone_naming_the_field(
    api: APIClient, raw: str, field: str
) -> None:
    fields = item("u-2")
    del fields["payload"]
    bad = json.dumps(fields)[:-1] + ", " + raw + "}"
    body = f'{{"notifications": [{json.dumps(item("u-1"))}, {bad}, {json.dumps(item("u-3"))}]}}'
    response = raw_post(api, BATCH, body)
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 400, 202]
    assert results[1]["error"]["code"] == "invalid"
    assert field in results[1]["error"]["fields"], results[1]
    assert Notification.objects.count() == 2


def test_the_parse_check_finds_every_body_the_walk_refuses() -> None:
    """A body the parse's check passes (its text's search and its floats) is never one the walk would refuse."""
    rng = random.Random(7)
    pieces = [
        '"ok"', '"\\u00e9"', '"\\ud83d\\ude00"', '"\\ud800"', '"a\\u0000"', '"e123"', '"1e999"', "0", "-12",
        "1.5", "1e308", "1.8e308", "-1E+400", "1e-400", "9.99e307", "1" * 99, "1" * 309 + ".0", "9" * 309 + ".0",
        "2." + "0" * 400, "1" * 120 + "e-200", "true", "null",
    ]  # fmt: skip
    for _ in range(3000):
        values = [rng.choice(pieces) for _ in range(rng.randint(1, 4))]
        space = rng.choice(["", " ", "\n  "])
        text = "{" + ",".join(f'"k{i}":{space}{v}' for i, v in enumerate(values)) + "}"
        value, maybe = json_loads_checked(text)
        if value_problems(value):
            assert maybe, text
    assert json_loads_checked(json.dumps(item("3f2e1234-ab")))[1] is False  # ordinary bodies skip the walk
    assert json_loads_checked('{"k": "é \\u00e9 1e999", "n": 1e308}')[1] is False  # they only look like one


# Up to Python's recursion limit the batch parses and the item fails alone; past it the body is refused whole.
@pytest.mark.parametrize("levels", [64, 500])
def test_a_batch_item_nested_too_deep_fails_alone(api: APIClient, levels: int) -> None:
    deep = json.dumps(item("u-2"))[:-1] + ', "dedup_key": "d", "extra": ' + "[" * levels + "]" * levels + "}"
    body = '{{"notifications": [{}, {}]}}'.format(json.dumps(item("u-1")), deep)
    response = raw_post(api, BATCH, body)
    assert response.status_code == 200, response.content[:300]
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 400]
    assert results[1]["error"]["code"] == "malformed_json"
    assert Notification.objects.count() == 1


def test_a_batch_nested_past_the_recursion_limit_is_malformed_json(api: APIClient) -> None:
    body = '{"notifications": [' + "[" * 5000 + "]" * 5000 + "]}"
    response = raw_post(api, BATCH, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_json"


def test_the_ses_callback_refuses_a_deep_body_without_a_key(db: None) -> None:
    response = APIClient().post("/callbacks/ses", "[" * 1200 + "]" * 1200, content_type="text/plain")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] == "malformed_callback"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/recipients/%00",
        "/api/v1/recipients/a%00b/devices",
        "/api/v1/templates/%00",
        "/api/v1/notifications/%00",
        "/api/v1/topics/%00/subscribers",
        "/api/v1/recipients/%01x",
        "/inbox/v1/messages/%00/read",
    ],
)
def test_a_control_character_in_a_path_is_a_404(api: APIClient, path: str) -> None:
    response = api.get(path)
    assert response.status_code == 404, (path, response.content)
    assert response.json()["error"]["code"] == "not_found"


# Every route with an id or version in its path, as a caller would call it.
ID_ROUTES = [
    ("post", "/api/v1/recipients/u-1/inbox/{}/read"),
    ("post", "/api/v1/recipients/u-1/inbox/{}/click"),
    ("post", "/inbox/v1/messages/{}/archive"),
    ("post", "/api/v1/dead-letters/{}/replay"),
    ("post", "/api/v1/dead-letters/{}/discard"),
    ("get", "/api/v1/campaigns/{}"),
    ("post", "/api/v1/campaigns/{}/pause"),
    ("delete", "/api/v1/suppressions/{}"),
    ("get", "/api/v1/templates/hello/versions/{}"),
]


@pytest.mark.parametrize(("method", "route"), ID_ROUTES)
@pytest.mark.parametrize("number", [str(2**63), "9" * 23, "9" * 5000])
def test_an_id_in_a_path_past_a_bigint_is_a_404(api: APIClient, method: str, route: str, number: str) -> None:
    response = getattr(api, method)(route.format(number))
    assert response.status_code == 404, (route, response.content)
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/api/v1/templates/{}", {"category": "transactional", "content": CONTENT}),
        ("/api/v1/layouts/{}", {"html": "<html><body>{{ content }}</body></html>"}),
        ("/api/v1/topics/{}", {"name": "Everyone"}),
        ("/api/v1/workflows/{}", {"category": "transactional", "steps": [{"id": "a", "type": "delay", "seconds": 1}]}),
    ],
)
def test_a_key_in_a_path_past_128_characters_is_a_400_naming_it(api: APIClient, route: str, body: Any) -> None:
    response = api.put(route.format("k" * 129), body, format="json")
    assert response.status_code == 400, (route, response.content)
    assert response.json()["error"]["fields"] == {"key": ["must be 1-128 letters, digits, '-' or '_'"]}
    assert api.get(route.format("k" * 129)).status_code == 404
    assert api.put(route.format("k" * 128), body, format="json").status_code in (200, 201)


def test_every_number_in_a_path_is_bounded_to_a_bigint() -> None:
    """Route parameters that are numbers use `<id:...>` (core/converters.py), never Django's unbounded `<int:...>`."""
    from django.urls import URLPattern, URLResolver, get_resolver
    from django.urls.converters import IntConverter

    from core.converters import IdConverter

    def walk(patterns: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
        found = []
        for pattern in patterns:
            converters = getattr(pattern.pattern, "converters", {})
            found += [(prefix + str(pattern.pattern), converter) for converter in converters.values()]
            if isinstance(pattern, URLResolver) and not str(pattern.pattern).startswith("admin/"):
                found += walk(pattern.url_patterns, prefix + str(pattern.pattern))
            assert isinstance(pattern, URLPattern | URLResolver)
        return found

    routes = walk(get_resolver().url_patterns)
    assert any(isinstance(converter, IdConverter) for _, converter in routes)
    unbounded = [route for route, converter in routes if isinstance(converter, IntConverter)]
    assert unbounded == []


@pytest.mark.parametrize("query", ["user_id=%00", "status=sent&category=a%00", "cursor=%00", "a%00=1"])
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(api: APIClient, query: str) -> None:
    response = api.get(f"/api/v1/notifications?{query}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["fields"]


def test_a_body_over_the_limit_is_a_413_before_authentication(settings: Any, db: None) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    for path in ("/api/v1/notifications", BATCH, "/callbacks/ses", "/callbacks/twilio", "/inbox/v1/messages/read-all"):
        response = APIClient().post(path, "x" * 1001, content_type="application/json")
        assert response.status_code == 413, (path, response.content)
        assert response.json()["error"]["code"] == "payload_too_large"
    # At the limit it is read (and refused for what it is: no key).
    assert APIClient().post("/api/v1/notifications", "x" * 1000, content_type="application/json").status_code == 401


def test_a_form_over_the_limit_is_a_413(settings: Any, db: None) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    form = "a=" + "x" * 2000
    response = APIClient().post("/callbacks/twilio", form, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413


@pytest.mark.parametrize("path", ["/api/v1/suppressions", "/api/v1/notifications", "/api/v1/dead-letters"])
def test_an_empty_cursor_is_the_first_page(api: APIClient, path: str) -> None:
    response = api.get(f"{path}?cursor=&limit=")
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


# The cursor field trims whitespace to blank: that was a 500 (a blank string taken for a decoded position).
@pytest.mark.parametrize("path", ["/api/v1/suppressions", "/api/v1/sandbox/messages"])
@pytest.mark.parametrize("cursor", ["%0A", "%20%20", "%09"])
def test_a_whitespace_cursor_is_the_first_page(api: APIClient, path: str, cursor: str) -> None:
    response = api.get(f"{path}?cursor={cursor}&limit=")
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


@pytest.mark.parametrize(
    "query", ["limit=abc", "limit=0", "limit=-1", "limit=1.5", "status=bogus", "cursor=zzz", "cursor=%7B%7D"]
)
def test_a_malformed_query_parameter_is_a_400_naming_it(api: APIClient, query: str) -> None:
    response = api.get(f"/api/v1/notifications?{query}")
    assert response.status_code == 400, response.content
    assert query.split("=")[0] in response.json()["error"]["fields"]


def test_json_depth_counts_the_levels_that_hold_a_container() -> None:
    def reference(value: object) -> int:
        if isinstance(value, dict):
            return 1 + max((reference(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((reference(v) for v in value), default=0)
        return 0

    rng = random.Random(11)

    def make(levels: int) -> object:
        if levels == 0 or rng.random() < 0.2:
            return rng.choice([1, "x", None, {}, []])
        if rng.random() < 0.5:
            return {str(i): make(levels - 1) for i in range(rng.randint(0, 3))}
        return [make(levels - 1) for _ in range(rng.randint(0, 3))]

    known: list[object] = [7, "s", {}, [], {"a": {}}, [[[]]], {"a": 1, "b": [1, {"c": []}]}]
    assert [json_depth(v) for v in known] == [0, 0, 1, 1, 2, 3, 4]
    for _ in range(3000):
        value = make(rng.randint(0, 9))
        assert json_depth(value) == reference(value), value
