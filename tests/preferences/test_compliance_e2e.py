"""Compliance is re-checked on the worker: changes made while a delivery waits in the queue are honoured."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from channels_app.models import SandboxMessage
from notifier.accepting.services import notification_accept
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import relay
from preferences.services import recipient_upsert, suppression_add
from templates_app.services import template_put
from tests.conftest import wait_for

CONTENT = {"en": {"email": {"subject": "News", "text": "Hello {{ name }}"}, "sms": {"text": "Hi {{ name }}"}}}


def _client() -> ApiClient:
    template_put(key="news", category="marketing", default_locale="en", content=CONTENT)
    template_put(key="otp", category="security", default_locale="en", content=CONTENT)
    return api_client_create(name="compliance")[0]


def _send(client: ApiClient, user_id: str, template: str = "news", channel: str = "email") -> Delivery:
    category = "security" if template == "otp" else "marketing"
    return notification_accept(
        client=client,
        data={
            "recipient": {"user_id": user_id},
            "category": category,
            "template": template,
            "channels": [channel],
            "payload": {"name": "Ada"},
        },
    ).deliveries[0]


@pytest.mark.django_db(transaction=True)
def test_opt_out_and_suppression_made_while_queued_stop_the_send(start_worker: Any) -> None:
    client = _client()
    opted, _ = recipient_upsert(user_id="u-opt", email="opt@example.com")
    recipient_upsert(user_id="u-sup", email="sup@example.com")
    recipient_upsert(user_id="u-ok", email="ok@example.com")
    # Accepted while no worker runs: all three wait in the queue.
    waiting = {uid: _send(client, uid) for uid in ("u-opt", "u-sup", "u-ok")}
    assert all(d.status == "queued" for d in waiting.values())
    opted.opted_out = True
    opted.save(update_fields=["opted_out"])
    suppression_add(channel="email", address="sup@example.com", source="manual", reason="support ticket")
    security = _send(client, "u-opt", template="otp")  # security cannot be switched off

    start_worker()
    ids = [d.pk for d in waiting.values()] + [security.pk]
    wait_for(lambda: not Delivery.objects.filter(pk__in=ids, status__in=["queued", "sending"]).exists())
    final = {d.pk: d for d in Delivery.objects.filter(pk__in=ids)}
    assert (final[waiting["u-opt"].pk].status, final[waiting["u-opt"].pk].reason) == ("suppressed", "opted_out")
    assert (final[waiting["u-sup"].pk].status, final[waiting["u-sup"].pk].reason) == ("suppressed", "suppressed")
    assert final[waiting["u-ok"].pk].status == "sent"
    assert final[security.pk].status == "sent"
    assert set(SandboxMessage.objects.values_list("address", flat=True)) == {"ok@example.com", "opt@example.com"}
    assert SandboxMessage.objects.get(address="opt@example.com").delivery_id == security.pk


@pytest.mark.django_db(transaction=True)
def test_quiet_hours_defer_marketing_until_the_window_ends_then_send(start_worker: Any) -> None:
    client = _client()
    now = timezone.now().astimezone(dt.UTC)
    # A window around the current UTC time, in a zone without DST.
    start = (now - dt.timedelta(hours=1)).time().replace(second=0, microsecond=0)
    end = (now + dt.timedelta(hours=1)).time().replace(second=0, microsecond=0)
    recipient_upsert(user_id="u-night", email="night@example.com", timezone="UTC", quiet_start=start, quiet_end=end)
    held = _send(client, "u-night")
    otp = _send(client, "u-night", template="otp")
    assert held.status == "deferred" and held.reason == "quiet_hours"
    assert held.not_before is not None and held.not_before > now
    assert otp.status == "queued"

    start_worker()
    wait_for(lambda: Delivery.objects.filter(pk=otp.pk, status="sent").exists())
    assert Delivery.objects.get(pk=held.pk).status == "deferred"
    # The window ends (moved into the past); the relay wakes the delivery and the worker sends it.
    Delivery.objects.filter(pk=held.pk).update(not_before=timezone.now() - dt.timedelta(seconds=1))
    recipient_upsert(user_id="u-night", quiet_start=None, quiet_end=None)
    assert relay()["due"] == 1
    wait_for(lambda: Delivery.objects.filter(pk=held.pk, status="sent").exists())
    events = list(Delivery.objects.get(pk=held.pk).events.values_list("status", flat=True))
    assert events == ["deferred", "queued", "sending", "sent"]
