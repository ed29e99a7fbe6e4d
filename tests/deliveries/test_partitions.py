"""Daily partitions: made ahead, hot queries on one partition, dedup across days, days dropped with work kept."""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from core import progress
from core.db import SPAN_PLANNED_PER_CALL, int_array
from core.redis_guard import get_redis
from notifier.deadletters.models import DeadLetter
from notifier.deliveries import dedup, partitions
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.deliveries.outbox import MARK_PUBLISHED_SQL, mark_published
from notifier.deliveries.partitions import (
    DELIVERY,
    EVENT,
    MAX_SAFE_ID,
    NOTIFICATION,
    day_partitions,
    delivery_id_bounds,
    delivery_id_day,
    partition_name,
    uuid7,
)
from notifier.deliveries.queries import _LOAD_SQL, deliveries_load_for_send
from notifier.deliveries.status import _CLAIM_SQL, deliveries_claim
from notifier.dispatch.models import FanoutLane
from notifier.inbox.selectors import inbox_item_get
from preferences.models import Recipient
from templates_app.services import template_put
from tests.conftest import at_once
from tests.redis_server import delete_namespace_keys

HOT = (NOTIFICATION, DELIVERY, EVENT)
CONTENT = {
    "en": {
        "email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"},
        "inapp": {"title": "Hi {{ name }}", "body": "Hello {{ name }}"},
    }
}


def today() -> date:
    return timezone.now().astimezone(UTC).date()


def touched(sql: str, params: list[Any] | tuple[Any, ...] | dict[str, Any]) -> set[str]:
    """Return the partitions of the hot tables that the plan of `sql` reads or writes."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        name = node.get("Relation Name", "")
        if name.startswith(HOT) and name not in HOT:
            found.add(name)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


def touched_qs(qs: Any) -> set[str]:
    sql, params = qs.query.sql_with_params()
    return touched(sql, params)


def body(**extra: Any) -> dict[str, Any]:
    return {
        "recipient": {"user_id": "u-part"},
        "category": "transactional",
        "template": "welcome",
        "payload": {"name": "Ada"},
        **extra,
    }


@pytest.fixture
def template(db: None) -> None:
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)


@pytest.mark.django_db
def test_partitions_are_made_ahead_named_by_day_and_made_once() -> None:
    """The migration made today and the next PARTITIONS_AHEAD_DAYS days; ensure_partitions adds, never twice."""
    first = today()
    for table in HOT:
        days = day_partitions(table)
        assert [first + timedelta(days=n) for n in range(8)] == [d for d in days if d >= first][:8]
    created = partitions.ensure_partitions(ahead_days=9)
    assert sorted(created) == sorted(partition_name(t, first + timedelta(days=n)) for t in HOT for n in (8, 9))
    assert partitions.ensure_partitions(ahead_days=9) == []
    # Each new delivery partition has the fan-out's unique target index and the parent's hot-path indexes.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = %s", [partition_name(DELIVERY, first + timedelta(9))]
        )
        defs = " ".join(row[0] for row in cursor.fetchall())
    assert "UNIQUE INDEX" in defs and "(notification_id, recipient_id, channel, address)" in defs
    assert "(published_at) WHERE" in defs and "(provider, provider_message_id)" in defs


@pytest.mark.django_db
def test_ids_carry_their_day(api: Any, template: None) -> None:
    """A notification id is a UUIDv7 of its created_at; a delivery id's high bits are its day."""
    Recipient.objects.create(user_id="u-part", email="p@example.com")
    created = api.post("/api/v1/notifications", body(), format="json").json()
    notification = Notification.objects.get(pk=created["id"])
    assert uuid.UUID(created["id"]).version == 7
    assert partitions.uuid7_time(created["id"]) == notification.created_at
    delivery = Delivery.objects.get(pk=created["deliveries"][0]["id"])
    assert delivery_id_day(delivery.pk) == today()
    low, high = delivery_id_bounds(today())
    assert low <= delivery.pk < high


