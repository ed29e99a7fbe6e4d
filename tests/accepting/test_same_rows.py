"""The same send written four ways leaves the same rows: singles, a group commit, a batch, a topic's fan-out.

A single, a group and a batch share one writer (notifier/accepting/write.py), the fan-out has its own
(`page_deliveries_insert`), and all four share the planning. Per recipient the notification's fields, the deliveries
(channel, address, status, reason, priority, not_before) and their events (status, detail) must be the same,
for recipients that compliance treats every way there is. A fallback chain's deliveries and their events also read
the same through GET /notifications/{id}, whichever path wrote them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from notifier.accepting.services import AcceptRequest, AcceptResult, notifications_accept_group
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.dispatch import fanout
from preferences.models import Recipient
from templates_app.services import template_put
from tests.conftest import purge_all_queues
from tests.factories import make_device, make_recipient, make_subscription, make_suppression, make_topic

pytestmark = pytest.mark.django_db

CONTENT = {
    "en": {
        "email": {"subject": "Sale {{ pct }}%", "text": "Spring sale: {{ pct }}% off"},
        "push": {"title": "Sale", "body": "{{ pct }}% off"},
        "sms": {"text": "Sale {{ pct }}%"},
    }
}
CHANNELS = ["push", "email", "sms"]
USERS = ["plain", "two-devices", "opted-out", "suppressed", "no-phone", "quiet", "digest", "no-sms", "berlin"]
NOTIFICATION_FIELDS = (
    "category", "priority", "template_key", "template_version", "channels", "payload", "locale", "send_at_local",
    "strategy", "fallback_until", "fallback_after_seconds",
)  # fmt: skip


@pytest.fixture
def audience() -> Iterator[str]:
    """Create the template, one recipient per way compliance can treat a delivery, and a topic of them all."""
    purge_all_queues()
    template_put(key="sale", category="marketing", default_locale="en", content=CONTENT)
    now = timezone.now()
    quiet = {"quiet_start": (now - timedelta(hours=2)).time(), "quiet_end": (now + timedelta(hours=2)).time()}
    rules: dict[str, dict[str, Any]] = {
        "opted-out": {"opted_out": True},
        "no-phone": {"phone": ""},
        "quiet": quiet,
        "digest": {"category_prefs": {"marketing": {"frequency": "daily_digest"}}},
        "no-sms": {"channel_prefs": {"sms": False}},
        "berlin": {"timezone": "Europe/Berlin"},
    }
    topic = make_topic(key="sale-news")
    for user in USERS:
        fields = {"email": f"{user}@example.com", "phone": "+4915112345678", **rules.get(user, {})}
        recipient = make_recipient(user_id=user, **fields)
        make_subscription(topic=topic, recipient=recipient)
    two = Recipient.objects.get(user_id="two-devices")
    make_device(recipient=two, token="tok-a")
    make_device(recipient=two, token="tok-b")
    make_suppression(channel="email", address="suppressed@example.com", reason="bounce", source="bounce")
    yield topic.key
    purge_all_queues()  # the topic's pages were published


def _rows(notifications: list[Notification]) -> dict[str, Any]:
    """Return per user the send's fields, and its deliveries with their events, in a comparable form."""
    ids = [n.pk for n in notifications]
    deliveries = list(Delivery.objects.filter(notification_id__in=ids).select_related("recipient", "notification"))
    events: dict[int, list[tuple[str, str]]] = {}
    for event in DeliveryEvent.objects.filter(delivery_id__in=[d.pk for d in deliveries]).order_by("id"):
        events.setdefault(event.delivery_id, []).append((event.status, event.detail))
    # A fallback step's deadline is its wait after the step before it is due: the accept's (or the page's) moment,
    # each path's own, or that step's send time. It is compared as that wait, in whole seconds.
    starts: dict[int, datetime] = {}
    for d in deliveries:
        start = d.not_before if d.status in ("queued", "scheduled", "deferred") and d.not_before else d.created_at
        starts[d.recipient_id] = max(starts.get(d.recipient_id, start), start)
    by_user: dict[str, Any] = {}
    for d in sorted(deliveries, key=lambda d: (d.recipient.user_id, d.channel, d.address)):
        sent = by_user.setdefault(
            d.recipient.user_id, {"notification": [getattr(d.notification, f) for f in NOTIFICATION_FIELDS]}
        )
        due: Any = d.not_before
        if d.status == "pending" and d.not_before is not None:
            due = round((d.not_before - starts[d.recipient_id]).total_seconds())
        row = (d.channel, d.address, d.status, d.reason, d.priority, due, events.get(d.pk, []))
        sent.setdefault("deliveries", []).append(row)
    return by_user


