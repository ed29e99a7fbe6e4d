"""Campaigns: API, scheduling through django-celery-beat, one run per slot, pacing, pause/resume/cancel."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import include, path
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from channels_app.models import SandboxMessage
from config.urls import urlpatterns as root_urlpatterns
from notifier.campaigns.models import Campaign
from notifier.campaigns.services import campaign_create, campaign_run
from notifier.campaigns.status import campaign_fanout_finished
from notifier.campaigns.tasks import run_campaign
from notifier.deliveries.models import Delivery, Notification
from notifier.dispatch import fanout
from tests.conftest import purge_all_queues, wait_for
from tests.dispatch.test_fanout import make_template, make_topic

# The campaign API under /api/v1/ as notifier/urls.py mounts it, then the rest of the project's URLs.
urlpatterns = [path("api/v1/", include("notifier.campaigns.urls")), *root_urlpatterns]
pytestmark = pytest.mark.urls("tests.campaigns.test_campaigns")

URL = "/api/v1/campaigns"


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    purge_all_queues()
    yield
    purge_all_queues()


def body(**extra: Any) -> dict[str, Any]:
    return {"name": "Spring", "template": "spring_sale", "topic": "fans", "payload": {"pct": 20}, **extra}


def api_user(api: Any) -> Any:
    """Return the ApiClient behind the DRF test client (the only one in the test)."""
    from notifier.clients.models import ApiClient

    return ApiClient.objects.get()


@pytest.mark.django_db(transaction=True)
def test_create_a_clocked_campaign_over_the_api(api: Any) -> None:
    make_template()
    make_topic("fans", 3)
    send_at = timezone.now() + timedelta(hours=2)

    response = api.post(URL, body(send_at=send_at.isoformat(), rate_per_second=50, channels=["email"]), format="json")

    assert response.status_code == 201, response.content
    created = response.json()
    assert created["status"] == "scheduled" and created["rate_per_second"] == 50
    assert created["progress"]["targeted"] == 0 and created["runs"] == []
    campaign = Campaign.objects.get(pk=created["id"])
    task = PeriodicTask.objects.get(pk=campaign.periodic_task_id)
    assert task.task == "notifier.tasks.run_campaign" and task.args == f"[{campaign.pk}]"
    assert task.queue == "maintenance" and task.one_off and task.enabled
    assert task.clocked.clocked_time == send_at and task.crontab is None
    assert api.get(f"{URL}/{campaign.pk}").json()["name"] == "Spring"
    assert Notification.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_recurring_campaign_gets_a_crontab_schedule_and_bad_input_is_400(api: Any) -> None:
    make_template()
    make_topic("fans", 1)
    response = api.post(URL, body(crontab="30 9 * * mon-fri"), format="json")
    assert response.status_code == 201, response.content
    task = PeriodicTask.objects.get(pk=Campaign.objects.get().periodic_task_id)
    cron = task.crontab
    assert (cron.minute, cron.hour, cron.day_of_week, str(cron.timezone)) == ("30", "9", "mon-fri", "UTC")
    assert task.clocked is None and not task.one_off

    for bad, field in (
        (body(crontab="61 * * * *"), "crontab"),
        (body(crontab="* * *"), "crontab"),
        (body(crontab="0 9 * * *", send_at=timezone.now().isoformat()), "send_at"),
        (body(topic="nope"), "topic"),
        (body(template="missing"), "template"),
        (body(channels=["sms", "webhook"]), "channels"),
        (body(rate_per_second=0), "rate_per_second"),
        (body(colour="red"), "colour"),
        (body(payload={"pct": "2\u00000"}), "payload"),
    ):
        answer = api.post(URL, bad, format="json")
        assert answer.status_code == 400, (bad, answer.content)
        assert field in answer.json()["error"]["fields"], answer.content
    assert Campaign.objects.count() == 1
    assert api.get(f"{URL}/999999").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_two_beats_firing_a_clocked_campaign_run_it_once(api: Any) -> None:
    make_template()
    make_topic("fans", 5)
    campaign = campaign_create(
        client=api_user(api), name="Once", template="spring_sale", topic="fans", payload={"pct": 5},
        send_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip

    first = run_campaign(campaign.pk)
    second = run_campaign(campaign.pk)

    assert first is not None and second is None
    notification = Notification.objects.get(campaign=campaign)
    assert str(notification.pk) == first
    assert notification.priority == "low" and notification.status == "fanning_out" and notification.topic.key == "fans"
    assert notification.dedup_key == f"campaign-{campaign.pk}-once"
    campaign.refresh_from_db()
    assert campaign.status == "running" and campaign.last_run_at is not None


@pytest.mark.django_db(transaction=True)
def test_concurrent_firings_run_once(api: Any) -> None:
    make_template()
    make_topic("fans", 5)
    campaign = campaign_create(
        client=api_user(api), name="Race", template="spring_sale", topic="fans", payload={"pct": 5},
        send_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    results: list[Any] = []
    barrier = threading.Barrier(4)

    def fire() -> None:
        barrier.wait()
        try:
            results.append(campaign_run(campaign_id=campaign.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=fire) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([r for r in results if r is not None]) == 1
    assert Notification.objects.filter(campaign=campaign).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_recurring_campaign_runs_once_per_slot(api: Any) -> None:
    make_template()
    make_topic("fans", 2)
    campaign = campaign_create(
        client=api_user(api), name="Daily", template="spring_sale", topic="fans", payload={"pct": 5},
        crontab="0 9 * * *",
    )  # fmt: skip
    nine = timezone.now().replace(hour=9, minute=0, second=0, microsecond=0)

    assert campaign_run(campaign_id=campaign.pk, now=nine) is not None
    assert campaign_run(campaign_id=campaign.pk, now=nine + timedelta(seconds=2)) is None  # second beat
    campaign_fanout_finished(campaign_id=campaign.pk)
    assert Campaign.objects.get(pk=campaign.pk).status == "scheduled"
    assert campaign_run(campaign_id=campaign.pk, now=nine + timedelta(seconds=3)) is None  # same slot, late beat
    assert campaign_run(campaign_id=campaign.pk, now=nine + timedelta(days=1)) is not None
    keys = sorted(str(k) for k in Notification.objects.filter(campaign=campaign).values_list("dedup_key", flat=True))
    assert len(keys) == 2 and keys[0] != keys[1]


@pytest.mark.django_db(transaction=True)
def test_the_fanout_of_a_campaign_is_paced_at_its_rate(api: Any, settings: Any) -> None:
    make_template()
    make_topic("fans", 50)
    settings.FANOUT_PACE_WINDOW_SECONDS = 10
    campaign = campaign_create(
        client=api_user(api), name="Slow", template="spring_sale", topic="fans", payload={"pct": 5},
        channels=["email"], rate_per_second=2, send_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    notification = campaign_run(campaign_id=campaign.pk)
    assert notification is not None
    purge_all_queues()

    result = fanout.fanout_run(notification_id=notification.pk, enqueue_next=False)

    # 2/s for 10 s: a page of 20 subscribers, whose sends span 10 s; the next run comes when they are due.
    assert result.pages == 1 and result.subscribers == 20 and result.published == 20
    assert result.next_in == 10.0
    from tests.conftest import queue_depth

    assert queue_depth("email.low") == 1  # the first second's message; the other nine wait in the broker


@pytest.mark.django_db(transaction=True)
def test_pause_holds_resume_releases_cancel_cancels(api: Any, settings: Any) -> None:
    make_template()
    make_topic("fans", 50)
    settings.FANOUT_PACE_WINDOW_SECONDS = 10
    created = api.post(
        URL, body(channels=["email"], rate_per_second=2, send_at=(timezone.now() + timedelta(hours=1)).isoformat()),
        format="json",
    ).json()  # fmt: skip
    campaign_id = created["id"]
    notification = campaign_run(campaign_id=campaign_id)
    assert notification is not None
    fanout.fanout_page(notification_id=notification.pk)
    first_page = list(Delivery.objects.filter(notification=notification).values_list("pk", flat=True))
    assert len(first_page) == 20

    paused = api.post(f"{URL}/{campaign_id}/pause")
    assert paused.status_code == 200, paused.content
    assert paused.json()["status"] == "paused" and paused.json()["affected_deliveries"] == 20
    held = Delivery.objects.filter(notification=notification)
    assert {(d.status, d.reason) for d in held} == {("deferred", "campaign_paused")}
    assert all(d.not_before is not None and d.not_before > timezone.now() + timedelta(days=365) for d in held)
    assert fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).stopped == "paused"
    assert not PeriodicTask.objects.get(pk=Campaign.objects.get(pk=campaign_id).periodic_task_id).enabled
    assert api.post(f"{URL}/{campaign_id}/pause").status_code == 409

    purge_all_queues()
    resumed = api.post(f"{URL}/{campaign_id}/resume")
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["status"] == "running" and resumed.json()["affected_deliveries"] == 20
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"queued"}
    assert not Delivery.objects.filter(notification=notification, published_at__isnull=True).exists()
    from tests.conftest import queue_depth

    assert queue_depth("fanout") == 0  # the fan-out resumes after the released deliveries' share of the rate
    next_page = fanout.fanout_page(notification_id=notification.pk)
    assert next_page.subscribers == 20

    cancelled = api.post(f"{URL}/{campaign_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["affected_deliveries"] == 40
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"cancelled"}
    assert Notification.objects.get(pk=notification.pk).status == "cancelled"
    assert fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).stopped == "cancelled"
    assert Delivery.objects.filter(notification=notification).count() == 40
    progress = api.get(f"{URL}/{campaign_id}").json()["progress"]
    assert progress["targeted"] == 40 and progress["cancelled"] == 40 and progress["sent"] == 0
    assert api.post(f"{URL}/{campaign_id}/cancel").status_code == 409
    assert api.post(f"{URL}/{campaign_id}/explode").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_progress_counts_the_deliveries_of_every_run(api: Any) -> None:
    make_template()
    topic = make_topic("fans", 10)
    from preferences.models import Recipient

    Recipient.objects.filter(subscriptions__topic=topic).order_by("id").first()
    Recipient.objects.filter(user_id__in=["t-1", "t-2"]).update(opted_out=True)
    campaign = campaign_create(
        client=api_user(api), name="P", template="spring_sale", topic="fans", payload={"pct": 5},
        channels=["email"], rate_per_second=1000, send_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    notification = campaign_run(campaign_id=campaign.pk)
    assert notification is not None
    while not fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).done:
        pass
    ids = list(Delivery.objects.filter(notification=notification, status="queued").values_list("pk", flat=True))
    Delivery.objects.filter(pk__in=ids[:5]).update(status="sent")
    Delivery.objects.filter(pk__in=ids[5:6]).update(status="failed")

    detail = api.get(f"{URL}/{campaign.pk}").json()

    assert detail["status"] == "done"
    assert {k: detail["progress"][k] for k in ("targeted", "sent", "failed", "suppressed", "pending")} == {
        "targeted": 10,
        "sent": 5,
        "failed": 1,
        "suppressed": 2,
        "pending": 2,
    }
    assert detail["runs"][0]["recipients_total"] == 10


BEAT = ["celery", "-A", "config", "beat", "--loglevel", "INFO", "-S", "django_celery_beat.schedulers:DatabaseScheduler",
        "--max-interval", "1", "--pidfile", ""]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_two_real_beat_processes_send_a_clocked_campaign_once(api: Any, start_worker: Any, start_process: Any) -> None:
    make_template()
    make_topic("fans", 30)
    start_worker(
        queues=["maintenance", "fanout", "email.low"],
    )
    beats = [start_process("beat", BEAT), start_process("beat", BEAT)]
    try:
        campaign = campaign_create(
            client=api_user(api), name="Beat", template="spring_sale", topic="fans", payload={"pct": 5},
            channels=["email"], rate_per_second=1000, send_at=timezone.now() + timedelta(seconds=4),
        )  # fmt: skip
        wait_for(lambda: Delivery.objects.filter(status="sent").count() == 30, timeout=90, interval=0.5)
        fired = [b for b in beats if "run_campaign" in b.log_path.read_text()]
        assert fired, "a beat process must have fired the campaign"
        # django-celery-beat disables a one-off entry once fired, so the other beat usually skips it: fire it
        # as that second beat would have, late.
        assert run_campaign(campaign.pk) is None
        time.sleep(2)
    finally:
        for beat in beats:
            beat.stop()
    assert Notification.objects.filter(campaign=campaign).count() == 1
    assert SandboxMessage.objects.count() == 30
    assert Campaign.objects.get(pk=campaign.pk).status == "done"


@pytest.mark.django_db(transaction=True)
def test_a_campaign_at_the_recipients_local_time_sets_each_subscribers_not_before(api: Any) -> None:
    from datetime import UTC, datetime

    from notifier.campaigns.services import campaign_pause, campaign_resume
    from preferences.services import recipient_upsert, topic_subscribe

    make_template()
    topic = make_topic("fans", 0)
    for user_id, zone in (("tokyo", "Asia/Tokyo"), ("nyc", "America/New_York"), ("nowhere", "")):
        recipient_upsert(user_id=user_id, email=f"{user_id}@example.com", timezone=zone)
    topic_subscribe(topic=topic, user_ids=["tokyo", "nyc", "nowhere"])
    wall = "2030-11-03T01:30:00"  # New York's overlap night
    response = api.post(
        URL, body(send_at_local=wall, timezone="Europe/Berlin", channels=["email"]), format="json"
    )  # fmt: skip
    assert response.status_code == 201, response.content
    assert response.json()["send_at_local"] == wall and response.json()["send_at"] is None
    campaign = Campaign.objects.get(pk=response.json()["id"])
    # The run starts when the earliest zone (UTC+14) reaches 01:30: before any subscriber's moment.
    task = PeriodicTask.objects.get(pk=campaign.periodic_task_id)
    assert task.clocked.clocked_time == datetime(2030, 11, 2, 11, 30, tzinfo=UTC)

    notification_id = run_campaign(campaign.pk)
    notification = Notification.objects.get(pk=notification_id)
    assert notification.send_at_local == wall and notification.send_at is None
    for _ in range(10):
        if fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).done:
            break
    expected = {
        "tokyo": datetime(2030, 11, 2, 16, 30, tzinfo=UTC),
        "nyc": datetime(2030, 11, 3, 5, 30, tzinfo=UTC),  # the first 01:30 (EDT)
        "nowhere": datetime(2030, 11, 3, 0, 30, tzinfo=UTC),  # no zone of their own: the campaign's, Berlin (CET)
    }

    def planned() -> dict[str, Any]:
        rows = Delivery.objects.filter(notification=notification).values_list("recipient__user_id", "not_before")
        return dict(rows)

    assert planned() == expected
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"scheduled"}
    campaign.refresh_from_db()
    assert campaign.status == "done"  # the fan-out is done; the deliveries wait for their moment

    # Still pausable while its deliveries wait; resuming gives each its subscriber's moment back.
    assert campaign_pause(campaign=campaign) == 3
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"deferred"}
    assert campaign_resume(campaign=campaign) == 3
    assert planned() == expected
    assert set(Delivery.objects.filter(notification=notification).values_list("status", flat=True)) == {"scheduled"}
    assert Campaign.objects.get(pk=campaign.pk).status == "done"


@pytest.mark.django_db(transaction=True)
def test_bad_send_at_local_of_a_campaign_is_400(api: Any) -> None:
    make_template()
    make_topic("fans", 1)
    for bad in (
        body(send_at_local="2030-12-01T09:00:00+01:00"),
        body(send_at_local="tomorrow at nine"),
        body(send_at_local="2030-12-01T09:00:00", send_at=timezone.now().isoformat()),
        body(send_at_local="2030-12-01T09:00:00", crontab="0 9 * * *"),
    ):
        answer = api.post(URL, bad, format="json")
        assert answer.status_code == 400, (bad, answer.content)
        assert "send_at_local" in answer.json()["error"]["fields"], answer.content
    assert Campaign.objects.count() == 0
