"""POST /api/v1/notifications/batch writes in bulk: one statement per table, one publish, per-item results."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.deliveries.outbox import coalescer
from preferences.models import Recipient
from preferences.services import suppression_add
from templates_app.services import template_put
from tests.conftest import purge_all_queues, queue_depth
from tests.factories import make_recipient

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}}}
URL = "/api/v1/notifications/batch"


@pytest.fixture(autouse=True)
def _setup(db: None) -> Any:
    template_put(key="hello", category="transactional", default_locale="en", content=CONTENT)
    template_put(key="promo", category="marketing", default_locale="en", content=CONTENT)
    purge_all_queues()
    yield
    purge_all_queues()


def item(user_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "recipient": {"user_id": user_id},
        "category": "transactional",
        "template": "hello",
        "channels": ["email"],
        "payload": {"name": user_id},
        **extra,
    }


def _inserts(queries: list[dict[str, str]], table: str) -> int:
    """Count the statements that insert into `table` (on their own or as a part of a WITH)."""
    needle = f"INSERT INTO {table.upper()} "
    return sum(1 for q in queries if needle in q["sql"].replace('"', "").upper())


def test_a_batch_of_1000_is_written_with_one_statement_per_table_and_published_once(
    api: Any, django_capture_on_commit_callbacks: Any
) -> None:
    for i in range(1000):
        make_recipient(user_id=f"u-{i}", email=f"u{i}@example.com")
    Recipient.objects.filter(user_id="u-7").update(opted_out=True)
    suppression_add(channel="email", address="u8@example.com", source="manual", reason="test")
    # Earlier single requests with dedup keys.
    same = item("u-900", dedup_key="old-same")
    first = api.post("/api/v1/notifications", same, format="json")
    assert first.status_code == 202
    other = api.post("/api/v1/notifications", item("u-901", dedup_key="old-other"), format="json")
    assert other.status_code == 202
    purge_all_queues()
    before = (Notification.objects.count(), Delivery.objects.count(), DeliveryEvent.objects.count())

    items = [item(f"u-{i}") for i in range(1000)]
    items[0] = item("u-0", category="nope")  # invalid: its own 400
    items[1] = item("u-1", dedup_key="in-1")
    items[2] = item("u-1", dedup_key="in-1")  # the same request twice in the batch: a duplicate of item 1
    items[3] = item("u-3", dedup_key="in-2")
    items[4] = item("u-4", dedup_key="in-2")  # same key, another body: 409
    items[5] = dict(same)  # an earlier request again: 200 with the earlier notification
    items[6] = item("u-6", dedup_key="old-other")  # an earlier key with another body: 409
    items[7] = item("u-7", template="promo", category="marketing")  # opted out: suppressed, as a single would be
    items[9] = item("never-seen-before")  # an unknown user gets a bare recipient (email: no_address)

    with CaptureQueriesContext(connection) as ctx, django_capture_on_commit_callbacks(execute=True):
        response = api.post(URL, {"notifications": items}, format="json")
    assert coalescer.wait_idle()

    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert len(results) == 1000
    statuses = [r["status"] for r in results]
    assert statuses[0] == 400 and results[0]["error"]["fields"]["category"]
    assert statuses[1] == 202 and statuses[2] == 200
    assert results[2]["id"] == results[1]["id"] and results[2]["duplicate"] is True
    assert statuses[3] == 202 and statuses[4] == 409 and results[4]["error"]["code"] == "idempotency_conflict"
    assert statuses[5] == 200 and results[5]["id"] == first.json()["id"]
    assert statuses[6] == 409
    assert Counter(statuses) == {202: 995, 200: 2, 409: 2, 400: 1}
    by_item = {i: r for i, r in enumerate(results)}
    assert [d["status"] for d in by_item[7]["deliveries"]] == ["suppressed"]
    assert by_item[7]["deliveries"][0]["reason"] == "opted_out"
    assert [d["reason"] for d in by_item[8]["deliveries"]] == ["suppressed"]
    assert [d["reason"] for d in by_item[9]["deliveries"]] == ["no_address"]
    assert by_item[10]["deliveries"][0]["status"] == "queued"

    new = 995
    after = (Notification.objects.count(), Delivery.objects.count(), DeliveryEvent.objects.count())
    assert after == (before[0] + new, before[1] + new, before[2] + new)
    queries = ctx.captured_queries
    assert _inserts(queries, "notifier_notification") == 1
    assert _inserts(queries, "notifier_delivery") == 1
    assert _inserts(queries, "notifier_deliveryevent") == 1
    # ... and the three are one statement: one round trip.
    tables = ("notifier_notification", "notifier_delivery", "notifier_deliveryevent")
    assert [q for q in queries if all(_inserts([q], table) for table in tables)]
    queued = sum(1 for r in results if r["status"] == 202 for d in r["deliveries"] if d["status"] == "queued")
    assert queued == new - 3
    # Published once, after commit: every queued delivery of the batch in messages of SEND_BATCH_SIZE ids.
    assert queue_depth("email.high") == math.ceil(queued / settings.SEND_BATCH_SIZE)
    # The same per-item rules as a single: a stored notification of the batch reads like one accepted alone.
    n = Notification.objects.get(pk=results[10]["id"])
    assert (n.category, n.priority, n.template_key, n.channels, n.user_id) == (
        "transactional",
        "high",
        "hello",
        ["email"],
        "u-10",
    )


def test_a_batch_repeated_as_a_whole_is_all_duplicates(api: Any) -> None:
    items = [item(f"r-{i}", dedup_key=f"k-{i}") for i in range(50)]
    first = api.post(URL, {"notifications": items}, format="json").json()["results"]
    again = api.post(URL, {"notifications": items}, format="json").json()["results"]
    assert [r["status"] for r in first] == [202] * 50
    assert [r["status"] for r in again] == [200] * 50
    assert [r["id"] for r in again] == [r["id"] for r in first]
    assert Notification.objects.filter(dedup_key__startswith="k-").count() == 50


def test_a_nul_character_in_one_item_costs_only_that_item(api: Any) -> None:
    """A payload PostgreSQL cannot store is that item's 400; the rest of the batch is written."""
    for user_id in ("u-1", "u-2", "u-3"):
        make_recipient(user_id=user_id, email=f"{user_id}@example.com")
    bad = item("u-2") | {"payload": {"name": "x\u0000y"}}
    response = api.post(URL, {"notifications": [item("u-1"), bad, item("u-3")]}, format="json")
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == [202, 400, 202]
    assert results[1]["error"]["fields"] == {"payload": ["Null characters are not allowed."]}
    assert sorted(Notification.objects.values_list("user_id", flat=True)) == ["u-1", "u-3"]
