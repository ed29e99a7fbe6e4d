"""Dead letters: replay and discard through the services, the API, the admin actions and the command, with
rows made by the ORM, publishes to the real broker, and one end-to-end replay through a real worker."""

from __future__ import annotations

import itertools
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.sites import AdminSite
from django.contrib.messages.storage.fallback import FallbackStorage
from django.core.management import CommandError, call_command
from django.test import RequestFactory
from django.urls import include, path

from channels_app.models import SandboxMessage
from core.scopes import SCOPES
from notifier.clients.models import ApiClient
from notifier.deadletters.admin import DeadLetterAdmin
from notifier.deadletters.models import DeadLetter
from notifier.deadletters.services import (
    DeadLetterError,
    dead_letter_discard,
    dead_letter_replay,
    dead_letters_replay,
)
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.outbox import publish_delivery_ids
from tests import factories
from tests.conftest import purge_all_queues, queue_depth, wait_for
from tests.deliveries.test_pipeline import make_template, put_recipient, send
from tests.factories import make_api_client, make_delivery, make_notification, make_recipient, make_staff_user

# Until notifier.urls includes them, the tests mount the dead-letter routes in front of the project's own.
urlpatterns = [path("api/v1/", include("notifier.deadletters.urls")), path("", include("config.urls"))]

_seq = itertools.count(1)


def make_dead_letter(
    *, client: ApiClient | None = None, channel: str = "email", status: str = "failed", priority: str = "high"
) -> DeadLetter:
    """Create a notification, a delivery in `status` that exhausted its attempts, and its dead letter."""
    n = next(_seq)
    if client is None:
        client = make_api_client(name=f"dl-client-{n}", key_prefix=f"p{n}", key_hash=f"{n:064d}", scopes=list(SCOPES))
    recipient = make_recipient(user_id=f"dl-user-{n}", email=f"u{n}@example.com")
    notification = make_notification(
        client=client, category="transactional", template_key="t", channels=[channel], priority=priority
    )
    delivery = make_delivery(
        notification=notification,
        recipient=recipient,
        channel=channel,
        priority=priority,
        address=f"u{n}@example.com",
        status=status,
        reason="attempts_exhausted",
        attempts=6,
        last_error="[500] upstream error",
        provider="sandbox",
    )
    return factories.make_dead_letter(
        delivery=delivery, channel=channel, queue=f"dead.{channel}", reason="attempts_exhausted", attempts=6
    )


# --- services --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_replay_requeues_and_publishes_after_commit(django_capture_on_commit_callbacks: Any) -> None:
    purge_all_queues()
    dead = make_dead_letter()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        dead_letter_replay(dead_letter=dead, actor="ops-console")
        assert queue_depth("email.high") == 0  # nothing goes out before the commit
    assert len(callbacks) == 1
    callbacks[0]()
    delivery = Delivery.objects.get(pk=dead.delivery_id)
    assert (delivery.status, delivery.attempts, delivery.not_before) == ("queued", 0, None)
    assert delivery.published_at is not None
    assert queue_depth("email.high") == 1
    dead.refresh_from_db()
    assert (dead.status, dead.resolved_by) == ("replayed", "ops-console")
    assert dead.resolved_at is not None
    event = DeliveryEvent.objects.filter(delivery=delivery).last()
    assert (event.status, event.detail) == ("queued", "replayed by ops-console")


@pytest.mark.django_db
def test_replay_twice_is_refused_and_publishes_once(django_capture_on_commit_callbacks: Any) -> None:
    dead = make_dead_letter()
    with django_capture_on_commit_callbacks() as callbacks:
        dead_letter_replay(dead_letter=dead, actor="a")
        with pytest.raises(DeadLetterError) as excinfo:
            dead_letter_replay(dead_letter=DeadLetter.objects.get(pk=dead.pk), actor="a")
        assert dead_letters_replay(ids=[dead.pk], actor="a") == 0
    assert excinfo.value.code == "not_pending"
    assert len(callbacks) == 1
    assert DeliveryEvent.objects.filter(delivery_id=dead.delivery_id, status="queued").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["sent", "queued", "sending", "cancelled"])
