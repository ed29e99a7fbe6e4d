"""Sandbox messages are a client's own: the list shows only what its notifications made (they carry OTPs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery
from tests.conftest import wait_for
from tests.deliveries.test_pipeline import make_template, put_recipient, send


@pytest.mark.django_db(transaction=True)
def test_each_client_lists_only_the_sandbox_messages_of_its_own_notifications(
    api_client_factory: Callable[..., tuple[Any, Any]], start_worker: Any
) -> None:
    make_template()
    alice_client, alice = api_client_factory(name="alice")
    bob_client, bob = api_client_factory(name="bob")
    put_recipient(alice, "u-a")
    put_recipient(alice, "u-b")
    start_worker()
    mine = send(alice, "u-a", channels=["email", "sms"]).json()
    theirs = send(bob, "u-b", channels=["email"], payload={"order_id": "OTP-123456"}).json()
    wait_for(lambda: SandboxMessage.objects.count() == 3)
    wait_for(lambda: Delivery.objects.filter(status="sent").count() == 3)

    listed = alice.get("/api/v1/sandbox/messages").json()["results"]
    assert sorted(m["delivery_id"] for m in listed) == sorted(d["id"] for d in mine["deliveries"])
    assert all("OTP-123456" not in str(m["content"]) for m in listed)
    bobs = bob.get("/api/v1/sandbox/messages").json()["results"]
    assert [m["delivery_id"] for m in bobs] == [theirs["deliveries"][0]["id"]]
    assert bobs[0]["content"]["subject"] == "Order OTP-123456"
    # Filters narrow within the client's own messages: another client's delivery id or address finds nothing.
    other_id = theirs["deliveries"][0]["id"]
    assert alice.get("/api/v1/sandbox/messages", {"delivery_id": other_id}).json()["results"] == []
    assert alice.get("/api/v1/sandbox/messages", {"address": "u-b@example.com"}).json()["results"] == []
    assert set(SandboxMessage.objects.values_list("client_id", flat=True)) == {alice_client.pk, bob_client.pk}


@pytest.mark.django_db
def test_pages_of_a_client_skip_other_clients_messages(api_client_factory: Callable[..., tuple[Any, Any]]) -> None:
    me, api = api_client_factory(name="me")
    other, _ = api_client_factory(name="other")
    # Interleaved, more than one page (limit 50) of mine: the keyset page walks only my rows.
    rows = [
        SandboxMessage(
            delivery_id=9000 + n, client_id=(me if n % 3 else other).pk, channel="sms", address="+", content={}
        )
        for n in range(180)
    ]
    SandboxMessage.objects.bulk_create(rows)
    ids = list(SandboxMessage.objects.filter(client_id=me.pk).values_list("id", flat=True))
    assert len(ids) == 120
    # A message recorded before clients were kept (no client) is nobody's over the API; the admin lists it.
    SandboxMessage.objects.create(delivery_id=9500, client_id=None, channel="sms", address="+1", content={})
    seen, cursor, pages = [], None, 0
    while True:
        page = api.get("/api/v1/sandbox/messages", {"limit": 50, **({"cursor": cursor} if cursor else {})}).json()
        seen += [m["id"] for m in page["results"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert pages == 3
    assert seen == sorted(ids, reverse=True)


@pytest.mark.django_db
def test_staff_see_every_clients_sandbox_messages_in_the_admin(staff: Any, api_client_factory: Any) -> None:
    a, _ = api_client_factory(name="a")
    b, _ = api_client_factory(name="b")
    SandboxMessage.objects.create(delivery_id=9201, client_id=a.pk, channel="sms", address="+15550001", content={})
    SandboxMessage.objects.create(delivery_id=9202, client_id=b.pk, channel="sms", address="+15550002", content={})
    page = staff.get("/admin/channels_app/sandboxmessage/")
    assert page.status_code == 200
    assert b"9201" in page.content and b"9202" in page.content
