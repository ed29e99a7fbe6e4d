"""Status events to the calling service, end to end: real workers, a local receiver, Standard Webhooks checks.

Each client's endpoint receives the status changes of its own deliveries (sent, delivered and bounced by SES
callback, failed, suppressed), signed with its own secret, in order, again after its receiver was down, and
given up with a record after the retry window.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from notifier.accepting.services import notification_accept
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from notifier.statusevents.models import EventAttempt, EventEndpoint, StatusEvent
from notifier.statusevents.record import reach_record
from preferences.services import recipient_upsert, suppression_add
from templates_app.services import template_put
from tests import factories
from tests.callbacks.test_callbacks_ses import _stub_server, notification, post, ses_event, signing, stub  # noqa: F401
from tests.conftest import ALL_SEND_QUEUES, bearer_client, wait_for
from tests.factories import make_event_attempt, make_staff_user
from tests.stubs.webhook import WebhookReceiver

CONTENT = {
    "en": {
        "email": {"subject": "Order {{ order }}", "text": "Order {{ order }} shipped"},
        "webhook": {"body": {"event": "order.shipped", "order": "{{ order }}"}},
    }
}
# Short backoff so "the receiver was down for a while" takes seconds, not minutes.
FAST = {"EVENT_RETRY_BASE_SECONDS": "0.3", "EVENT_RETRY_MAX_SECONDS": "1", "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"}


def _http(client_name: str) -> tuple[ApiClient, APIClient]:
    client, key = api_client_create(name=client_name)
    http = bearer_client(key)
    return client, http


def _endpoint(http: APIClient, url: str, **body: Any) -> dict[str, Any]:
    resp = http.put("/api/v1/event-endpoint", {"url": url, **body}, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def _send(client: ApiClient, user_id: str, channel: str) -> Delivery:
    data = {
        "recipient": {"user_id": user_id},
        "category": "transactional",
        "template": "t",
        "channels": [channel],
        "payload": {"order": "A-1"},
    }
    return notification_accept(client=client, data=data).deliveries[0]


def _verified(receiver: WebhookReceiver, secret: str) -> list[dict[str, Any]]:
    """Verify every request the receiver got with the independent `standardwebhooks` library; return the bodies."""
    hook = Webhook(secret)
    bodies = []
    for request in list(receiver.requests):
        headers = {k.lower(): v for k, v in request.headers.items()}
        bodies.append(hook.verify(request.body, headers))
        assert headers["webhook-id"] == bodies[-1]["id"]
    return bodies


@pytest.fixture
def receivers() -> Any:
    with WebhookReceiver() as a, WebhookReceiver() as b, WebhookReceiver() as hooks:
        yield a, b, hooks


@pytest.mark.django_db(transaction=True)
def test_every_status_reaches_its_own_client_signed_and_never_another_clients(
    start_worker: Callable[..., Any],
    receivers: Any,
    stub: Any,  # noqa: F811 - the SES callback fixtures of tests.callbacks.test_callbacks_ses
    signing: Any,  # noqa: F811
    webhook_env: dict[str, str],
    settings: Any,
) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    receiver_a, receiver_b, hooks = receivers
    template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    client_a, http_a = _http("svc-a")
    client_b, http_b = _http("svc-b")
    secret_a = _endpoint(http_a, f"{receiver_a.url}/events")["secret"]
    secret_b = _endpoint(http_b, f"{receiver_b.url}/events", events=["delivery.sent"])["secret"]
    assert secret_a.startswith("whsec_") and secret_a != secret_b
    assert "secret" not in http_a.get("/api/v1/event-endpoint").json()

    recipient_upsert(user_id="u-1", email="one@example.com", webhook_url=f"{hooks.url}/hooks")
    recipient_upsert(user_id="u-3", email="gone@example.com")
    suppression_add(channel="email", address="gone@example.com", source="manual")
    hooks.respond(400, {"error": "no"})  # the webhook channel's receiver rejects: a permanent failure
    start_worker(queues=[*ALL_SEND_QUEUES, "events"], env={**webhook_env, **FAST, "WEBHOOK_PROVIDERS": "webhook"})

    sent = _send(client_a, "u-1", "email")
    failed = _send(client_a, "u-1", "webhook")
    suppressed = _send(client_a, "u-3", "email")
    assert suppressed.status == "suppressed"
    other = _send(client_b, "u-1", "email")
    # Two SES deliveries of client A, moved by signed SES callbacks (in this process, like the API would).
    to_deliver = factories.make_delivery(client=client_a, provider="ses", provider_message_id="0100-del-1")
    to_bounce = factories.make_delivery(client=client_a, provider="ses", provider_message_id="0100-bnc-1")
    assert post(notification(ses_event("Delivery", "0100-del-1"), stub, signing[0])).status_code == 200
    bounce = {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": to_bounce.address}]}
    assert post(notification(ses_event("Bounce", "0100-bnc-1", bounce=bounce), stub, signing[0])).status_code == 200

    expected_a = {
        (sent.pk, "delivery.sent"),
        (failed.pk, "delivery.failed"),
        (suppressed.pk, "delivery.suppressed"),
        (to_deliver.pk, "delivery.delivered"),
        (to_bounce.pk, "delivery.bounced"),
    }

    def got_a() -> set[tuple[int, str]]:
        return {(e["data"]["delivery_id"], e["type"]) for e in _verified(receiver_a, secret_a)}

    wait_for(lambda: expected_a <= got_a(), 60)
    wait_for(lambda: _verified(receiver_b, secret_b), 30)
    bodies_a = _verified(receiver_a, secret_a)
    assert {e["data"]["delivery_id"] for e in bodies_a}.isdisjoint({other.pk})
    by_type = {e["type"]: e for e in bodies_a}
    assert by_type["delivery.failed"]["data"]["reason"] == "http_400"
    assert by_type["delivery.suppressed"]["data"]["reason"] == "suppressed"
    assert by_type["delivery.sent"]["data"]["notification_id"] == str(sent.notification_id)
    assert by_type["delivery.sent"]["data"]["user_id"] == "u-1"
    # Client B subscribed to sent only and sees only its own delivery, signed with its own secret.
    bodies_b = _verified(receiver_b, secret_b)
    assert [(e["data"]["delivery_id"], e["type"]) for e in bodies_b] == [(other.pk, "delivery.sent")]
    with pytest.raises(Exception):
        _verified(receiver_b, secret_a)

    # Every try is listed over the API (the sender records a try after its answer: the receiver may be first).
    def attempts_a() -> list[dict[str, Any]]:
        return http_a.get("/api/v1/event-endpoint/attempts").json()["items"]

    wait_for(lambda: len(attempts_a()) >= len(expected_a), 30)
    assert all(a["ok"] for a in attempts_a())


@pytest.mark.django_db(transaction=True)
def test_events_survive_the_receiver_being_down_in_order_and_batched(
    start_worker: Callable[..., Any], receivers: Any, settings: Any
) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    receiver, _, _ = receivers
    template_put(key="t", category="transactional", default_locale="en", content=CONTENT)
    client, http = _http("svc-down")
    secret = _endpoint(http, f"{receiver.url}/events", max_batch=3)["secret"]
    receiver.respond(503, b"down", times=4)  # down for the first four tries
    for i in range(7):
        recipient_upsert(user_id=f"d-{i}", email=f"d{i}@example.com")
    start_worker(queues=[*ALL_SEND_QUEUES, "events"], env=FAST)
    deliveries = [_send(client, f"d-{i}", "email") for i in range(7)]
    wanted = {d.pk for d in deliveries}

    def delivered_ids() -> set[int]:
        ok = [r for r in receiver.requests if r.body and r.json().get("type") == "batch"]
        return {e["data"]["delivery_id"] for r in ok[4:] for e in r.json()["data"]}

    wait_for(lambda: wanted <= delivered_ids(), 60)
    hook = Webhook(secret)
    # The failing head is retried before anything behind it: the four refused tries and the first accepted one
    # start with the same event (a batch may grow while it waits), and every batch is in event order.
    heads = {r.json()["data"][0]["id"] for r in receiver.requests[:5]}
    assert len(heads) == 1, heads
    ids: list[int] = []
    for request in receiver.requests[4:]:
        body = hook.verify(request.body, {k.lower(): v for k, v in request.headers.items()})
        assert body["type"] == "batch" and 1 <= len(body["data"]) <= 3
        batch = [int(e["id"].removeprefix("evt_")) for e in body["data"]]
        assert batch == sorted(batch)
        ids += batch
    assert len(ids) == len(set(ids)) == 7, "each event accepted once"
    # The sender marks a batch sent after the receiver's answer: the last one may still be on its way.
    wait_for(lambda: not StatusEvent.objects.filter(endpoint__client=client, state="pending").exists(), 30)
    attempts = list(EventAttempt.objects.filter(endpoint__client=client).order_by("id"))
    assert [a.ok for a in attempts[:4]] == [False] * 4 and [a.status_code for a in attempts[:4]] == [503] * 4
    assert all(a.ok for a in attempts[4:])


@pytest.mark.django_db(transaction=True)
def test_events_past_the_retry_window_are_given_up_with_a_record(
    start_worker: Callable[..., Any], receivers: Any, settings: Any
) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    receiver, _, _ = receivers
    client, http = _http("svc-dead")
    _endpoint(http, f"{receiver.url}/events")
    receiver.respond(500, b"dead")
    d = factories.make_delivery(client=client, status="queued")
    start_worker(queues=["events"], env={**FAST, "EVENT_RETRY_WINDOW_SECONDS": "2"})
    Delivery.objects.filter(pk=d.pk).update(status="failed", reason="test")
    reach_record([(d.pk, "failed", "test")])
    wait_for(lambda: StatusEvent.objects.filter(delivery_id=d.pk, state="given_up").exists(), 30)
    record = EventAttempt.objects.filter(endpoint__client=client, given_up__gt=0).get()
    assert not record.ok and record.status_code == 500
    listed = http.get("/api/v1/event-endpoint/attempts").json()["items"]
    assert any(a["given_up"] == 1 for a in listed)


@pytest.mark.django_db
def test_endpoint_api_validates_rotates_and_deletes(api: APIClient, settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = False
    assert api.get("/api/v1/event-endpoint").status_code == 404
    bad = api.put("/api/v1/event-endpoint", {"url": "http://169.254.169.254/x"}, format="json")
    assert bad.status_code == 400 and "url" in bad.json()["error"]["fields"]
    bad = api.put("/api/v1/event-endpoint", {"url": "https://hooks.example.com/x", "max_batch": 501}, format="json")
    assert "max_batch" in bad.json()["error"]["fields"]
    bad = api.put("/api/v1/event-endpoint", {"url": "https://hooks.example.com/x", "events": ["x"]}, format="json")
    assert "events.0" in bad.json()["error"]["fields"]
    created = api.put(
        "/api/v1/event-endpoint", {"url": "https://hooks.example.com/x", "events": ["delivery.failed"]}, format="json"
    ).json()
    assert created["events"] == ["delivery.failed"] and created["secret"].startswith("whsec_")
    changed = api.put("/api/v1/event-endpoint", {"url": "https://hooks.example.com/y"}, format="json").json()
    assert "secret" not in changed and changed["url"].endswith("/y")
    rotated = api.post("/api/v1/event-endpoint/rotate-secret").json()["secret"]
    assert rotated != created["secret"]
    assert EventEndpoint.objects.get().secret == rotated
    assert api.delete("/api/v1/event-endpoint").status_code == 204
    assert api.get("/api/v1/event-endpoint").status_code == 404
    assert json.loads(api.delete("/api/v1/event-endpoint").content)["error"]["code"] == "not_found"


@pytest.mark.django_db
def test_events_are_recorded_in_one_statement_per_batch_only_for_subscribed_clients() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from notifier.deliveries.status import record_events
    from notifier.statusevents.services import event_endpoint_put

    subscribed = api_client_create(name="svc-sub")[0]
    silent = api_client_create(name="svc-silent")[0]
    event_endpoint_put(client=subscribed, url="https://hooks.example.com/e", statuses=["failed"], max_batch=1)
    mine = [factories.make_delivery(client=subscribed, status="failed", reason="boom") for _ in range(3)]
    theirs = [factories.make_delivery(client=silent, status="failed") for _ in range(3)]
    rows = [(d.pk, "failed", "boom") for d in mine + theirs] + [(mine[0].pk, "sending", "")]

    def statements(batch: list[tuple[int, str, str]]) -> int:
        with CaptureQueriesContext(connection) as captured:
            record_events(batch)
        return len(captured.captured_queries)

    assert statements(rows[:1]) == statements(rows) == 2  # the history insert and one reach statement
    events = list(StatusEvent.objects.order_by("id"))
    # Only the subscribed client's deliveries, only the subscribed type; `sending` never becomes an event.
    assert sorted(e.delivery_id for e in events) == sorted([mine[0].pk] + [d.pk for d in mine])
    assert {e.type for e in events} == {"delivery.failed"}
    assert events[-1].data["reason"] == "boom" and events[-1].data["status"] == "failed"
    # A batch with nothing anyone can subscribe to costs no extra statement at all.
    assert statements([(d.pk, "deferred", "quiet_hours") for d in mine]) == 1


@pytest.mark.django_db
def test_admin_shows_endpoints_and_their_attempts_but_never_the_secret(client: Any) -> None:
    from django.utils import timezone

    from notifier.statusevents.services import event_endpoint_put

    api_client = api_client_create(name="svc-admin")[0]
    endpoint, secret = event_endpoint_put(
        client=api_client, url="https://hooks.example.com/e", statuses=["sent"], max_batch=1
    )
    make_event_attempt(
        endpoint=endpoint, first_event_id=7, last_event_id=7, events=1, ok=False, status_code=503,
        error="HTTP 503", at=timezone.now(),
    )  # fmt: skip
    client.force_login(make_staff_user("ops", superuser=True))
    page = client.get(f"/admin/statusevents/eventendpoint/{endpoint.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "HTTP 503" in html and "hooks.example.com" in html
    assert secret is not None and secret not in html
    listing = client.get("/admin/statusevents/eventattempt/")
    assert listing.status_code == 200 and "HTTP 503" in listing.content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_send_pipeline_writes_status_events_only_for_batches_someone_listens_to() -> None:
    """The pipeline decides once per batch whether to write status events; an endpoint added later counts."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from channels_app.services import deliver
    from notifier.deliveries.models import Notification
    from notifier.statusevents.services import event_endpoint_put

    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    client = api_client_create(name="svc-later")[0]

    def send_one() -> tuple[int, int]:
        delivery = factories.make_delivery(client=client, status="queued")
        Notification.objects.filter(pk=delivery.notification_id).update(template_version=1, payload={"order": 7})
        with CaptureQueriesContext(connection) as captured:
            assert deliver([delivery.pk]).sent == 1
        reach = [q for q in captured.captured_queries if "notifier_statusevent" in q["sql"]]
        return len(reach), StatusEvent.objects.filter(delivery_id=delivery.pk).count()

    assert send_one() == (0, 0)  # no endpoint, no in-app: not even the status-event statement
    event_endpoint_put(client=client, url="https://hooks.example.com/e", statuses=["sent"], max_batch=1)
    assert send_one() == (1, 1)  # the cached "no endpoint" of this client was invalidated by the save


