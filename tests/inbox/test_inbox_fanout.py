"""A topic's in-app message stored by the fan-out itself: compliance applied, nothing twice, events and NOTIFY sent."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.utils import timezone

from notifier.accepting.services import notification_accept
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries import frequency
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.dispatch import fanout
from notifier.dispatch.models import FanoutLane
from notifier.inbox import fanout as inbox_fanout
from notifier.inbox.stream import _conninfo
from notifier.inbox.tokens import inbox_token_mint
from notifier.statusevents.models import StatusEvent
from notifier.statusevents.record import INBOX_CHANNEL
from preferences.models import Recipient
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.deliveries.test_frequency_cap import _categories
from tests.dispatch.test_fanout import make_topic, run_to_end
from tests.dispatch.test_fanout_pace import clean_broker as clean_broker  # the fixture, shared
from tests.factories import make_event_endpoint, make_suppression
from tests.inbox.test_inbox_browser import SseReader, StreamServer
from tests.inbox.test_inbox_browser import stream_server as stream_server  # the fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)

CONTENT = {
    "en": {"inapp": {"title": "Sale {{ pct }}%", "body": "Spring sale", "url": "https://shop.example.com/sale"}},
    "de": {"inapp": {"title": "Rabatt {{ pct }}%", "body": "Frühlingsrabatt", "url": "https://shop.example.com/de"}},
}


def _template(key: str = "sale", content: dict[str, Any] | None = None) -> None:
    template_put(key=key, category="marketing", default_locale="en", content=content or CONTENT)


def _client() -> ApiClient:
    return api_client_create(name="svc-inbox-fanout", scopes=["send", "topics"])[0]


def _accept(
    client: ApiClient, topic: str, channels: list[str] | None = None, template: str = "sale", **extra: Any
) -> Notification:
    data = {"topic": topic, "category": "marketing", "template": template, "channels": channels or ["inapp"]}
    return notification_accept(client=client, data={**data, "payload": {"pct": 30}, **extra}).notification


@pytest.fixture
def listener() -> Iterator[Callable[[], list[str]]]:
    """LISTEN on the inbox channel as the stream server does; the callable returns the payloads seen so far."""
    conn = psycopg.connect(_conninfo(), autocommit=True)
    conn.execute(f"LISTEN {INBOX_CHANNEL}")
    seen: list[str] = []

    def payloads() -> list[str]:
        # One NOTIFY carries many changes, comma-separated.
        seen.extend(change for n in conn.notifies(timeout=0.5) for change in n.payload.split(","))
        return seen

    yield payloads
    conn.close()


def test_a_topics_in_app_message_is_stored_at_fan_out_with_compliance_events_and_notify(
    settings: Any, listener: Callable[[], list[str]]
) -> None:
    settings.FANOUT_PAGE_SIZE = 7
    _categories(settings, marketing={"max": 1, "per_seconds": 3600})
    _template()
    topic = make_topic("spring", 20)
    people = list(Recipient.objects.filter(user_id__startswith="t-").order_by("id"))
    opted_out, no_inapp, quiet, german, suppressed, capped = people[:6]
    Recipient.objects.filter(pk=opted_out.pk).update(opted_out=True)
    Recipient.objects.filter(pk=no_inapp.pk).update(channel_prefs={"inapp": False})
    # In quiet hours from an hour ago to an hour from now (UTC): a marketing message waits.
    now = timezone.now()
    start, end = (now - timedelta(hours=1)).time(), (now + timedelta(hours=1)).time()
    Recipient.objects.filter(pk=quiet.pk).update(quiet_start=start, quiet_end=end, timezone="UTC")
    Recipient.objects.filter(pk=german.pk).update(locale="de")
    make_suppression(channel="inapp", address=suppressed.user_id, reason="manual", source="manual")
    client = _client()
    endpoint = make_event_endpoint(client=client, statuses=["sent", "suppressed"])
    # `capped` already had this category's one message of the hour, through the same counters.
    assert (
        frequency.refused_recipients(
            category="marketing", notification_id="earlier", created_at=people[0].created_at, recipient_ids=[capped.pk]
        )
        == set()
    )

    notification = _accept(client, topic.key)
    run_to_end(notification)

    rows = {d.recipient_id: d for d in Delivery.objects.filter(notification=notification)}
    assert len(rows) == 20
    assert (rows[opted_out.pk].status, rows[opted_out.pk].reason) == ("suppressed", "opted_out")
    assert (rows[no_inapp.pk].status, rows[no_inapp.pk].reason) == ("suppressed", "channel_disabled")
    assert (rows[suppressed.pk].status, rows[suppressed.pk].reason) == ("suppressed", "suppressed")
    assert (rows[capped.pk].status, rows[capped.pk].reason) == ("suppressed", "frequency_cap")
    assert (rows[quiet.pk].status, rows[quiet.pk].reason) == ("deferred", "quiet_hours")
    sent = [d for d in rows.values() if d.status == "sent"]
    assert len(sent) == 15
    # The worker's fields: provider, message id, one attempt, the sent time, the version, the rendered content.
    assert {(d.provider, d.provider_message_id == f"inapp-{d.pk}", d.attempts) for d in sent} == {("inapp", True, 1)}
    assert all(d.sent_at is not None and d.template_version_id is not None for d in sent)
    assert rows[german.pk].content == {
        "title": "Rabatt 30%",
        "body": "Frühlingsrabatt",
        "url": "https://shop.example.com/de",
    }
    assert {json.dumps(d.content, sort_keys=True) for d in sent if d.pk != rows[german.pk].pk} == {
        json.dumps({"title": "Sale 30%", "body": "Spring sale", "url": "https://shop.example.com/sale"}, sort_keys=True)
    }
    assert all(d.published_at is None for d in rows.values())  # nothing went to the broker
    history = Counter(
        DeliveryEvent.objects.filter(delivery__notification=notification).values_list("delivery_id", "status")
    )
    for d in sent:
        assert history[(d.pk, "queued")] == history[(d.pk, "sent")] == 1
    # The calling service hears of each one (sent or suppressed), and every new item is NOTIFYed once.
    by_type = Counter(StatusEvent.objects.filter(endpoint=endpoint).values_list("type", flat=True))
    assert by_type == {"delivery.sent": 15, "delivery.suppressed": 4}
    notified = wait_for(lambda: len(listener()) >= 15 and listener(), 10)
    assert sorted(notified) == sorted(f"{d.recipient_id}:{d.pk}" for d in sent)
    # And it is what the inbox lists and reads.
    inbox = Delivery.objects.filter(recipient=german, channel="inapp", status__in=["sent", "delivered", "opened"])
    assert list(inbox.values_list("pk", flat=True)) == [rows[german.pk].pk]


def test_a_page_redone_after_a_crash_stores_no_item_twice(settings: Any, listener: Callable[[], list[str]]) -> None:
    settings.FANOUT_PAGE_SIZE = 10
    _categories(settings, marketing={"max": 1, "per_seconds": 3600})
    _template()
    topic = make_topic("redo", 25)
    notification = _accept(_client(), topic.key)
    first = fanout.fanout_page(notification_id=notification.pk)
    assert first.subscribers == first.inserted == 10 and first.published == 0
    wait_for(lambda: len(listener()) >= 10, 10)
    # The crash: the page committed, its checkpoint did not.
    FanoutLane.objects.filter(notification=notification).update(cursor=0, processed=0)
    Notification.objects.filter(pk=notification.pk).update(fanout_processed=0)

    redo = fanout.fanout_page(notification_id=notification.pk)

    assert redo.subscribers == 10 and redo.inserted == 0 and redo.published == 0
    deliveries = Delivery.objects.filter(notification=notification)
    assert deliveries.count() == 10 and set(deliveries.values_list("status", flat=True)) == {"sent"}
    # Not capped by its own first run: the same notification counts once per recipient however often asked.
    assert DeliveryEvent.objects.filter(delivery__notification=notification).count() == 20  # queued + sent, once
    assert len(listener()) == 10
    run_to_end(notification)
    notification.refresh_from_db()
    assert notification.status == "done" and notification.recipients_total == 25
    assert deliveries.filter(status="sent").count() == 25
    assert Counter(deliveries.values_list("recipient_id", flat=True)).most_common(1)[0][1] == 1
    assert len(listener()) == 25


def test_a_pages_bookkeeping_waits_for_the_next_pages_commit_and_none_is_left_out(
    settings: Any, monkeypatch: Any
) -> None:
    settings.FANOUT_PAGE_SIZE = 2
    _categories(settings, marketing={"max": 1, "per_seconds": 3600})
    _template()
    topic = make_topic("books", 5)
    notification = _accept(_client(), topic.key)
    counted: list[tuple[int, int]] = []  # (items counted, items stored by then)

    def after_commit(n: Notification, stored: int, at: Any, ids: Any = ()) -> None:
        counted.append((stored, Delivery.objects.filter(notification=n, status="sent").count()))

    monkeypatch.setattr(inbox_fanout, "after_commit", after_commit)
    run_to_end(notification)

    # Pages of 2, 2 and 1: each page's items are counted once the next page is stored, the last at the end.
    assert counted == [(2, 4), (2, 5), (1, 5)]


@pytest.mark.parametrize(
    "case",
    ["disabled", "test client", "fallback", "preferences link", "render error"],
)
def test_what_the_fan_out_does_not_decide_goes_to_the_worker(
    settings: Any, case: str, clean_broker: None, listener: Callable[[], list[str]]
) -> None:
    """Each of these in-app deliveries is published for the in-app worker as before, none stored at fan-out."""
    content: dict[str, Any] = CONTENT
    client = _client()
    extra: dict[str, Any] = {}
    channels = ["inapp"]
    if case == "disabled":
        settings.FANOUT_INAPP_DIRECT = False
    elif case == "test client":
        ApiClient.objects.filter(pk=client.pk).update(mode=ApiClient.Mode.TEST)
        client.refresh_from_db()
    elif case == "fallback":
        extra = {"strategy": "fallback"}
        channels = ["inapp", "email"]
        content = {"en": {**CONTENT["en"], "email": {"subject": "Sale", "text": "Spring sale"}}}
    elif case == "preferences link":
        content = {"en": {"inapp": {"title": "Sale", "body": "Settings: {{ preferences_url }}"}}}
    elif case == "render error":
        content = {"en": {"inapp": {"title": "Sale {{ absent_variable }}", "body": "x"}}}
    # A template key of its own per case: a process keeps template versions by key and number (they never change).
    key = "sale-" + case.replace(" ", "-")
    _template(key, content)
    topic = make_topic("worker", 5)
    notification = _accept(client, topic.key, channels, key, **extra)
    run_to_end(notification)

    inapp = Delivery.objects.filter(notification=notification, channel="inapp")
    assert inapp.count() == 5
    assert set(inapp.values_list("status", flat=True)) == {"queued"}
    assert all(d.published_at is not None and d.content is None for d in inapp)
    assert listener() == []


def _told(reader: SseReader) -> bool:
    """Return whether a stream got its new item and the count that goes with it."""
    return bool(reader.of("message")) and {"unread_count": 1} in reader.of("unread")


def test_a_topic_message_stored_at_fan_out_reaches_open_streams_once(
    stream_server: Callable[..., StreamServer],
) -> None:
    _template()
    topic = make_topic("live", 3)
    people = list(Recipient.objects.filter(user_id__startswith="t-").order_by("id"))
    server = stream_server()
    readers = [SseReader(server.port, inbox_token_mint(recipient=r, ttl_seconds=600)[0]) for r in people]
    wait_for(lambda: all(reader.of("unread") == [{"unread_count": 0}] for reader in readers), 20)

    notification = _accept(_client(), topic.key)
    run_to_end(notification)

    for reader, person in zip(readers, people, strict=True):
        wait_for(functools.partial(_told, reader), 20)
        (message,) = reader.of("message")
        stored = Delivery.objects.get(notification=notification, recipient=person)
        assert (message["id"], message["title"], message["url"]) == (
            stored.pk,
            "Sale 30%",
            "https://shop.example.com/sale",
        )
        reader.close()
