"""Helpers for send-path tests: many deliveries written at once and published as one broker message."""

from __future__ import annotations

import uuid
from collections import Counter

from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import publish
from preferences.models import Recipient
from templates_app.models import TemplateVersion
from templates_app.services import template_put
from tests.factories import make_api_client, make_notification

WEBHOOK_CONTENT = {"en": {"webhook": {"body": {"event": "notice", "ref": "{{ ref }}"}}}}


def webhook_template(key: str = "hook") -> TemplateVersion:
    """Create (or update) a transactional webhook template; return its published version."""
    template_put(key=key, category="transactional", default_locale="en", content=WEBHOOK_CONTENT)
    version = TemplateVersion.objects.filter(template__key=key).order_by("-version").first()
    assert version is not None  # template_put has just written it
    return version


def make_batch(
    *,
    n: int,
    address: str,
    channel: str = "webhook",
    client: ApiClient | None = None,
    template_key: str = "hook",
    payload: dict | None = None,
) -> list[int]:
    """Write one notification with `n` queued deliveries (one recipient each) to `address`; return their ids."""
    tag = uuid.uuid4().hex[:10]
    if client is None:
        client = make_api_client(name=f"svc-{tag}", key_prefix=tag[:8], key_hash=uuid.uuid4().hex * 2)
    version = TemplateVersion.objects.filter(template__key=template_key).order_by("-version").first()
    assert version is not None, "create the template first"
    recipients = Recipient.objects.bulk_create([Recipient(user_id=f"{tag}-{i}") for i in range(n)])
    notification = make_notification(
        client=client,
        category="transactional",
        template_key=template_key,
        template_version=version.version,
        channels=[channel],
        priority="high",
        payload=payload or {"ref": tag},
    )
    deliveries = Delivery.objects.bulk_create(
        [
            Delivery(notification=notification, recipient=r, channel=channel, priority="high", address=address)
            for r in recipients
        ]
    )
    return [d.pk for d in deliveries]


def publish_as_one(ids: list[int], queue: str = "webhook.high") -> None:
    """Publish `ids` as one broker message (one batch for one worker process)."""
    assert publish({queue: ids}, batch_size=len(ids)) == ids


def statuses(ids: list[int]) -> Counter[str]:
    """Count the statuses of the given deliveries."""
    return Counter(Delivery.objects.filter(pk__in=ids).values_list("status", flat=True))


def poison_client() -> ApiClient:
    """Create an API client whose malformed webhook secret makes the webhook adapter raise (poison deliveries)."""
    tag = uuid.uuid4().hex[:8]
    return make_api_client(
        name=f"bad-{tag}", key_prefix=tag, key_hash=uuid.uuid4().hex * 2, webhook_secret="whsec_not*base64!"
    )
