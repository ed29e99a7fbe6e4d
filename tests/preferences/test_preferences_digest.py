"""Digests: many deferred deliveries of a recipient become one digest per channel."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.dispatch.digest import digest_flush, is_digest
from notifier.dispatch.tasks import flush_digests
from preferences.models import Recipient
from templates_app.services import template_put
from tests.factories import make_delivery, make_notification, make_recipient

pytestmark = pytest.mark.django_db

DIGEST_CONTENT = {
    "en": {
        "email": {"subject": "{{ count }} updates", "text": "{% for i in items %}{{ i.template }}\n{% endfor %}"},
        "inapp": {"body": "{{ count }} updates"},
    }
}


@pytest.fixture(autouse=True)
def digest_template() -> Any:
    """Publish the template digests are sent with (a flush folds nothing without one)."""
    return template_put(key="digest", category="marketing", default_locale="en", content=DIGEST_CONTENT)


@pytest.fixture
def park(service: ApiClient) -> Callable[..., Delivery]:
    """Create a delivery the way the pipeline parks a digest one: deferred, reason digest:<freq>, no not_before."""
    counter = {"n": 0}

    def _park(
        recipient: Recipient, channel: str = "email", frequency: str = "daily_digest", category: str = "marketing"
    ) -> Delivery:
        counter["n"] += 1
        n = make_notification(
            client=service,
            category=category,
            template_key=f"promo_{counter['n'] % 3}",
            payload={"n": counter["n"]},
            recipient=recipient,
            user_id=recipient.user_id,
            priority="low",
            channels=[channel],
        )
        return make_delivery(
            notification=n,
            recipient=recipient,
            channel=channel,
            priority="low",
            address=recipient.email if channel == "email" else recipient.user_id,
            status="deferred",
            reason=f"digest:{frequency}",
        )

    return _park


def _flush(capture: Callable[..., Any], **kw: Any) -> int:
    # The digest's publish runs on commit; execute it (against this namespace's RabbitMQ vhost).
    with capture(execute=True):
        return digest_flush(**kw)


def test_many_deferred_deliveries_become_one_digest(
    park: Callable[..., Delivery], django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    pytest.importorskip("notifier.deliveries.outbox")
    alice = make_recipient(user_id="alice", email="alice@example.com")
    bob = make_recipient(user_id="bob", email="bob@example.com")
    alice_mail = [park(alice) for _ in range(50)]
    alice_inbox = [park(alice, channel="inapp") for _ in range(3)]
    bob_mail = [park(bob) for _ in range(2)]
    hourly = park(bob, frequency="hourly_digest")
    not_waiting = park(bob)
    Delivery.objects.filter(pk=not_waiting.pk).update(status="sent")

    assert _flush(django_capture_on_commit_callbacks, frequency="daily") == 3

    digests = Delivery.objects.filter(notification__template_key="digest").select_related("notification")
    by_target = {(d.recipient.user_id, d.channel): d for d in digests}
    assert set(by_target) == {("alice", "email"), ("alice", "inapp"), ("bob", "email")}

    alice_digest = by_target[("alice", "email")]
    payload = alice_digest.notification.payload
    assert payload["count"] == 50 and len(payload["items"]) == 50
    originals = [d.notification for d in alice_mail]
    assert payload["items"] == [{"template": n.template_key, "payload": n.payload} for n in originals]
    assert alice_digest.address == "alice@example.com" and alice_digest.status == "queued"
    assert alice_digest.notification.category == "marketing"
    assert alice_digest.notification.client_id == originals[0].client_id
    # Pinned to the published version, as an accepted send is: that is the version the send worker renders.
    assert alice_digest.notification.template_version == 1
    assert is_digest(alice_digest.notification)
    assert by_target[("alice", "inapp")].notification.payload["count"] == 3
    assert by_target[("bob", "email")].notification.payload["count"] == 2

    # Originals retired with a trace; what was not waiting for this frequency is left alone.
    folded = [d.pk for d in alice_mail + alice_inbox + bob_mail]
    assert set(Delivery.objects.filter(pk__in=folded).values_list("status", flat=True)) == {"digested"}
    assert DeliveryEvent.objects.filter(delivery_id__in=folded, status="digested").count() == len(folded)
    assert DeliveryEvent.objects.filter(delivery=alice_digest, status="queued").exists()
    assert Delivery.objects.get(pk=hourly.pk).status == "deferred"
    assert Delivery.objects.get(pk=not_waiting.pk).status == "sent"

    # Published to the broker after commit (the outbox records the publish).
    assert all(d.published_at is not None for d in Delivery.objects.filter(pk__in=[d.pk for d in digests]))

    # A second run finds nothing: nothing is sent twice.
    assert _flush(django_capture_on_commit_callbacks, frequency="daily_digest") == 0
    assert _flush(django_capture_on_commit_callbacks, frequency="hourly_digest") == 1
    assert Delivery.objects.get(pk=hourly.pk).status == "digested"


def test_flush_respects_cutoff_and_separates_categories(
    park: Callable[..., Delivery], django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    pytest.importorskip("notifier.deliveries.outbox")
    carol = make_recipient(user_id="carol", email="carol@example.com")
    park(carol)
    park(carol, category="social")
    late = park(carol)
    Delivery.objects.filter(pk=late.pk).update(created_at=timezone.now() + dt.timedelta(hours=1))
    assert _flush(django_capture_on_commit_callbacks, frequency="daily", now=timezone.now()) == 2
    assert Delivery.objects.get(pk=late.pk).status == "deferred"
    categories = set(Notification.objects.filter(template_key="digest").values_list("category", flat=True))
    assert categories == {"marketing", "social"}


def test_flush_digests_task_and_bad_frequency(
    park: Callable[..., Delivery], django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    dave = make_recipient(user_id="dave", email="dave@example.com")
    for _ in range(4):
        park(dave, frequency="hourly_digest")
    with django_capture_on_commit_callbacks(execute=True):
        assert flush_digests.run("hourly_digest") == 1
    with pytest.raises(ValueError, match="frequency"):
        digest_flush(frequency="weekly")


def test_digest_settings_template_key(
    settings: Any, park: Callable[..., Delivery], django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    pytest.importorskip("notifier.deliveries.outbox")
    settings.DIGEST_TEMPLATE_KEY = "weekly_roundup"
    template_put(key="weekly_roundup", category="marketing", default_locale="en", content=DIGEST_CONTENT)
    erin = make_recipient(user_id="erin", email="erin@example.com")
    park(erin)
    assert _flush(django_capture_on_commit_callbacks, frequency="daily") == 1
    assert Notification.objects.filter(template_key="weekly_roundup", recipient=erin).count() == 1


def test_without_a_published_digest_template_nothing_is_folded_until_there_is_one(
    park: Callable[..., Delivery], django_capture_on_commit_callbacks: Callable[..., Any], settings: Any
) -> None:
    settings.DIGEST_TEMPLATE_KEY = "roundup"
    frank = make_recipient(user_id="frank", email="frank@example.com")
    waiting = [park(frank, frequency="hourly_digest") for _ in range(2)]
    assert _flush(django_capture_on_commit_callbacks, frequency="hourly") == 0
    assert set(Delivery.objects.filter(pk__in=[d.pk for d in waiting]).values_list("status", flat=True)) == {"deferred"}
    assert not Notification.objects.filter(template_key="roundup").exists()

    template_put(key="roundup", category="marketing", default_locale="en", content=DIGEST_CONTENT)
    assert _flush(django_capture_on_commit_callbacks, frequency="hourly") == 1
    digest = Notification.objects.get(template_key="roundup")
    assert (digest.template_version, digest.payload["count"]) == (1, 2)


def test_a_channel_the_digest_template_lacks_waits(
    park: Callable[..., Delivery], django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    # The next published version drops in-app.
    email_only = {"en": {"email": DIGEST_CONTENT["en"]["email"]}}
    template_put(key="digest", category="marketing", default_locale="en", content=email_only)
    gina = make_recipient(user_id="gina", email="gina@example.com")
    mail, bell = park(gina, frequency="hourly_digest"), park(gina, channel="inapp", frequency="hourly_digest")
    assert _flush(django_capture_on_commit_callbacks, frequency="hourly") == 1
    assert Delivery.objects.get(pk=mail.pk).status == "digested"
    assert Delivery.objects.get(pk=bell.pk).status == "deferred"