def _items(extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"recipient": {"user_id": u}, "template": "sale", "channels": CHANNELS, "payload": {"pct": 20}, **extra}
        for u in USERS
    ]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"strategy": "fallback", "fallback_after_seconds": 120},
        {"send_at_local": (timezone.now() + timedelta(days=2)).replace(tzinfo=None, microsecond=0).isoformat()},
    ],
    ids=["all", "fallback", "send_at_local"],
)
def test_singles_a_group_a_batch_and_a_topic_write_the_same_rows(
    api: Any, service: Any, audience: str, extra: dict[str, Any]
) -> None:
    items = _items(extra)
    singles = []
    for item in items:
        response = api.post("/api/v1/notifications", item, format="json")
        assert response.status_code == 202, response.content
        singles.append(Notification.objects.get(pk=response.json()["id"]))

    batch = api.post("/api/v1/notifications/batch", {"notifications": items}, format="json")
    assert batch.status_code == 200, batch.content
    assert {r["status"] for r in batch.json()["results"]} == {202}
    batched = list(Notification.objects.filter(pk__in=[r["id"] for r in batch.json()["results"]]))

    validated = [{**item, "category": "marketing"} for item in items]
    group = notifications_accept_group([AcceptRequest(client=service, data=data, trace_id="") for data in validated])
    grouped = [result.notification for result in group if isinstance(result, AcceptResult)]
    assert len(grouped) == len(items), group

    topic_item = {k: v for k, v in items[0].items() if k != "recipient"}
    response = api.post("/api/v1/notifications", {**topic_item, "topic": audience}, format="json")
    assert response.status_code == 202, response.content
    topic = Notification.objects.get(pk=response.json()["id"])
    for _ in range(100):
        run = fanout.fanout_run(notification_id=topic.pk, enqueue_next=False)
        if run.done or run.stopped:
            break
    topic.refresh_from_db()
    assert topic.status == Notification.Status.DONE

    expected = _rows(singles)
    assert set(expected) == set(USERS)
    # Every way of treating a delivery is among them (else the comparison proves less than it says).
    statuses = {(row[2], row[3]) for sent in expected.values() for row in sent["deliveries"]}
    assert {("suppressed", "opted_out"), ("suppressed", "suppressed"), ("suppressed", "no_address")} <= statuses
    assert {("suppressed", "channel_disabled"), ("deferred", "digest:daily_digest")} <= statuses
    for path, notifications in (("batch", batched), ("group", grouped), ("topic", [topic])):
        rows = _rows(notifications)
        assert set(rows) == set(USERS), path
        for user in USERS:
            assert rows[user]["notification"] == expected[user]["notification"], (path, user)
            assert rows[user]["deliveries"] == expected[user]["deliveries"], (path, user)


def _read(api: Any, notification_id: Any) -> list[tuple[str, str, str, list[tuple[str, str]]]]:
    """Return a notification's deliveries as GET /notifications/{id} shows them: channel, status, reason, events."""
    response = api.get(f"/api/v1/notifications/{notification_id}")
    assert response.status_code == 200, response.content
    return sorted(
        (d["channel"], d["status"], d["reason"], [(e["status"], e["detail"]) for e in d["events"]])
        for d in response.json()["deliveries"]
    )


# What the API shows of the step a chain starts at, per recipient: past a push without a device, past an email on
# the suppression list too; a recipient with devices starts at push and needs no explanation.
START_EVENTS = {
    "plain": ("email", ("queued", "fallback: push suppressed (no_address)")),
    "suppressed": ("sms", ("queued", "fallback: email suppressed (suppressed), push suppressed (no_address)")),
    "two-devices": ("push", None),
}


