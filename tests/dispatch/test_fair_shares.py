"""Fair shares of a throttled queue: a broadcast never holds another project's notifications for long.

Measured at the broker (the ids ready in `email.low`) and in the database (deliveries per broadcast), with the
sandbox provider limited to a small rate by configuration, so that a room is a few dozen deliveries.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from channels_app.models import SandboxMessage
from notifier.accepting.services import notification_accept
from notifier.campaigns.models import Campaign
from notifier.campaigns.services import (
    campaign_cancel,
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_run,
)
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery, Notification
from notifier.dispatch import fanout, shares
from projects.models import Project
from projects.scoping import owner_scope
from projects.services import project_create
from templates_app.services import template_put
from tests import factories
from tests.conftest import purge_all_queues, wait_for
from tests.dispatch.test_fanout import CONTENT, drain_ids

RATE = 100  # the sandbox's deliveries per second in these tests
HORIZON = 1.0  # so a queue holds at most 100 broadcast deliveries


@pytest.fixture
def throttled(settings: Any) -> None:
    """Limit the sandbox (every channel's provider) to RATE a second, and start from idle queues."""
    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": RATE, "burst": RATE}}
    settings.FAIR_HORIZON_SECONDS = HORIZON
    purge_all_queues()
    shares.reset(["email.low", "sms.low"])


def project_client(slug: str, *, weight: int = 1) -> ApiClient:
    """Create a project of that weight and a live API client of it, with the template its broadcasts use."""
    project_create(slug=slug, name=slug)
    Project.objects.filter(slug=slug).update(weight=weight)
    client = api_client_create(name=f"svc-{slug}", project=slug)[0]
    with owner_scope(client.environment_id):
        template_put(key="spring_sale", category="marketing", default_locale="en", content=CONTENT)
        template_put(key="news", category="social", default_locale="en", content=CONTENT)
    return client


def project_topic(client: ApiClient, key: str, n: int) -> None:
    """Give the client's environment a topic `key` of `n` subscribers with an email address."""
    with owner_scope(client.environment_id):
        topic = factories.make_topic(key=key, name=key)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO preferences_recipient (environment_id, user_id, email, phone, locale, timezone, webhook_url, "
            "opted_out, channel_prefs, category_prefs, created_at, updated_at) "
            "SELECT %s, %s || g, %s || g || '@example.com', '', '', '', '', false, '{}', '{}', now(), now() "
            "FROM generate_series(1, %s) g",
            [client.environment_id, f"{key}-", f"{key}-", n],
        )
        cursor.execute(
            "INSERT INTO preferences_subscription (topic_id, recipient_id, created_at) "
            "SELECT %s, id, now() FROM preferences_recipient WHERE environment_id = %s AND user_id LIKE %s ORDER BY id",
            [topic.pk, client.environment_id, f"{key}-%"],
        )


def broadcast(client: ApiClient, topic: str) -> Notification:
    data = {"topic": topic, "template": "news", "channels": ["email"], "payload": {"pct": 1}}
    return notification_accept(client=client, data=data).notification


def fed(notification: Notification) -> int:
    return Delivery.objects.filter(notification=notification).count()


def fair_metrics(api: Any) -> dict[tuple[str, str], float]:
    """Return the /metrics samples of the fair shares by (name, project) for email.low."""
    text = api.get("/metrics").content.decode()
    return {
        (sample.name, sample.labels["project"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("notifier_fair_") and sample.labels.get("queue") == "email.low"
    }


def single_position(client: ApiClient, user_id: str) -> int:
    """Send the client's recipient `user_id` a single; return how many ids are ahead of it in `email.low`."""
    with owner_scope(client.environment_id):
        factories.make_recipient(user_id=user_id, email=f"{user_id}@example.com")
    single = notification_accept(
        client=client,
        data={"recipient": {"user_id": user_id}, "template": "news", "channels": ["email"], "payload": {"pct": 1}},
    ).notification
    mine = Delivery.objects.get(notification=single).pk
    ready: list[int] = []

    def arrived() -> bool:
        ready.extend(drain_ids("email.low"))
        return mine in ready

    wait_for(arrived, timeout=10, interval=0.1)
    return ready.index(mine)


@pytest.mark.django_db(transaction=True)
def test_a_single_waits_behind_a_room_of_another_projects_broadcast_at_most(throttled: None, api: Any) -> None:
    a, b = project_client("proj-a"), project_client("proj-b")
    project_topic(a, "everyone", 1000)
    big = broadcast(a, "everyone")

    started = time.monotonic()
    first = fanout.fanout_run(notification_id=big.pk, enqueue_next=False)
    # The broadcast fed one room's worth (and what drained while it ran) and stopped: the rest waits in
    # PostgreSQL as subscribers not yet paged.
    assert 0 < first.published <= RATE * (HORIZON + time.monotonic() - started)
    assert first.next_in is not None and not first.done and fed(big) < 1000
    # Operators see the project's backlog, its share and what it fed.
    seen = fair_metrics(api)
    assert seen[("notifier_fair_backlog", "proj-a")] == 1000 - fed(big)
    assert seen[("notifier_fair_share", "proj-a")] == 1.0
    assert seen[("notifier_fair_fed_total", "proj-a")] == fed(big)

    # B's single is behind no more of A's broadcast than the room (and a page fed while it was accepted).
    ahead = single_position(b, "b-1")
    assert ahead <= 2 * RATE * HORIZON, ahead
    assert Delivery.objects.filter(notification=big).count() < 1000


@pytest.mark.django_db(transaction=True)
def test_three_broadcasts_share_a_queue_by_their_projects_weights(throttled: None, settings: Any) -> None:
    settings.FANOUT_PAGE_SIZE = 20
    flows = []
    for slug, weight in (("one", 1), ("two", 1), ("heavy", 2)):
        client = project_client(slug, weight=weight)
        project_topic(client, f"{slug}-all", 2000)
        flows.append(broadcast(client, f"{slug}-all"))

    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        for n in flows:
            fanout.fanout_page(notification_id=n.pk)
        purge_all_queues()  # nobody sends here: the level drains at the provider's rate by itself
        time.sleep(0.05)
    one, two, heavy = (fed(n) for n in flows)
    assert min(one, two, heavy) > 0 and max(one, two, heavy) < 2000, (one, two, heavy)
    # Turns by weight: the heavy project got about twice each light one's, the light ones about as much.
    assert 1.4 <= heavy / one <= 2.6 and 1.4 <= heavy / two <= 2.6, (one, two, heavy)
    assert 0.7 <= one / two <= 1.4, (one, two, heavy)
    # And together no more than the provider's rate over the time, plus one room.
    assert one + two + heavy <= RATE * 8 + RATE * HORIZON + 3 * 20


@pytest.mark.django_db(transaction=True)
def test_a_broadcast_of_a_project_does_not_hold_its_own_singles(throttled: None) -> None:
    a = project_client("proj-a")
    project_topic(a, "everyone", 600)
    big = broadcast(a, "everyone")
    fanout.fanout_run(notification_id=big.pk, enqueue_next=False)
    assert single_position(a, "a-own") <= 2 * RATE * HORIZON and fed(big) < 600


@pytest.mark.django_db(transaction=True)
def test_an_unthrottled_queue_is_fed_as_before(settings: Any) -> None:
    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": None}}
    purge_all_queues()
    a = project_client("proj-a")
    project_topic(a, "everyone", 300)
    big = broadcast(a, "everyone")
    result = fanout.fanout_run(notification_id=big.pk, enqueue_next=False)
    assert result.done and len(drain_ids("email.low")) == 300


@pytest.mark.django_db(transaction=True)
def test_pause_and_cancel_of_a_campaign_partly_fed(throttled: None) -> None:
    a = project_client("proj-a")
    project_topic(a, "fans", 500)
    campaign = campaign_create(
        client=a,
        name="Spring",
        template="spring_sale",
        topic="fans",
        channels=["email"],
        payload={"pct": 5},
        rate_per_second=10_000,
    )
    notification = campaign_run(campaign_id=campaign.pk)
    assert notification is not None
    fanout.fanout_run(notification_id=notification.pk, enqueue_next=False)
    in_broker = fed(notification)
    assert 0 < in_broker <= RATE * HORIZON

    campaign_pause(campaign=Campaign.objects.get(pk=campaign.pk))
    # Paused: what was fed is held in PostgreSQL, the rest is not paged at all.
    assert fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).stopped == "paused"
    assert fed(notification) == in_broker
    assert Delivery.objects.filter(notification=notification, status="deferred").count() == in_broker

    campaign_resume(campaign=Campaign.objects.get(pk=campaign.pk))
    time.sleep(HORIZON)
    fanout.fanout_run(notification_id=notification.pk, enqueue_next=False)
    after_resume = fed(notification)
    assert in_broker < after_resume < 500

    campaign_cancel(campaign=Campaign.objects.get(pk=campaign.pk))
    assert fanout.fanout_run(notification_id=notification.pk, enqueue_next=False).stopped == "cancelled"
    assert fed(notification) == after_resume  # nobody else is paged after the cancel
    statuses = Counter(Delivery.objects.filter(notification=notification).values_list("status", flat=True))
    assert set(statuses) == {"cancelled"}, statuses


@pytest.mark.django_db(transaction=True)
def test_a_killed_fanout_worker_loses_nothing_and_feeds_nothing_twice(throttled: None, start_worker: Any) -> None:
    total = 1500
    a = project_client("proj-a")
    project_topic(a, "everyone", total)
    env = {
        "PROVIDER_RATE_LIMITS": f'{{"sandbox": {{"rate": {RATE * 5}, "burst": {RATE * 5}}}}}',
        "FAIR_HORIZON_SECONDS": str(HORIZON),
        "FANOUT_LANES": "2",
        "FANOUT_LANE_MIN_SUBSCRIBERS": "1",
        "FANOUT_RUN_SECONDS": "1",
    }
    first = start_worker(queues=["fanout"], env=env, concurrency=2)
    # The senders drain email.low at the provider's rate, so the fan-out keeps feeding room as it appears.
    start_worker(queues=["email.low"], env=env, concurrency=2)
    notification = broadcast(a, "everyone")
    wait_for(lambda: fed(notification) >= 600, timeout=60, interval=0.05)
    first.kill(signal.SIGKILL)
    first.proc.wait(timeout=10)
    at_kill = fed(notification)
    assert at_kill < total, "the worker must die while the broadcast is partly fed"

    start_worker(queues=["fanout"], env=env, concurrency=2)
    wait_for(lambda: Notification.objects.filter(pk=notification.pk, status="done").exists(), timeout=120)
    per_recipient = Counter(Delivery.objects.filter(notification=notification).values_list("recipient_id", flat=True))
    assert len(per_recipient) == total and set(per_recipient.values()) == {1}
    wait_for(lambda: Delivery.objects.filter(notification=notification, status="sent").count() == total, timeout=120)
    sent_to = Counter(SandboxMessage.objects.filter(address__startswith="everyone-").values_list("address", flat=True))
    assert len(sent_to) == total and set(sent_to.values()) == {1}
