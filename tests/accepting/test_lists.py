"""Lists of templates, topics and recipients: keyset pages in the one shape, served by indexes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from preferences import selectors as preference_selectors
from preferences.models import Recipient, Topic
from preferences.services import recipient_erase, recipient_upsert
from templates_app import selectors as template_selectors
from templates_app.services import template_put
from tests import factories

CONTENT = {"en": {"inapp": {"title": "Hi", "body": "Hello"}}}


def _walk(api: Any, url: str, limit: int, **params: Any) -> list[dict[str, Any]]:
    """Follow next_cursor from the first page to the last; return every item in order."""
    items: list[dict[str, Any]] = []
    cursor = ""  # an empty cursor is the first page
    for _ in range(100):
        response = api.get(url, {**params, "limit": limit, "cursor": cursor})
        assert response.status_code == 200, response.content
        body = response.json()
        assert set(body) == {"results", "next_cursor"}
        assert len(body["results"]) <= limit
        items += body["results"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("the pages never ended")


@pytest.mark.django_db
def test_templates_list_pages_through_every_template_with_its_published_version(api: Any) -> None:
    for n in range(5):
        template_put(key=f"t-{n}", category="transactional", default_locale="en", content=CONTENT, publish=n != 3)
    template_put(key="t-0", category="transactional", default_locale="en", content=CONTENT)  # version 2
    items = _walk(api, "/api/v1/templates", 2)
    assert [t["key"] for t in items] == ["t-0", "t-1", "t-2", "t-3", "t-4"]
    assert [t["published_version"] for t in items] == [2, 1, 1, None, 1]
    assert items[0]["category"] == "transactional" and items[0]["default_locale"] == "en"


@pytest.mark.django_db
def test_limit_at_its_edges_on_the_new_lists(api: Any) -> None:
    for n in range(3):
        Topic.objects.create(key=f"topic-{n}", name=f"Topic {n}")
        template_put(key=f"t-{n}", category="transactional", default_locale="en", content=CONTENT)
        recipient_upsert(user_id=f"u-{n}")
    for url in ("/api/v1/templates", "/api/v1/topics", "/api/v1/recipients"):
        for limit in ("0", "201", "-1", "x"):
            response = api.get(url, {"limit": limit})
            assert response.status_code == 400, (url, limit)
            assert list(response.json()["error"]["fields"]) == ["limit"], (url, limit)
        one = api.get(url, {"limit": 1}).json()
        assert len(one["results"]) == 1 and one["next_cursor"], url
        for limit in ("200", ""):  # the largest page, and an empty limit (the default, 50)
            page = api.get(url, {"limit": limit, "cursor": ""}).json()
            assert len(page["results"]) == 3 and page["next_cursor"] is None, (url, limit)
        rest = api.get(url, {"limit": 200, "cursor": one["next_cursor"]}).json()
        assert len(rest["results"]) == 2 and rest["results"][0] != one["results"][0], url


@pytest.mark.django_db
def test_topics_list(api: Any) -> None:
    for key in ("news", "offers", "releases"):
        Topic.objects.create(key=key, name=key.title())
    items = _walk(api, "/api/v1/topics", 2)
    assert [(t["key"], t["name"]) for t in items] == [("news", "News"), ("offers", "Offers"), ("releases", "Releases")]


@pytest.mark.django_db
def test_recipients_found_by_exact_email_or_phone_normalised_as_stored(api: Any) -> None:
    recipient_upsert(user_id="ada", email="ada@example.com", phone="+4915112345678")
    recipient_upsert(user_id="ada-2", email="ada@example.com")
    recipient_upsert(user_id="bob", email="bob@example.com", phone="+14155550101")
    recipient_upsert(user_id="gone", email="ada@example.com")
    recipient_erase(recipient=Recipient.objects.get(user_id="gone"))
    by_email = _walk(api, "/api/v1/recipients", 1, email=" ada@example.com ")
    assert [r["user_id"] for r in by_email] == ["ada", "ada-2"]
    assert set(by_email[0]) >= {"user_id", "email", "phone", "locale", "timezone", "created_at"}
    # The phone is normalised as a recipient's own is: spaces and national formatting still find it.
    by_phone = api.get("/api/v1/recipients", {"phone": "+49 151 1234 5678"}).json()["results"]
    assert [r["user_id"] for r in by_phone] == ["ada"]
    both = api.get("/api/v1/recipients", {"email": "ada@example.com", "phone": "+14155550101"}).json()
    assert both["results"] == []
    assert api.get("/api/v1/recipients", {"email": "ADA@example.org"}).json()["results"] == []
    everyone = _walk(api, "/api/v1/recipients", 2)
    assert [r["user_id"] for r in everyone] == ["ada", "ada-2", "bob"]  # erased recipients are not listed
    for field, value in (("phone", "12"), ("email", "not-an-email")):
        response = api.get("/api/v1/recipients", {field: value})
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == [field]


def _plan(run: Any) -> str:
    """Run a selector, EXPLAIN the one query it made, and return the plan as text."""
    with CaptureQueriesContext(connection) as captured:
        run()
    [query] = captured.captured_queries
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {query['sql']}")
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.django_db
def test_every_new_list_is_served_by_an_index() -> None:
    """With tens of thousands of rows, no list query reads its table by a sequential scan."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out,"
            " tracking_opt_out, channel_prefs, category_prefs, created_at, updated_at)"
            " SELECT 'bulk-' || g, 'r' || g || '@example.com', CASE WHEN g % 3 = 0 THEN '' ELSE '+1415' ||"
            " lpad(g::text, 7, '0') END, '', '', '', false, false, '{}', '{}', now(), now()"
            " FROM generate_series(1, 30000) g"
        )
        cursor.execute(
            "INSERT INTO preferences_topic (key, name, created_at) SELECT 'bulk-' || g, '', now()"
            " FROM generate_series(1, 30000) g"
        )
        cursor.execute(
            "INSERT INTO templates_app_template (key, category, default_locale, description, created_at, updated_at)"
            " SELECT 'bulk-' || g, 'transactional', 'en', '', now(), now() FROM generate_series(1, 30000) g"
        )
        cursor.execute("ANALYZE preferences_recipient, preferences_topic, templates_app_template")
    middle = Recipient.objects.get(user_id="bulk-15000").pk
    plans = {
        "recipients": _plan(lambda: preference_selectors.recipient_list(after_id=middle, limit=51)),
        "recipients by email": _plan(lambda: preference_selectors.recipient_list(email="r7@example.com", limit=51)),
        "recipients by phone": _plan(lambda: preference_selectors.recipient_list(phone="+14150000007", limit=51)),
        "topics": _plan(lambda: preference_selectors.topic_list(after_id=100, limit=51)),
        "templates": _plan(lambda: template_selectors.template_list(after_id=100, limit=51)),
    }
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, (name, plan)
        assert "Index Scan" in plan or "Index Only Scan" in plan or "Bitmap Index Scan" in plan, (name, plan)
    assert "recipient_email_idx" in plans["recipients by email"]
    assert "recipient_phone_idx" in plans["recipients by phone"]


@pytest.mark.django_db
def test_a_list_item_never_costs_a_query_of_its_own(api: Any) -> None:
    for n in range(5):
        template_put(key=f"t-{n}", category="transactional", default_locale="en", content=CONTENT)
        Topic.objects.create(key=f"topic-{n}")
        factories.make_recipient()
    api.get("/api/v1/topics")  # the key's first use loads and touches the client: not the list's cost
    for url in ("/api/v1/templates", "/api/v1/topics", "/api/v1/recipients"):
        with CaptureQueriesContext(connection) as one:
            api.get(url, {"limit": 1})
        with CaptureQueriesContext(connection) as five:
            api.get(url, {"limit": 5})
        assert len(five.captured_queries) == len(one.captured_queries), url
