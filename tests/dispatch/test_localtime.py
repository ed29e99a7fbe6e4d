"""The recipient's local time: send_at_local for singles and topics, DST gap and overlap, digests, campaign zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django_celery_beat.models import PeriodicTask

from notifier.campaigns.models import Campaign
from notifier.deliveries.models import Delivery, Notification
from notifier.dispatch import fanout
from notifier.dispatch.digest import digest_flush
from notifier.dispatch.localtime import local_instant
from preferences.models import Recipient
from preferences.services import recipient_upsert, topic_subscribe, topic_upsert
from templates_app.services import template_put
from tests.factories import make_delivery, make_notification

CONTENT = {"en": {"inapp": {"title": "Hi", "body": "Good morning"}}}


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("wall", "zone", "expected"),
    [
        (datetime(2026, 12, 1, 9, 0), "Asia/Tokyo", utc(2026, 12, 1, 0, 0)),  # UTC+9, no DST
        (datetime(2026, 12, 1, 9, 0), "America/New_York", utc(2026, 12, 1, 14, 0)),  # EST, UTC-5
        (datetime(2026, 7, 1, 9, 0), "America/New_York", utc(2026, 7, 1, 13, 0)),  # EDT, UTC-4
        # Gap: 02:30 does not exist on 8 March 2026 in New York; the first valid instant is the jump, 03:00 EDT.
        (datetime(2026, 3, 8, 2, 30), "America/New_York", utc(2026, 3, 8, 7, 0)),
        (datetime(2026, 3, 8, 2, 0), "America/New_York", utc(2026, 3, 8, 7, 0)),
        (datetime(2026, 3, 8, 3, 0), "America/New_York", utc(2026, 3, 8, 7, 0)),
        # Overlap: 01:30 happens twice on 1 November 2026; the first occurrence (EDT) is taken.
        (datetime(2026, 11, 1, 1, 30), "America/New_York", utc(2026, 11, 1, 5, 30)),
        (datetime(2026, 3, 29, 2, 30), "Europe/Berlin", utc(2026, 3, 29, 1, 0)),  # Berlin's gap
        (datetime(2026, 10, 25, 2, 30), "Europe/Berlin", utc(2026, 10, 25, 0, 30)),  # Berlin's overlap: CEST
        (datetime(2026, 12, 1, 9, 0), "", utc(2026, 12, 1, 9, 0)),  # no zone: UTC
        (datetime(2026, 12, 1, 9, 0), "Mars/Olympus", utc(2026, 12, 1, 9, 0)),  # unknown zone: UTC
    ],
)
def test_local_instant(wall: datetime, zone: str, expected: datetime) -> None:
    assert local_instant(wall, zone) == expected


@pytest.fixture
def people(db: None) -> None:
    template_put(key="hello", category="social", default_locale="en", content=CONTENT)
    for user_id, zone in (("tokyo", "Asia/Tokyo"), ("nyc", "America/New_York"), ("nowhere", "")):
        recipient_upsert(user_id=user_id, timezone=zone)


def _send(api: Any, **target: Any) -> Any:
    body = {"template": "hello", "category": "social", "channels": ["inapp"], **target}
    return api.post("/api/v1/notifications", body, format="json")


@pytest.mark.django_db
@pytest.mark.usefixtures("people")
def test_send_at_local_schedules_each_single_in_its_recipients_zone(api: Any) -> None:
    expected = {
        "tokyo": utc(2030, 12, 1, 0, 0),
        "nyc": utc(2030, 12, 1, 14, 0),
        "nowhere": utc(2030, 12, 1, 9, 0),
    }
    for user_id, instant in expected.items():
        response = _send(api, recipient={"user_id": user_id}, send_at_local="2030-12-01T09:00:00")
        assert response.status_code == 202, response.content
        (delivery,) = Delivery.objects.filter(notification_id=response.json()["id"])
        assert (delivery.status, delivery.not_before) == ("scheduled", instant)
        detail = api.get(f"/api/v1/notifications/{response.json()['id']}").json()
        assert detail["send_at_local"] == "2030-12-01T09:00:00"
    # The DST gap over the API: 02:30 on the spring-forward night goes at the jump.
    response = _send(api, recipient={"user_id": "nyc"}, send_at_local="2030-03-10T02:30:00")
    assert Delivery.objects.get(notification_id=response.json()["id"]).not_before == utc(2030, 3, 10, 7, 0)


@pytest.mark.django_db
@pytest.mark.usefixtures("people")
@pytest.mark.parametrize(
    "extra",
    [
        {"send_at_local": "2030-12-01T09:00:00+02:00"},
        {"send_at_local": "tomorrow at nine"},
        {"send_at_local": "2030-12-01T09:00:00", "send_at": "2030-12-01T09:00:00Z"},
    ],
)
def test_bad_send_at_local_is_400(api: Any, extra: dict[str, Any]) -> None:
    response = _send(api, recipient={"user_id": "tokyo"}, **extra)
    assert response.status_code == 400
    assert "send_at_local" in response.json()["error"]["fields"]


@pytest.mark.django_db
@pytest.mark.usefixtures("people")
def test_topic_fanout_sets_each_subscribers_not_before(api: Any) -> None:
    topic, _ = topic_upsert(key="morning", name="Morning")
    topic_subscribe(topic=topic, user_ids=["tokyo", "nyc", "nowhere"])
    response = _send(api, topic="morning", send_at_local="2030-11-03T01:30:00")  # New York's overlap night
    assert response.status_code == 202, response.content
    notification = Notification.objects.get(pk=response.json()["id"])
    for _ in range(10):
        if fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).done:
            break
    rows = dict(Delivery.objects.filter(notification=notification).values_list("recipient__user_id", "not_before"))
    assert rows == {
        "tokyo": utc(2030, 11, 2, 16, 30),
        "nyc": utc(2030, 11, 3, 5, 30),  # the first 01:30 (EDT)
        "nowhere": utc(2030, 11, 3, 1, 30),
    }
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"scheduled"}


@pytest.mark.django_db
@pytest.mark.usefixtures("people")
def test_daily_digest_goes_at_each_recipients_local_hour(django_capture_on_commit_callbacks: Any) -> None:
    from notifier.clients.services import api_client_create

    client, _ = api_client_create(name="digest-svc")
    template_put(key="digest", category="social", default_locale="en", content=CONTENT)
    for user_id in ("tokyo", "nyc"):
        recipient = Recipient.objects.get(user_id=user_id)
        n = make_notification(
            client=client, category="social", template_key="hello", channels=["inapp"], priority="low",
            recipient=recipient, user_id=user_id,
        )  # fmt: skip
        make_delivery(
            notification=n, recipient=recipient, channel="inapp", priority="low", address=user_id,
            status="deferred", reason="digest:daily_digest",
        )  # fmt: skip

    def flush(at: datetime) -> set[str]:
        with django_capture_on_commit_callbacks(execute=False):
            digest_flush(frequency="daily_digest", now=at, local_hour=8)
        return set(Delivery.objects.filter(status="digested").values_list("recipient__user_id", flat=True))

    # A flush takes what was created up to its `now`: the flushes run on a winter day after today (EST, UTC-5).
    at = datetime(datetime.now(UTC).year + 1, 1, 15, tzinfo=UTC)
    assert flush(at + timedelta(hours=8)) == set()  # 08:00 UTC is nobody's 08:00 here
    assert flush(at + timedelta(hours=23)) == {"tokyo"}  # 08:00 of the next day in Tokyo (UTC+9)
    assert flush(at + timedelta(hours=37)) == {"tokyo", "nyc"}  # 08:00 EST of the next day in New York


@pytest.mark.django_db
def test_campaign_crontab_runs_in_its_named_time_zone(api: Any) -> None:
    from tests.dispatch.test_fanout import make_template, make_topic

    make_template()
    make_topic("fans", 1)
    body = {"name": "Morning sale", "template": "spring_sale", "topic": "fans", "payload": {"pct": 20}}
    response = api.post("/api/v1/campaigns", {**body, "crontab": "0 9 * * *", "timezone": "Asia/Tokyo"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["timezone"] == "Asia/Tokyo"
    task = PeriodicTask.objects.get(pk=Campaign.objects.get().periodic_task_id)
    assert (task.crontab.hour, str(task.crontab.timezone)) == ("9", "Asia/Tokyo")
    bad = api.post("/api/v1/campaigns", {**body, "crontab": "0 9 * * *", "timezone": "Mars/Olympus"}, format="json")
    assert bad.status_code == 400 and "timezone" in bad.json()["error"]["fields"]
