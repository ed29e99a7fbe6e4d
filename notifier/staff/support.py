"""What support staff do to one delivery: resend it, cancel it, suppress or unsuppress its address. Audited.

A resend is a new notification (a copy of the original: same client, category, template version, payload
and locale, no dedup key) with one delivery linked to the old one by `resent_from`. It goes through the same
compliance decision as any accepted delivery, now: an address suppressed since, an opt-out or quiet hours
apply to the resend too.

Each action runs in the delivery's project environment (the admin has no scope of its own): the resend's
notification, the compliance decision and the suppression list are that environment's.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from core.chat import CHAT_CHANNELS
from notifier.accepting.decide import delivery_new
from notifier.accepting.services import CANCELLABLE
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.outbox import publish_now
from notifier.deliveries.planning import channel_addresses
from notifier.deliveries.status import record_events, transition
from preferences.models import Suppression
from preferences.services import suppression_add, suppression_remove
from projects.scoping import owner_id, owner_scope

logger = logging.getLogger(__name__)

# A resent message goes to the recipient's current address on these channels (support may just have fixed
# a typo in it); a push token is device-specific, so a push resend goes to the same device.
CURRENT_ADDRESS_CHANNELS = frozenset({"email", "sms", "inapp", "webhook", *CHAT_CHANNELS})
# Statuses that no longer wait for anything: resending one of these cannot make a duplicate of a pending send.
RESENDABLE = Delivery.FINAL_STATUSES - {Delivery.Status.DIGESTED}  # a digested one went out in its digest


class SupportActionError(Exception):
    """An action that does not apply to this delivery (the message says why, for the admin)."""


def delivery_resend(*, delivery: Delivery, actor: Any) -> Delivery:
    """Send a delivery's message again as a new delivery linked to it; compliance decides again. Audited."""
    if delivery.status not in RESENDABLE:
        raise SupportActionError(
            f"Delivery #{delivery.pk} is {delivery.status}: it may still be sent; cancel it first."
        )
    original = delivery.notification
    recipient = delivery.recipient
    address = delivery.address
    if delivery.channel in CURRENT_ADDRESS_CHANNELS:
        address = (
            channel_addresses(recipient, delivery.channel, webhook_default=original.client.webhook_url)[0]
            or delivery.address
        )
    now = timezone.now()
    with owner_scope(owner_id(delivery)), transaction.atomic():
        notification = Notification.objects.create(
            client=original.client,
            category=original.category,
            template_key=original.template_key,
            template_version=original.template_version,
            channels=[delivery.channel],
            payload=original.payload,
            recipient=recipient,
            user_id=original.user_id or recipient.user_id,
            priority=original.priority,
            locale=original.locale,
            trace_id=original.trace_id,
        )
        new = delivery_new(notification, recipient, delivery.channel, address, now)
        new.resent_from = delivery
        new.save(force_insert=True)
        record_events([(new.pk, new.status, new.reason or f"resent from #{delivery.pk}")], at=now)
        # A trace on the original too, under a status of its own so no outcome count includes it.
        record_events([(delivery.pk, "resent", f"resent as #{new.pk}")], at=now)
        audit_record(
            actor=actor,
            action="delivery.resend",
            target_type="delivery",
            target_id=delivery.pk,
            changes={"resent_as": [None, new.pk], "status": [None, new.status], "reason": [None, new.reason]},
        )
        if new.status == Delivery.Status.QUEUED:
            rows = [(new.pk, new.channel, new.priority)]
            transaction.on_commit(lambda: publish_now(rows))
    logger.info("delivery %s resent as %s (%s)", delivery.pk, new.pk, new.status)
    return new


def delivery_cancel(*, delivery: Delivery, actor: Any) -> bool:
    """Cancel a delivery that is not yet sent; return whether it was (a sent one is left alone). Audited."""
    moved = transition(
        [delivery.pk], to=Delivery.Status.CANCELLED, detail="cancelled by support", only_from=CANCELLABLE
    )
    if moved:
        audit_record(
            actor=actor,
            action="delivery.cancel",
            target_type="delivery",
            target_id=delivery.pk,
            changes={"status": [delivery.status, Delivery.Status.CANCELLED]},
        )
    return bool(moved)


def delivery_address_suppress(*, delivery: Delivery, actor: Any, reason: str = "") -> Suppression:
    """Put the delivery's address on the suppression list of its channel (source: manual); audited by the service."""
    if not delivery.address:
        raise SupportActionError("This delivery has no address to suppress.")
    return suppression_add(
        channel=delivery.channel,
        address=delivery.address,
        source=Suppression.Source.MANUAL,
        reason=reason or f"support, delivery #{delivery.pk}",
        audit_actor=actor,
        # The delivery's project environment's list: support suppresses for the project it works for.
        environment_id=owner_id(delivery),
    )


def delivery_address_unsuppress(*, delivery: Delivery, actor: Any) -> bool:
    """Take the delivery's address off its environment's suppression list; return whether it was on it. Audited.

    An installation-wide entry (a provider's bounce or complaint) stays: it protects every project's sending.
    """
    suppression = Suppression.objects.filter(
        environment_id=owner_id(delivery), channel=delivery.channel, address=delivery.address
    ).first()
    if suppression is None:
        return False
    suppression_remove(suppression=suppression, audit_actor=actor)
    return True
