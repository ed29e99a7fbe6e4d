"""GET /api/v1/stats: counts of a client's deliveries per day, channel, status and template, partition by partition."""

from __future__ import annotations

import random
import re
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifier.clients.models import ApiClient
from notifier.deliveries import partitions
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.selectors import delivery_stats
from tests import factories

CHANNELS = ("email", "sms", "push", "inapp")
STATUSES = ("sent", "delivered", "failed", "suppressed")
TEMPLATES = ("order_shipped", "welcome", "otp")


def _today() -> date:
    return timezone.now().astimezone(UTC).date()


def _write(client: ApiClient, at: datetime, deliveries: list[tuple[str, str]], template: str) -> None:
    """Write a notification born at `at` and its deliveries, with the ids the accept path gives that moment.

    The notification's UUIDv7 carries `at` (its created_at follows from it), and each delivery id comes from the
    database's notifier_delivery_id(at), so every row lands in the day partition the real write path puts it in.
    """
    recipient = factories.make_recipient()
    notification = Notification.objects.create(
        id=partitions.uuid7(at),
        client=client,
        environment_id=client.environment_id,
        category="transactional",
        template_key=template,
        priority="high",
        channels=[c for c, _ in deliveries],
        recipient=recipient,
        user_id=recipient.user_id,
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT notifier_delivery_id(%s) FROM generate_series(1, %s)", [at, len(deliveries)])
        ids = [row[0] for row in cursor.fetchall()]
    Delivery.objects.bulk_create(
        Delivery(
            id=delivery_id,
            notification=notification,
            recipient=recipient,
            channel=channel,
            priority="high",
            address=f"{delivery_id}@example.com",
            environment_id=client.environment_id,
            status=status,
        )
        for delivery_id, (channel, status) in zip(ids, deliveries, strict=True)
    )


def _days(*days: date) -> None:
    for day in days:
        for table in partitions.TABLES:
            partitions.create_partition(table, day)


@pytest.mark.django_db
def test_stats_match_the_counts_read_from_the_database(api: Any, service: ApiClient) -> None:
    today = _today()
    yesterday, before = today - timedelta(days=1), today - timedelta(days=2)
    _days(before, yesterday, today)
    other = factories.make_api_client()
    rng = random.Random(7)
    midnight = datetime(today.year, today.month, today.day, tzinfo=UTC)
    now = timezone.now()
    # A few hundred notifications across yesterday and today (some of another client, some the day before).
    for n in range(240):
        at = (
            midnight
            - timedelta(hours=24)
            + timedelta(seconds=rng.uniform(0, (now - midnight).total_seconds() + 86_000))
        )
        at = min(at, now)
        items = [(rng.choice(CHANNELS), rng.choice(STATUSES)) for _ in range(rng.randint(1, 3))]
        _write(service if n % 6 else other, at, items, rng.choice(TEMPLATES))
    for _ in range(5):
        _write(service, datetime(before.year, before.month, before.day, 12, tzinfo=UTC), [("email", "sent")], "otp")

    # The truth, read directly: every delivery of the client, counted by the day its id carries.
    expected: Counter[tuple[str, str, str, str]] = Counter()
    mine = Delivery.objects.filter(notification__client=service).values_list("id", "channel", "status")
    templates = dict(Notification.objects.filter(client=service).values_list("id", "template_key"))
    notification_of = dict(Delivery.objects.filter(notification__client=service).values_list("id", "notification_id"))
    for delivery_id, channel, status in mine:
        day = partitions.delivery_id_day(delivery_id)
        if yesterday <= day <= today:
            expected[(str(day), channel, status, templates[notification_of[delivery_id]])] += 1
    assert sum(expected.values()) > 300

    response = api.get("/api/v1/stats", {"from": str(yesterday), "to": str(today)})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["from"], body["to"]) == (str(yesterday), str(today))
    got = {(r["day"], r["channel"], r["status"], r["template"]): r["count"] for r in body["results"]}
    assert got == dict(expected)
    assert all(list(r) == ["day", "channel", "status", "template", "count"] for r in body["results"])

    # Fewer keys: the same deliveries in coarser groups, only the keys asked for in each row.
    by_channel = api.get("/api/v1/stats", {"from": str(yesterday), "to": str(today), "group_by": "channel"}).json()
    coarse: Counter[str] = Counter()
    for (_, channel, _, _), count in expected.items():
        coarse[channel] += count
    assert {r["channel"]: r["count"] for r in by_channel["results"]} == dict(coarse)
    assert all(set(r) == {"channel", "count"} for r in by_channel["results"])
    # One day only, by day and status.
    only_today = api.get("/api/v1/stats", {"from": str(today), "group_by": "status,day"}).json()
    assert {r["day"] for r in only_today["results"]} <= {str(today)}
    assert sum(r["count"] for r in only_today["results"]) == sum(c for k, c in expected.items() if k[0] == str(today))
    assert all(list(r) == ["day", "status", "count"] for r in only_today["results"])
    # The mode filter: this client is live, so its test traffic is nothing.
    live = api.get("/api/v1/stats", {"from": str(yesterday), "group_by": "day", "mode": "live"}).json()
    assert sum(r["count"] for r in live["results"]) == sum(expected.values())
    assert api.get("/api/v1/stats", {"from": str(yesterday), "mode": "test"}).json()["results"] == []