@pytest.mark.parametrize("user", sorted(START_EVENTS))
def test_a_fallback_chain_reads_the_same_through_the_api_from_a_single_a_batch_a_group_and_a_topic(
    api: Any, service: Any, audience: str, user: str
) -> None:
    item = {
        "recipient": {"user_id": user}, "template": "sale", "channels": CHANNELS, "payload": {"pct": 20},
        "strategy": "fallback", "fallback_after_seconds": 120,
    }  # fmt: skip
    single = api.post("/api/v1/notifications", item, format="json")
    assert single.status_code == 202, single.content
    batch = api.post("/api/v1/notifications/batch", {"notifications": [item]}, format="json")
    assert batch.status_code == 200, batch.content
    assert batch.json()["results"][0]["status"] == 202, batch.content
    (grouped,) = notifications_accept_group(
        [AcceptRequest(client=service, data={**item, "category": "marketing"}, trace_id="")]
    )
    assert isinstance(grouped, AcceptResult), grouped
    # A topic of this recipient alone: the notification's deliveries are all theirs.
    topic = make_topic(key=f"sale-{user}")
    make_subscription(topic=topic, recipient=Recipient.objects.get(user_id=user))
    to_topic = {k: v for k, v in item.items() if k != "recipient"} | {"topic": topic.key}
    sent = api.post("/api/v1/notifications", to_topic, format="json")
    assert sent.status_code == 202, sent.content
    for _ in range(10):
        run = fanout.fanout_run(notification_id=sent.json()["id"], enqueue_next=False)
        if run.done or run.stopped:
            break

    expected = _read(api, single.json()["id"])
    channel, event = START_EVENTS[user]
    assert {d[0] for d in expected if d[1] == "queued"} == {channel}, expected
    explained = [e for d in expected for e in d[3] if e[1].startswith("fallback: ")]
    assert explained == ([event] if event else []), expected
    for path, notification_id in (
        ("batch", batch.json()["results"][0]["id"]),
        ("group", grouped.notification.pk),
        ("topic", sent.json()["id"]),
    ):
        assert _read(api, notification_id) == expected, path


def test_a_chat_address_and_topics_in_one_batch_are_written_as_each_alone(api: Any, audience: str) -> None:
    template_put(
        key="deploy", category="transactional", default_locale="en",
        content={"en": {"chat": {"text": "Deploy {{ v }}"}, "email": {"subject": "Deploy", "text": "{{ v }}"}}},
    )  # fmt: skip
    items = [
        {"recipient": {"chat": {"slack": "#ops"}}, "template": "deploy", "payload": {"v": "1"}},
        {"topic": audience, "template": "sale", "channels": ["email"], "payload": {"pct": 5}},
        {"topic": "no-such-topic", "template": "sale", "payload": {"pct": 5}},
        {"recipient": {"user_id": "plain"}, "template": "deploy", "channels": ["email"], "payload": {"v": "1"}},
    ]
    alone = [api.post("/api/v1/notifications", item, format="json") for item in items]
    assert [r.status_code for r in alone] == [202, 202, 400, 202], [r.content for r in alone]
    batch = api.post("/api/v1/notifications/batch", {"notifications": items}, format="json")
    assert batch.status_code == 200, batch.content
    results = batch.json()["results"]
    assert [r["status"] for r in results] == [202, 202, 400, 202], results
    assert results[2]["error"] == alone[2].json()["error"]  # the unknown topic fails alone, with the same error

    def written(notification_id: str) -> tuple[Any, ...]:
        n = Notification.objects.get(pk=notification_id)
        rows = sorted(Delivery.objects.filter(notification_id=n.pk).values_list("channel", "address", "status"))
        return (n.status, n.topic_id, n.user_id, n.recipient.user_id if n.recipient else None, n.channels, rows)

    for index in (0, 1, 3):
        assert written(results[index]["id"]) == written(alone[index].json()["id"]), items[index]
    assert written(results[0]["id"])[5] == [("slack", "#ops", "queued")]
    assert written(results[1]["id"])[0] == Notification.Status.FANNING_OUT