@pytest.mark.django_db
def test_delivery_ids_stay_exact_as_javascript_numbers_until_2149() -> None:
    """Every delivery id the database makes up to 2149-06-06 is at most 2^53 - 1, the last exact JS integer."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT notifier_delivery_id(now()), notifier_delivery_id('2149-06-06T23:59:59Z'),"
            " notifier_delivery_id('2149-06-07T00:00:00Z')"
        )
        now_id, last_id, past_id = cursor.fetchone()
    assert delivery_id_day(now_id) == today() and now_id <= MAX_SAFE_ID
    assert delivery_id_day(last_id) == date(2149, 6, 6) and last_id <= MAX_SAFE_ID
    assert delivery_id_bounds(date(2149, 6, 6))[1] - 1 == MAX_SAFE_ID
    assert past_id > MAX_SAFE_ID


# A UUIDv7 carries 48 bits of milliseconds, up to the year 10889; a datetime reaches 9999-12-31 only.
FAR_FUTURE_IDS = {
    "last-uuid7-time": uuid.UUID(int=((2**48 - 1) << 80) | (0x7 << 76) | (0b10 << 62)),
    "minutes-before-datetime-max": uuid7(datetime(9999, 12, 31, 23, 59, tzinfo=UTC)),
}


@pytest.mark.django_db
@pytest.mark.parametrize("notification_id", FAR_FUTURE_IDS.values(), ids=FAR_FUTURE_IDS.keys())
def test_an_id_from_past_the_partitions_years_is_a_404_read_on_no_partition(api: Any, notification_id: Any) -> None:
    for method, path in (("get", f"/api/v1/notifications/{notification_id}"),
                         ("post", f"/api/v1/notifications/{notification_id}/cancel")):  # fmt: skip
        response = getattr(api, method)(path)
        assert response.status_code == 404, (path, response.content)
        assert response.json()["error"]["code"] == "not_found"
    # The id still bounds its lookup: no day's partition can hold it, so none is read.
    assert touched_qs(Notification.objects.filter(pk=notification_id)) == set()


@pytest.mark.django_db
def test_hot_queries_touch_only_their_day(api: Any, template: None) -> None:
    """Claim, load, outcome write, API read by id, inbox item, callbacks: each plan touches one day's partition."""
    recipient = Recipient.objects.create(user_id="u-part", email="p@example.com")
    created = api.post("/api/v1/notifications", body(channels=["email", "inapp"]), format="json").json()
    ids = [d["id"] for d in created["deliveries"]]
    day = today()
    one_day = {partition_name(DELIVERY, day)}

    # The send path: claim and load by ids, the outcome written back (the UPDATE … FROM json of outcomes.py).
    assert touched(_CLAIM_SQL, {"ids": int_array(ids), "low": min(ids), "high": max(ids), "lease": 60}) == one_day
    assert touched(_LOAD_SQL, [int_array(ids), min(ids), max(ids)]) == one_day
    outcome = (
        "UPDATE notifier_delivery AS d SET status = %s, updated_at = now()"
        " FROM jsonb_array_elements(%s::jsonb) AS e WHERE d.id = (e->>0)::bigint AND d.id BETWEEN %s AND %s"
    )
    assert touched(outcome, ["sent", json.dumps([[i] for i in ids]), min(ids), max(ids)]) == one_day
    assert touched(MARK_PUBLISHED_SQL, [int_array(ids), min(ids), max(ids), min(ids), max(ids)]) == one_day
    assert touched_qs(DeliveryEvent.objects.filter(delivery_id__in=ids)) == {partition_name(EVENT, day)}

    # API reads by id: the notification (its UUIDv7's day) and its deliveries (their ids' day).
    notification = Notification.objects.get(pk=created["id"])
    qs = Notification.objects.filter(client=notification.client_id, pk=created["id"])
    # A lookup by id reads NOTIFICATION_ID_SLACK either side of the id's time: within that of a midnight, the day
    # beside it too, and never any other.
    slack = partitions.NOTIFICATION_ID_SLACK
    days = {(notification.created_at + side).astimezone(UTC).date() for side in (-slack, timedelta(0), slack)}
    assert touched_qs(qs) == {partition_name(NOTIFICATION, d) for d in days}
    deliveries = touched_qs(notification.day_deliveries())
    assert one_day <= deliveries <= {partition_name(DELIVERY, d) for d in days}
    assert touched_qs(Notification.objects.filter(pk__in=[created["id"]])) == {
        partition_name(NOTIFICATION, d) for d in days
    }

    # The inbox's item by id, joined to its notification.
    inapp = next(d["id"] for d in created["deliveries"] if d["channel"] == "inapp")
    from notifier.inbox.selectors import inbox_queryset

    item = inbox_queryset(recipient=recipient).select_related("notification").filter(pk=inapp)
    bounds = partitions.notification_range_of_delivery(inapp)
    assert touched_qs(item.filter(notification__created_at__range=bounds)) == {
        partition_name(DELIVERY, day),
        partition_name(NOTIFICATION, day),
    }
    Delivery.objects.filter(pk=inapp).update(status="sent", sent_at=timezone.now())  # visible once sent
    assert inbox_item_get(recipient=recipient, delivery_id=inapp).pk == inapp

    # Callbacks by provider message id: the recent days only (today and yesterday), never the days ahead.
    from notifier.callbacks.services import provider_message_queries

    recent = touched_qs(provider_message_queries("ses", "m-1", ("id",))[0])
    assert partition_name(DELIVERY, day) in recent
    assert all(partition_name(DELIVERY, day + timedelta(n)) not in recent for n in range(1, 8))
    assert len(recent) <= 2