@pytest.mark.django_db
def test_a_test_clients_statistics_are_its_own_and_in_test_mode(api_client_factory: Any) -> None:
    today = _today()
    staging = factories.make_api_client(mode="test", scopes=["send"])
    _write(staging, timezone.now(), [("email", "sent"), ("sms", "sent")], "otp")
    from tests.conftest import bearer_client

    http = bearer_client(staging.raw_key)  # type: ignore[attr-defined]
    body = http.get("/api/v1/stats", {"group_by": "channel", "mode": "test"}).json()
    assert body["results"] == [{"channel": "email", "count": 1}, {"channel": "sms", "count": 1}]
    assert body["from"] == body["to"] == str(today)
    assert http.get("/api/v1/stats", {"mode": "live"}).json()["results"] == []


@pytest.mark.django_db
def test_stats_read_only_the_partitions_of_the_range(service: ApiClient) -> None:
    # Today and the days after it: their partitions are made ahead.
    today = _today()
    days = [today + timedelta(days=n) for n in range(6)]
    _days(*days)
    for day in days:
        _write(service, datetime(day.year, day.month, day.day, 12, tzinfo=UTC), [("email", "sent")], "otp")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifier_delivery, notifier_notification")
    first, last = days[2], days[3]  # two days in the middle of six
    with CaptureQueriesContext(connection) as captured:
        rows = delivery_stats(client=service, first=first, last=last, group_by=["day"])
    assert [r["count"] for r in rows] == [1, 1]
    [query] = captured.captured_queries
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {query['sql']}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    read = set(re.findall(r"(notifier_(?:delivery|notification)_p\d{8})", plan))
    delivery_partitions = {name for name in read if name.startswith("notifier_delivery_")}
    assert delivery_partitions == {partitions.partition_name(partitions.DELIVERY, d) for d in (first, last)}, plan
    # Notifications: the range's days, and at most the minutes next to its edges (a delivery made just after
    # midnight may belong to a notification of the day before); never a day further away.
    allowed = {partitions.partition_name(partitions.NOTIFICATION, d) for d in days[1:5]}
    notification_partitions = read - delivery_partitions
    assert {partitions.partition_name(partitions.NOTIFICATION, d) for d in (first, last)} <= notification_partitions
    assert notification_partitions <= allowed, plan


