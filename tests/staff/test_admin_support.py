"""Support in the admin: find a customer's delivery, read its story, resend, cancel, suppress (Django test client)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from notifier.accepting.services import notification_accept
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.partitions import delivery_id_day, partition_name
from notifier.deliveries.selectors import delivery_search, notifications_by_dedup_key
from notifier.deliveries.status import record_events
from preferences.models import Suppression
from preferences.services import recipient_upsert, suppression_add
from templates_app.services import template_put
from tests.factories import make_api_client, make_delivery

pytestmark = [pytest.mark.django_db, pytest.mark.staff_user("support")]


def _accept(user_id: str, dedup_key: str | None = None, **recipient: Any) -> Notification:
    template_put(
        key="order_shipped",
        category="transactional",
        default_locale="en",
        content={"en": {"email": {"subject": "Order {{ order_id }}", "text": "Shipped {{ order_id }}"}}},
    )
    recipient_upsert(user_id=user_id, **recipient)
    client, _ = api_client_create(name=f"shop-{user_id}")
    data: dict[str, Any] = {
        "recipient": {"user_id": user_id},
        "category": "transactional",
        "template": "order_shipped",
        "payload": {"order_id": "A-7"},
    }
    if dedup_key:
        data["dedup_key"] = dedup_key
    return notification_accept(client=client, data=data).notification


def test_search_finds_a_customers_deliveries_by_every_identifier() -> None:
    mine = make_delivery(address="ana@example.com", provider="ses", provider_message_id="ses-0001")
    sms = make_delivery(channel="sms", address="+14155550100", recipient=mine.recipient)
    other = make_delivery(address="bo@example.com", provider="ses", provider_message_id="ses-0002")
    Notification.objects.filter(pk=other.notification_id).update(dedup_key="order-42")
    mine.recipient.email, mine.recipient.phone = "ana@example.com", "+14155550100"
    mine.recipient.save()

    def ids(term: str) -> set[int]:
        return set(delivery_search(query=term).values_list("pk", flat=True))

    assert ids("ana@example.com") == {mine.pk, sms.pk}  # the address, and the recipient's other channels
    assert ids("+14155550100") == {mine.pk, sms.pk}
    assert ids(mine.recipient.user_id) == {mine.pk, sms.pk}
    assert ids("ses-0002") == {other.pk}
    assert ids(str(other.notification_id)) == {other.pk}
    assert ids("order-42") == {other.pk}
    assert ids(str(sms.pk)) == {sms.pk}
    assert ids("nobody@example.com") == set()
    assert ids("  ") == set()


# A partition's copy of a parent index is named by PostgreSQL after its columns; the target index is per partition.
PARTITION_INDEXES = {
    "delivery_address_hash": "_address_idx",
    "delivery_recipient_idx": "_recipient_id_created_at_idx",
    "delivery_provider_msg_idx": "_provider_provider_message_id_idx",
    "delivery_target_uniq": "_target_uniq",
    "notification_dedup_idx": "_client_id_dedup_key_idx",
}


def test_search_is_served_by_indexes() -> None:
    """On 200,000 deliveries, each kind of term is an index lookup, never a sequential scan."""
    with connection.cursor() as c:
        client_id = make_api_client(name="x", key_prefix="x", key_hash="x" * 64).pk
        c.execute(
            "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out,"
            " channel_prefs, category_prefs, created_at, updated_at)"
            " SELECT 'u-' || g, 'c' || g || '@example.com', '+1555' || lpad(g::text, 7, '0'), 'en', 'UTC', '',"
            " false, '{}', '{}', now(), now() FROM generate_series(1, 20000) g"
        )
        c.execute("SELECT min(id) FROM preferences_recipient")
        first = c.fetchone()[0]
        c.execute(
            "INSERT INTO notifier_notification (id, client_id, dedup_key, request_hash, category, template_key,"
            " channels, payload, user_id, priority, locale, status, fanout_processed, trace_id, created_at,"
            " updated_at) SELECT gen_random_uuid(), %s, 'dk-' || g, '', 'transactional', 't', '{}', '{}',"
            " 'u-' || (g %% 20000 + 1), 'high', '', 'done', 0, '', now(), now() FROM generate_series(1, 50000) g",
            [client_id],
        )
        c.execute(
            "INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status,"
            " reason, provider, provider_message_id, attempts, last_error, created_at, updated_at)"
            " SELECT n.id, %s + (n.rn %% 20000), ch.channel, 'high',"
            " CASE ch.channel WHEN 'email' THEN 'c' || (n.rn %% 20000 + 1) || '@example.com'"
            " ELSE '+1555' || lpad((n.rn %% 20000 + 1)::text, 7, '0') END,"
            " 'sent', '', 'ses', 'm-' || ch.channel || n.rn, 1, '', now(), now()"
            " FROM (SELECT id, row_number() OVER () AS rn FROM notifier_notification) n"
            " CROSS JOIN (VALUES ('email'), ('sms'), ('push'), ('inapp')) ch(channel)",
            [first],
        )
        for table in ("notifier_delivery", "notifier_notification", "preferences_recipient", "notifier_apiclient"):
            c.execute(f"ANALYZE {table}")
    assert Delivery.objects.count() == 200_000
    terms = {
        "email": ("c77@example.com", ["delivery_address_hash", "recipient_email_idx", "delivery_recipient_idx"]),
        "phone": ("+15550000077", ["delivery_address_hash", "recipient_phone_idx"]),
        "user id": ("u-77", ["recipient_user_environment_uniq", "delivery_recipient_idx"]),  # unique index
        "provider message id": ("m-email77", ["delivery_provider_msg_idx"]),
        "dedup key": ("dk-77", ["notification_dedup_idx", "delivery_target_uniq"]),
    }
    # The day the rows were written in (their ids say it), not the clock's: a run across midnight has both.
    day = delivery_id_day(Delivery.objects.order_by("id").values_list("id", flat=True)[0])
    for name, (term, indexes) in terms.items():
        from preferences.models import Recipient

        assert delivery_search(query=term).exists(), name
        plans = [delivery_search(query=term).order_by("-id")[:100].explain()]
        plans.append(Recipient.objects.filter(user_id=term).explain())
        plans.append(Recipient.objects.filter(email=term).explain())
        plans.append(Recipient.objects.filter(phone=term).explain())
        plans.append(notifications_by_dedup_key(term).explain())
        joined = "\n".join(plans)
        # The rows are in today's partitions (notifier/deliveries/partitions.py): those are never scanned whole; the
        # empty
        # ones of the days ahead may be (a sequential scan of nothing is their cheapest plan).
        assert f"Seq Scan on {partition_name('notifier_delivery', day)}" not in plans[0], plans[0]
        assert f"Seq Scan on {partition_name('notifier_notification', day)}" not in plans[-1], plans[-1]
        for index in indexes:
            index = PARTITION_INDEXES.get(index, index)
            assert index in joined, f"{name}: {index} not used:\n{joined}"


def test_delivery_page_tells_the_whole_story(staff: Client) -> None:
    notification = _accept("u-story", email="ana@example.com")
    delivery = notification.deliveries.get()
    record_events([(delivery.pk, "sending", "")])
    record_events([(delivery.pk, "failed", "sandbox: 503 Service Unavailable")])
    record_events([(delivery.pk, "sending", "")])
    record_events([(delivery.pk, "sent", "sandbox")])
    record_events([(delivery.pk, "delivered", "ses:delivery 2026-11-30")])
    record_events([(delivery.pk, "opened", "ses:open")])
    Delivery.objects.filter(pk=delivery.pk).update(status="opened")

    page = staff.get(reverse("admin:deliveries_delivery_change", args=[delivery.pk]))
    body = page.content.decode()
    assert page.status_code == 200
    order = ["Request accepted", "Queued", "Attempt 1", "503 Service Unavailable", "Attempt 2", "Delivered", "Opened"]
    positions = [body.index(label) for label in order]
    assert positions == sorted(positions)
    assert "Shipped A-7" in body  # the content as sent
    assert "order_shipped@1" in body  # the template version
    assert 'id="compliance"' in body and "send" in body


def test_resend_makes_a_linked_delivery_checked_again_and_audited(staff: Client) -> None:
    notification = _accept("u-resend", email="ana@example.com")
    old = notification.deliveries.get()
    Delivery.objects.filter(pk=old.pk).update(status="sent")
    response = staff.post(reverse("admin:deliveries_delivery_resend", args=[old.pk]))
    new = Delivery.objects.get(resent_from=old)
    assert response.status_code == 302 and response["Location"].endswith(f"/{new.pk}/change/")
    assert (new.status, new.address, new.channel) == ("queued", "ana@example.com", "email")
    assert new.notification_id != old.notification_id
    assert new.notification.payload == {"order_id": "A-7"} and new.notification.template_version == 1
    entry = AuditEntry.objects.get(action="delivery.resend")
    assert (entry.actor_name, entry.target_id) == ("support", str(old.pk))
    assert "resent as #" in staff.get(reverse("admin:deliveries_delivery_change", args=[old.pk])).content.decode()

    # Suppressed since: the resend is decided again, and suppressed.
    suppression_add(channel="email", address="ana@example.com", source="bounce")
    Delivery.objects.filter(pk=new.pk).update(status="bounced")
    staff.post(reverse("admin:deliveries_delivery_resend", args=[new.pk]))
    assert Delivery.objects.get(resent_from=new).status == "suppressed"
    # A delivery still waiting is not resent (it would be sent twice).
    waiting = _accept("u-wait", email="bo@example.com").deliveries.get()
    staff.post(reverse("admin:deliveries_delivery_resend", args=[waiting.pk]))
    assert not Delivery.objects.filter(resent_from=waiting).exists()


def test_cancel_and_suppress_from_the_page_and_the_list(staff: Client) -> None:
    queued = _accept("u-cancel", email="cy@example.com").deliveries.get()
    sent = make_delivery(status="sent")
    staff.post(reverse("admin:deliveries_delivery_cancel", args=[queued.pk]))
    assert Delivery.objects.get(pk=queued.pk).status == "cancelled"
    staff.post(
        reverse("admin:deliveries_delivery_changelist"),
        {"action": "cancel_selected", "_selected_action": [str(sent.pk)]},
    )
    assert Delivery.objects.get(pk=sent.pk).status == "sent"
    assert AuditEntry.objects.filter(action="delivery.cancel").count() == 1

    staff.post(reverse("admin:deliveries_delivery_suppress", args=[queued.pk]))
    assert Suppression.objects.filter(channel="email", address="cy@example.com", source="manual").exists()
    assert (
        'id="action-unsuppress"'
        in staff.get(reverse("admin:deliveries_delivery_change", args=[queued.pk])).content.decode()
    )
    staff.post(reverse("admin:deliveries_delivery_unsuppress", args=[queued.pk]))
    assert not Suppression.objects.filter(channel="email", address="cy@example.com").exists()
    actions = list(AuditEntry.objects.filter(target_type="suppression").order_by("id").values_list("action", flat=True))
    assert actions == ["suppression.add", "suppression.remove"]
    # The address is masked in the audit log.
    assert "cy@example.com" not in str(AuditEntry.objects.filter(target_type="suppression").values_list("changes"))


def test_list_search_box_uses_delivery_search(staff: Client) -> None:
    mine = make_delivery(address="dee@example.com")
    make_delivery(address="eve@example.com")
    page = staff.get(reverse("admin:deliveries_delivery_changelist"), {"q": "dee@example.com"})
    assert [d.pk for d in page.context["cl"].result_list] == [mine.pk]