def _plan_counts(fragment: str) -> int | None:
    """Return how many times this session ran the prepared statement holding `fragment` (None: not prepared)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            [f"%{fragment}%"],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


@pytest.mark.parametrize(
    ("run", "fragment"),
    [
        (lambda ids: deliveries_claim(ids, lease_seconds=60), "FROM target WHERE was = "),
        (mark_published, "SET published_at = now() WHERE id = ANY"),
        (deliveries_load_for_send, "r.id = d.recipient_id WHERE d.id = ANY"),
    ],
    ids=["claim", "mark_published", "load"],
)
def test_ids_spread_wide_are_planned_with_their_values_not_on_the_prepared_plan(
    db: None, run: Any, fragment: str
) -> None:
    """A prepared statement over `id BETWEEN min AND max` reaches the generic plan, which reads the whole span.

    Ids close together (a fan-out page, singles accepted together) keep the prepared statement; ids spread
    over a day (a relay batch, scheduled deliveries woken together) are planned with their values every time
    (core.db.span_prepare): their runs never reach the prepared statement.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT notifier_delivery_id(now())")
        base = int(cursor.fetchone()[0])
    near, far = [base, base + 7], [base, base + SPAN_PLANNED_PER_CALL + 1]
    threshold = connection.connection.prepare_threshold  # DATABASE_PREPARE_THRESHOLD
    assert threshold is not None
    for _ in range(threshold + 1):  # past the threshold: prepared
        run(near)
    runs = _plan_counts(fragment)
    assert runs is not None
    for _ in range(6):
        run(far)
    assert _plan_counts(fragment) == runs  # not one run on the prepared statement
    run(near)
    assert _plan_counts(fragment) == runs + 1  # the counter does count