@pytest.mark.django_db
def test_stats_validate_their_parameters_with_400s_naming_the_field(api: Any, settings: Any) -> None:
    settings.DELIVERY_HOT_DAYS = 14
    today = _today()
    cases = {
        ("from", "2026-13-01"): "from",
        ("to", "yesterday"): "to",
        ("group_by", "day,recipient"): "group_by",
        ("mode", "staging"): "mode",
        ("to", str(today + timedelta(days=1))): "to",
    }
    for (field, value), named in cases.items():
        response = api.get("/api/v1/stats", {field: value})
        assert response.status_code == 400, (field, value)
        assert list(response.json()["error"]["fields"]) == [named], (field, value)
    backwards = api.get("/api/v1/stats", {"from": str(today), "to": str(today - timedelta(days=1))})
    assert backwards.status_code == 400 and list(backwards.json()["error"]["fields"]) == ["from"]
    # Older days than the hot window: a clear 400 saying which days are archived.
    oldest = today - timedelta(days=13)
    archived = api.get("/api/v1/stats", {"from": str(today - timedelta(days=20)), "to": str(today)})
    assert archived.status_code == 400
    error = archived.json()["error"]
    assert error["code"] == "days_archived"
    span = f"{today - timedelta(days=20)} to {oldest - timedelta(days=1)}"
    assert span in error["message"] and f"from={oldest}" in error["message"]
    assert list(error["fields"]) == ["from"]
    one_day = api.get("/api/v1/stats", {"from": str(oldest - timedelta(days=1)), "to": str(oldest - timedelta(days=1))})
    assert f"Days {oldest - timedelta(days=1)} are archived" in one_day.json()["error"]["message"]
    # The window's first day itself is fine.
    assert api.get("/api/v1/stats", {"from": str(oldest)}).status_code == 200


@pytest.mark.django_db
def test_project_scope_counts_every_key_of_the_environment_grouped_by_client(api_client_factory: Any) -> None:
    from projects.services import project_create

    project_create(slug="shop")
    project_create(slug="other")
    orders, (shop, shop_api) = api_client_factory("orders", project="shop"), api_client_factory("shop", project="shop")
    staging, staging_api = api_client_factory("staging", project="shop", mode="test")
    other, _ = api_client_factory("elsewhere", project="other")
    now = timezone.now()
    _write(orders[0], now, [("email", "sent"), ("sms", "failed")], "otp")
    _write(orders[0], now, [("email", "sent")], "welcome")
    _write(shop, now, [("email", "sent")], "otp")
    _write(staging, now, [("email", "sent"), ("email", "sent")], "otp")
    _write(other, now, [("email", "sent")], "otp")

    def results(api: Any, **query: str) -> list[dict[str, Any]]:
        answer = api.get("/api/v1/stats", query)
        assert answer.status_code == 200, answer.content
        return list(answer.json()["results"])

    # Without `scope`: the key's own deliveries, as before (and `client` is not among the default keys).
    assert results(shop_api, group_by="status") == [{"status": "sent", "count": 1}]
    assert all("client" not in row for row in results(shop_api))
    # The project environment: every key of it, by key name; not the test environment's, not another project's.
    assert results(shop_api, scope="project", group_by="client,status") == [
        {"status": "failed", "client": "orders", "count": 1},
        {"status": "sent", "client": "orders", "count": 2},
        {"status": "sent", "client": "shop", "count": 1},
    ]
    assert results(shop_api, scope="project", group_by="client") == [
        {"client": "orders", "count": 3},
        {"client": "shop", "count": 1},
    ]
    assert results(shop_api, scope="project", group_by="template") == [
        {"template": "otp", "count": 3},
        {"template": "welcome", "count": 1},
    ]
    assert results(shop_api, scope="client", group_by="client") == [{"client": "shop", "count": 1}]
    # The test key's project environment is the test one; the mode filter still applies.
    assert results(staging_api, scope="project", group_by="client") == [{"client": "staging", "count": 2}]
    assert results(shop_api, scope="project", mode="test") == []
    bad = shop_api.get("/api/v1/stats", {"scope": "installation"})
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["scope"]