@pytest.mark.django_db(transaction=True)
def test_a_slack_deliverys_status_events_reach_its_client_signed(
    start_worker: Callable[..., Any], receivers: Any, slack_stub: Any, slack_env: dict[str, str], settings: Any
) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    receiver, _, _ = receivers
    template_put(key="t", category="transactional", default_locale="en",
                 content={"en": {"chat": {"text": "Order {{ order }} shipped"}}})  # fmt: skip
    client, http = _http("svc-slack")
    secret = _endpoint(http, f"{receiver.url}/events")["secret"]
    recipient_upsert(user_id="u-s", chat={"slack": "U024BE7LH"})
    slack_stub.error("not_in_channel", times=1)  # the first post is refused for good
    start_worker(queues=["slack.high", "slack.low", "events"], env={**slack_env, **FAST, "SLACK_PROVIDERS": "slack"})

    failed = _send(client, "u-s", "slack")
    wait_for(lambda: Delivery.objects.filter(pk=failed.pk, status="failed").exists(), 60)
    sent = _send(client, "u-s", "slack")
    wait_for(lambda: Delivery.objects.filter(pk=sent.pk, status="sent").exists(), 60)

    def events() -> dict[tuple[int, str], dict[str, Any]]:
        return {(e["data"]["delivery_id"], e["type"]): e["data"] for e in _verified(receiver, secret)}

    wait_for(lambda: {(failed.pk, "delivery.failed"), (sent.pk, "delivery.sent")} <= set(events()), 60)
    got = events()
    assert got[(failed.pk, "delivery.failed")]["channel"] == "slack"
    assert got[(failed.pk, "delivery.failed")]["reason"] == "not_in_channel"
    assert got[(sent.pk, "delivery.sent")]["channel"] == "slack"
    assert got[(sent.pk, "delivery.sent")]["user_id"] == "u-s"
    assert got[(sent.pk, "delivery.sent")]["provider_message_id"].startswith("U024BE7LH/")
    with pytest.raises(Exception):
        _verified(receiver, "whsec_" + "A" * 32)  # signed with this client's secret, not any other