def _post_all(raw_key: str, payload: dict[str, Any], n: int) -> list[tuple[int, str]]:
    """POST the same body from `n` threads at once; return (status, id) of each."""

    def call() -> tuple[int, str]:
        http = APIClient()
        http.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
        response = http.post("/api/v1/notifications", payload, format="json")
        return response.status_code, response.json().get("id", "")

    return at_once(n, call)


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_requests_across_midnight_make_one_notification(
    api_client_factory: Any, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Half the requests are born before a midnight and half after (two partitions): one notification wins.

    Redis is down, so only the database decides; a partition's own unique index could not have seen the other day.
    """
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    Recipient.objects.create(user_id="u-part", email="p@example.com")
    client, _ = api_client_factory()
    from notifier.accepting import services
    from notifier.clients.services import api_client_rotate_key

    raw_key = api_client_rotate_key(client=client)
    midnight = datetime.combine(today() + timedelta(days=2), datetime.min.time(), tzinfo=UTC)
    lock = threading.Lock()
    turn = {"n": 0}

    def straddling_id() -> uuid.UUID:
        with lock:
            turn["n"] += 1
            side = -1 if turn["n"] % 2 else 1
        return uuid7(midnight + timedelta(milliseconds=side * (1 + turn["n"])))

    monkeypatch.setattr(services, "new_notification_id", straddling_id)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    # Each request in a transaction of its own, as from separate API processes: grouped in one process, the
    # group would settle the key before any row reached a partition (tests/accepting/test_group_commit.py covers that).
    settings.ACCEPT_GROUP_COMMIT = False
    get_redis.cache_clear()
    try:
        results = _post_all(raw_key, body(dedup_key="midnight"), 50)
    finally:
        get_redis.cache_clear()
    assert sorted(code for code, _ in results) == [200] * 49 + [202]
    winners = {notification_id for _, notification_id in results}
    assert len(winners) == 1
    assert Notification.objects.filter(dedup_key="midnight").count() == 1
    # Both sides of the midnight were really tried: ids of both days were handed out.
    assert turn["n"] >= 2
    original = Notification.objects.get(pk=winners.pop())
    assert original.created_at.date() in {midnight.date(), (midnight - timedelta(days=1)).date()}


def _forget_fast_path(settings: Any) -> None:
    """Drop this namespace's Redis keys (the dedup fast path among them), not the shared server's others."""
    delete_namespace_keys(settings.REDIS_URL, settings.REDIS_KEY_PREFIX)


@pytest.mark.django_db
def test_dedup_answers_within_the_window_and_forgets_after(api: Any, template: None, settings: Any) -> None:
    """Within DEDUP_WINDOW_HOURS the original answers (200, or 409 for another body); after it, a new one (202)."""
    Recipient.objects.create(user_id="u-part", email="p@example.com")
    settings.DEDUP_WINDOW_HOURS = 72
    first = api.post("/api/v1/notifications", body(dedup_key="w"), format="json")
    assert first.status_code == 202
    _forget_fast_path(settings)  # the database decides, not the fast path

    def age(hours: float) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE notifier_dedupkey SET created_at = now() - make_interval(hours => %s) WHERE dedup_key = 'w'",
                [hours],
            )

    age(71)
    again = api.post("/api/v1/notifications", body(dedup_key="w"), format="json")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
    assert (
        api.post("/api/v1/notifications", body(dedup_key="w", payload={"name": "X"}), format="json").status_code == 409
    )
    age(73)
    _forget_fast_path(settings)
    later = api.post("/api/v1/notifications", body(dedup_key="w"), format="json")
    assert later.status_code == 202 and later.json()["id"] != first.json()["id"]
    # The key now answers with the new notification; expired keys are purged.
    assert (
        dedup.lookup(client_id=Notification.objects.get(pk=later.json()["id"]).client_id, dedup_keys=["w"])["w"][0]
        == later.json()["id"]
    )
    age(100)
    assert dedup.purge_expired() == 1


# ---- retention by dropping days ------------------------------------------------------------------------


def _row_in_day(day: date, *, status: str, notification_status: str = "done", seq: int) -> Delivery:
    """Make a notification born on `day`, one delivery with that day's id and two events."""
    from notifier.clients.models import ApiClient

    tag = uuid.uuid4().hex[:8]
    client = ApiClient.objects.create(name=f"svc-{tag}", key_prefix=tag, key_hash=uuid.uuid4().hex * 2)
    recipient = Recipient.objects.create(user_id=f"u-{tag}", email=f"{tag}@example.com")
    born = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=12)
    notification = Notification.objects.create(
        id=uuid7(born),
        client=client,
        category="transactional",
        template_key="welcome",
        channels=["email"],
        priority="high",
        recipient=recipient,
        user_id=recipient.user_id,
        status=notification_status,
    )
    delivery = Delivery.objects.create(
        id=delivery_id_bounds(day)[0] + seq,
        notification=notification,
        recipient=recipient,
        channel="email",
        priority="high",
        address=recipient.email,
        status=status,
    )
    for s in ("queued", status):
        DeliveryEvent.objects.create(delivery=delivery, status=s, at=born)
    return delivery


@pytest.fixture
def restore_partitions() -> Iterator[None]:
    """Start from the days the migration makes (others' tests may have left past days behind); make them again."""
    with connection.cursor() as cursor:
        for table in partitions.TABLES:
            for day in partitions.day_partitions(table):
                if day < today():
                    cursor.execute(f'DROP TABLE "{partitions.partition_name(table, day)}"')
    yield
    partitions.ensure_partitions()