def test_only_a_failed_delivery_can_be_replayed(status: str, django_capture_on_commit_callbacks: Any) -> None:
    dead = make_dead_letter(status=status)
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(DeadLetterError) as excinfo:
        dead_letter_replay(dead_letter=dead, actor="a")
    assert excinfo.value.code == "not_replayable"
    assert callbacks == []
    assert Delivery.objects.get(pk=dead.delivery_id).status == status
    assert DeadLetter.objects.get(pk=dead.pk).status == "pending"


@pytest.mark.django_db
def test_bulk_replay_by_ids_all_and_channel(django_capture_on_commit_callbacks: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr("notifier.deadletters.services.REPLAY_CHUNK", 2)  # several chunks
    emails = [make_dead_letter(channel="email") for _ in range(3)]
    sms = [make_dead_letter(channel="sms", priority="low") for _ in range(2)]
    not_failed = make_dead_letter(channel="email", status="sent")
    with django_capture_on_commit_callbacks(execute=False):
        assert dead_letters_replay(ids=[emails[0].pk, not_failed.pk], actor="a") == 1
        assert dead_letters_replay(all=True, channel="sms", actor="a") == 2
        assert dead_letters_replay(all=True, actor="a") == 2  # the two emails left; `not_failed` stays pending
    assert set(DeadLetter.objects.filter(status="replayed").values_list("pk", flat=True)) == {
        d.pk for d in [*emails, *sms]
    }
    assert DeadLetter.objects.get(pk=not_failed.pk).status == "pending"
    with pytest.raises(ValueError):
        dead_letters_replay(actor="a")


@pytest.mark.django_db
def test_discard_keeps_the_delivery_failed_and_notes_it() -> None:
    dead = make_dead_letter()
    dead_letter_discard(dead_letter=dead, actor="support")
    dead.refresh_from_db()
    assert (dead.status, dead.resolved_by) == ("discarded", "support")
    assert Delivery.objects.get(pk=dead.delivery_id).status == "failed"
    assert (
        DeliveryEvent.objects.filter(delivery_id=dead.delivery_id).last().detail == "dead letter discarded by support"
    )
    with pytest.raises(DeadLetterError):
        dead_letter_discard(dead_letter=dead, actor="support")
    with pytest.raises(DeadLetterError):
        dead_letter_replay(dead_letter=dead, actor="support")


# --- API -------------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.urls("tests.deadletters.test_deadletters")
def test_api_list_filters_and_pages(api_client_factory: Any) -> None:
    client, http = api_client_factory()
    mine = [make_dead_letter(client=client, channel="email") for _ in range(3)]
    make_dead_letter(client=client, channel="sms")
    make_dead_letter()  # another client's: never shown
    dead_letter_discard(dead_letter=mine[0], actor="x")

    first = http.get("/api/v1/dead-letters", {"channel": "email", "limit": 1})
    assert first.status_code == 200, first.content
    body = first.json()
    assert [d["id"] for d in body["results"]] == [mine[2].pk]
    assert body["results"][0]["delivery_status"] == "failed"
    second = http.get("/api/v1/dead-letters", {"channel": "email", "limit": 1, "cursor": body["next_cursor"]}).json()
    assert [d["id"] for d in second["results"]] == [mine[1].pk]
    pending = http.get("/api/v1/dead-letters", {"status": "pending"}).json()
    assert len(pending["results"]) == 3 and pending["next_cursor"] is None

    for params, field in [
        ({"status": "lost"}, "status"),
        ({"channel": "fax"}, "channel"),
        ({"cursor": "!!"}, "cursor"),
    ]:
        bad = http.get("/api/v1/dead-letters", params)
        assert bad.status_code == 400
        assert bad.json()["error"]["code"] == "invalid"
        assert field in bad.json()["error"]["fields"]


@pytest.mark.django_db
@pytest.mark.urls("tests.deadletters.test_deadletters")
def test_api_replay_and_discard_one(api_client_factory: Any, django_capture_on_commit_callbacks: Any) -> None:
    client, http = api_client_factory(name="billing-service")
    dead, other, gone = (make_dead_letter(client=client) for _ in range(3))
    with django_capture_on_commit_callbacks(execute=False):
        response = http.post(f"/api/v1/dead-letters/{dead.pk}/replay")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "replayed"
    assert response.json()["resolved_by"] == "billing-service"
    assert Delivery.objects.get(pk=dead.delivery_id).status == "queued"

    again = http.post(f"/api/v1/dead-letters/{dead.pk}/replay")
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_pending"

    Delivery.objects.filter(pk=gone.delivery_id).update(status="cancelled")
    refused = http.post(f"/api/v1/dead-letters/{gone.pk}/replay")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_replayable"

    discarded = http.post(f"/api/v1/dead-letters/{other.pk}/discard")
    assert discarded.status_code == 200 and discarded.json()["status"] == "discarded"
    assert http.post(f"/api/v1/dead-letters/{other.pk}/discard").status_code == 409

    foreign = make_dead_letter()
    assert http.post(f"/api/v1/dead-letters/{foreign.pk}/replay").status_code == 404
    assert http.post("/api/v1/dead-letters/999999999/discard").status_code == 404
    assert DeadLetter.objects.get(pk=foreign.pk).status == "pending"


@pytest.mark.django_db
@pytest.mark.urls("tests.deadletters.test_deadletters")
def test_api_bulk_replay(api_client_factory: Any, django_capture_on_commit_callbacks: Any) -> None:
    client, http = api_client_factory()
    emails = [make_dead_letter(client=client) for _ in range(2)]
    sms = make_dead_letter(client=client, channel="sms")
    foreign = make_dead_letter()
    with django_capture_on_commit_callbacks(execute=False):
        by_ids = http.post("/api/v1/dead-letters/replay", {"ids": [emails[0].pk, foreign.pk]}, format="json")
        assert by_ids.status_code == 200, by_ids.content
        assert by_ids.json() == {"replayed": 1}  # another client's dead letter is not touched
        by_channel = http.post("/api/v1/dead-letters/replay", {"all": True, "channel": "sms"}, format="json")
        assert by_channel.json() == {"replayed": 1}
        rest = http.post("/api/v1/dead-letters/replay", {"all": True}, format="json")
        assert rest.json() == {"replayed": 1}
    assert DeadLetter.objects.get(pk=sms.pk).status == "replayed"
    assert DeadLetter.objects.get(pk=foreign.pk).status == "pending"

    for body, field in [
        ({}, "ids"),
        ({"ids": [1], "all": True}, "ids"),
        ({"ids": []}, "ids"),
        ({"ids": ["x"]}, "ids.0"),
        ({"all": True, "channel": "fax"}, "channel"),
        ({"all": "maybe"}, "all"),
    ]:
        bad = http.post("/api/v1/dead-letters/replay", body, format="json")
        assert bad.status_code == 400, (body, bad.content)
        assert field in bad.json()["error"]["fields"], (body, bad.json())


@pytest.mark.django_db
@pytest.mark.urls("tests.deadletters.test_deadletters")
def test_api_requires_a_key() -> None:
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/dead-letters").status_code == 401


# --- admin and command -----------------------------------------------------------------------------------


def _admin_request() -> Any:
    request = RequestFactory().post("/admin/deadletters/deadletter/")
    request.user = make_staff_user("oncall", superuser=True)
    request.session = {}  # type: ignore[assignment]  # the messages framework needs only a mapping here
    # Where the messages middleware would put the storage (Django's request carries no such attribute).
    request._messages = FallbackStorage(request)  # type: ignore[attr-defined]
    return request


@pytest.mark.django_db
def test_admin_actions_replay_and_discard(django_capture_on_commit_callbacks: Any) -> None:
    model_admin = DeadLetterAdmin(DeadLetter, AdminSite())
    request = _admin_request()
    replay_me, discard_me, not_failed = make_dead_letter(), make_dead_letter(), make_dead_letter(status="sent")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        model_admin.replay_selected(request, DeadLetter.objects.filter(pk__in=[replay_me.pk, not_failed.pk]))
    assert len(callbacks) == 1
    model_admin.discard_selected(request, DeadLetter.objects.filter(pk=discard_me.pk))
    assert DeadLetter.objects.get(pk=replay_me.pk).resolved_by == "oncall"
    assert DeadLetter.objects.get(pk=discard_me.pk).status == "discarded"
    assert DeadLetter.objects.get(pk=not_failed.pk).status == "pending"
    texts = [str(m) for m in request._messages]
    assert "1 replayed." in texts and "1 discarded." in texts
    assert any("1 not replayed" in t for t in texts)
    assert "replay_selected" in model_admin.get_actions(request)


@pytest.mark.django_db
def test_command_dry_run_ids_channel_and_all(django_capture_on_commit_callbacks: Any) -> None:
    emails = [make_dead_letter() for _ in range(2)]
    sms = make_dead_letter(channel="sms")
    out = StringIO()
    call_command("replay_dead_letters", "--all", "--dry-run", stdout=out)
    assert "3 dead letter(s) would be replayed" in out.getvalue()
    assert DeadLetter.objects.filter(status="pending").count() == 3

    with django_capture_on_commit_callbacks(execute=False):
        out = StringIO()
        call_command("replay_dead_letters", "--id", str(emails[0].pk), "--actor", "night-shift", stdout=out)
        assert "1 delivery(ies) replayed" in out.getvalue()
        call_command("replay_dead_letters", "--all", "--channel", "sms", stdout=StringIO())
        call_command("replay_dead_letters", "--all", stdout=StringIO())
    assert DeadLetter.objects.get(pk=emails[0].pk).resolved_by == "night-shift"
    assert DeadLetter.objects.get(pk=sms.pk).resolved_by.startswith("cli")
    assert DeadLetter.objects.filter(status="pending").count() == 0
    with pytest.raises(CommandError):
        call_command("replay_dead_letters")


# --- end to end ------------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.deadletters.test_deadletters")
def test_replayed_dead_letter_is_sent_exactly_once(api_client_factory: Any, start_worker: Any) -> None:
    _, http = api_client_factory()
    make_template()
    put_recipient(http)
    failing = start_worker(
        env={"SANDBOX_BEHAVIOUR": "fail", "DELIVERY_MAX_ATTEMPTS": "2", "RETRY_BACKOFF_BASE_SECONDS": "0.2"}
    )
    body = send(http, channels=["email"]).json()
    delivery = wait_for(lambda: Delivery.objects.filter(notification_id=body["id"], status="failed").first(), 60)
    dead = wait_for(lambda: DeadLetter.objects.filter(delivery=delivery).first())
    failing.stop()

    healthy = start_worker()
    response = http.post(f"/api/v1/dead-letters/{dead.pk}/replay")
    assert response.status_code == 200, response.content
    try:
        wait_for(lambda: Delivery.objects.get(pk=delivery.pk).status == "sent", 30)
    except AssertionError:
        d = Delivery.objects.get(pk=delivery.pk)
        events = list(d.events.values_list("status", "detail"))
        raise AssertionError(f"{d.status} {d.attempts} {d.published_at} {events}\n{healthy.log()[-4000:]}") from None
    # A second replay request and a duplicate publish change nothing: the claim takes a delivery only once.
    assert http.post(f"/api/v1/dead-letters/{dead.pk}/replay").status_code == 409
    publish_delivery_ids([delivery.pk])
    # Wait until the worker has finished the duplicate message too, so a second send would be seen.
    wait_for(lambda: healthy.log().count("succeeded") >= 2, 60)
    assert SandboxMessage.objects.filter(delivery_id=delivery.pk).count() == 1
    assert Delivery.objects.get(pk=delivery.pk).attempts == 1