@pytest.mark.django_db(transaction=True)
def test_drop_day_archives_then_drops_and_carries_rows_with_work(restore_partitions: None) -> None:
    """A day goes whole after the archive hook ran; deliveries with work (and their notification) stay, same ids."""
    day = today() + timedelta(days=3)
    done = [_row_in_day(day, status="delivered", seq=n) for n in range(1, 4)]
    scheduled = _row_in_day(day, status="scheduled", seq=10)
    dead = _row_in_day(day, status="failed", seq=11)
    DeadLetter.objects.create(delivery=dead, channel="email", queue="email.high", reason="exhausted")
    settled = _row_in_day(day, status="failed", seq=12)
    DeadLetter.objects.create(delivery=settled, channel="email", queue="email.high", reason="x", status="replayed")
    fanning = _row_in_day(day, status="sent", notification_status="fanning_out", seq=13)
    FanoutLane.objects.create(notification_id=done[0].notification_id, lane=0)
    other_day = _row_in_day(day + timedelta(days=1), status="delivered", seq=1)

    seen: list[tuple[date, int]] = []

    def archive(d: date) -> None:
        sql, params = partitions.day_filter(DELIVERY, d)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM notifier_delivery WHERE {sql}", params)
            seen.append((d, cursor.fetchone()[0]))

    result = partitions.drop_day(day, archive=archive)

    assert seen == [(day, 7)]  # the archive read the whole day through the parent, before the drop
    assert sorted(result.dropped) == sorted(partition_name(t, day) for t in HOT)
    assert result.carried == {DELIVERY: 2, EVENT: 4, NOTIFICATION: 3}
    left = set(Delivery.objects.values_list("id", flat=True))
    assert left == {scheduled.pk, dead.pk, other_day.pk}
    assert set(DeliveryEvent.objects.values_list("delivery_id", flat=True)) == left
    assert set(Notification.objects.values_list("id", flat=True)) == {
        scheduled.notification_id,
        dead.notification_id,
        fanning.notification_id,
        other_day.notification_id,
    }
    # Same ids, still found through their day: nothing that travels changed.
    assert Notification.objects.get(pk=scheduled.notification_id).day_deliveries().get().pk == scheduled.pk
    assert set(DeadLetter.objects.values_list("delivery_id", flat=True)) == {dead.pk}
    assert not FanoutLane.objects.exists()
    assert day in day_partitions(DELIVERY)  # the carried partition, small

    # Nothing finished since: a second run leaves the carried day alone (and does not archive it again).
    assert partitions.drop_day(day, archive=archive).dropped == []
    assert len(seen) == 1
    # Once the scheduled delivery is sent and the dead letter resolved, the next run drops the rest.
    Delivery.objects.filter(pk=scheduled.pk).update(status="sent")
    DeadLetter.objects.filter(delivery_id=dead.pk).update(status="discarded")
    Notification.objects.filter(pk=fanning.notification_id).update(status="done")
    partitions.drop_day(day, archive=archive)
    assert set(Delivery.objects.values_list("id", flat=True)) == {other_day.pk}
    assert day not in day_partitions(DELIVERY) and day not in day_partitions(NOTIFICATION)


@pytest.mark.django_db(transaction=True)
def test_days_past_the_hot_window_are_the_ones_dropped(restore_partitions: None, settings: Any) -> None:
    """drop_old_days drops the days older than DELIVERY_HOT_DAYS, oldest first, and keeps the window."""
    settings.DELIVERY_HOT_DAYS = 14
    first = today()
    # Seen from 16 days ahead, the hot window starts 3 days from now: today, +1 and +2 are past it.
    later = first + timedelta(days=16)
    assert partitions.days_to_drop(today=later) == [first, first + timedelta(1), first + timedelta(2)]
    dropped = partitions.drop_old_days(today=later)
    assert [r.day for r in dropped] == [first, first + timedelta(1), first + timedelta(2)]
    assert min(day_partitions(DELIVERY)) == first + timedelta(3)


@pytest.mark.django_db(transaction=True)
def test_dropping_old_days_reports_each_day(restore_partitions: None, settings: Any) -> None:
    """Watched by a command (`partitions --drop-old`), the drop counts its days on the command's stderr."""
    settings.DELIVERY_HOT_DAYS = 14
    out = io.StringIO()
    with progress.reporting(out, tty=False, interval_seconds=0):
        dropped = partitions.drop_old_days(today=today() + timedelta(days=15))
    assert len(dropped) == 2
    lines = out.getvalue().splitlines()
    assert lines[0] == "drop old day partitions: started (2 days)"
    assert lines[1].startswith("drop old day partitions: 1/2 days (50 %)")
    assert lines[2].startswith("drop old day partitions: 2/2 days (100 %)")
    assert lines[3].startswith("drop old day partitions: done, 2 days in ")
