"""Writes of the core: API clients, accepting notifications, cancelling them.

Accepting is the hot path: validate, deduplicate, resolve recipients and their preferences, write the
notification with its deliveries in one transaction, publish after commit. No provider is ever called here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import audit_record
from notifier import dedup, metrics
from notifier.auth import generate_key, hash_key
from notifier.errors import ApiError
from notifier.events import record_events, transition
from notifier.models import ApiClient, Delivery, Notification
from notifier.outbox import publish_now
from notifier.policy import send_policy
from notifier.scopes import DEFAULT_SCOPES, SCOPES
from preferences.compliance import evaluate
from preferences.models import Device, Recipient
from preferences.services import recipient_upsert
from templates_app.selectors import TemplateNotFound, template_version_resolve

logger = logging.getLogger(__name__)

CANCELLABLE = (Delivery.Status.SCHEDULED, Delivery.Status.DEFERRED, Delivery.Status.QUEUED)


def api_client_create(
    *,
    name: str,
    allowed_categories: list[str] | None = None,
    scopes: list[str] | None = None,
    audit_actor: Any = None,
) -> tuple[ApiClient, str]:
    """Create an API client and return it with its raw key (shown once, stored only hashed).

    `scopes` defaults to `send` only (notifier.scopes.DEFAULT_SCOPES).
    """
    unknown = sorted(set(allowed_categories or []) - set(settings.NOTIFIER_CATEGORIES))
    if unknown:
        raise ValueError(f"unknown categories: {', '.join(unknown)}")
    scopes = list(DEFAULT_SCOPES) if scopes is None else scopes
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(unknown)}")
    raw_key, prefix = generate_key()
    client = ApiClient.objects.create(
        name=name,
        key_prefix=prefix,
        key_hash=hash_key(raw_key),
        allowed_categories=allowed_categories or [],
        scopes=scopes,
    )
    if audit_actor is not None:
        changes = {"scopes": [None, scopes], "allowed_categories": [None, client.allowed_categories]}
        audit_record(actor=audit_actor, action="api_client.create", target_type="api_client", target_id=client.pk,
                     changes=changes)  # fmt: skip
    return client, raw_key


def api_client_assign_key(*, client: ApiClient) -> str:
    """Give an (unsaved or saved) client a new key's prefix and hash without saving; return the raw key."""
    raw_key, prefix = generate_key()
    client.key_prefix, client.key_hash = prefix, hash_key(raw_key)
    return raw_key


def api_client_rotate_key(*, client: ApiClient, audit_actor: Any = None) -> str:
    """Give a client a new key (the old one stops working at once) and return it."""
    old_prefix = client.key_prefix
    raw_key = api_client_assign_key(client=client)
    client.save(update_fields=["key_prefix", "key_hash"])
    if audit_actor is not None:
        audit_record(actor=audit_actor, action="api_client.rotate_key", target_type="api_client", target_id=client.pk,
                     changes={"key_prefix": [old_prefix, client.key_prefix]})  # fmt: skip
    return raw_key


# Standard Webhooks secrets carry 24 to 64 random bytes.
WEBHOOK_SECRET_BYTES = (24, 64)


def webhook_secret_problem(secret: str) -> str | None:
    """Return why `secret` is not a usable "whsec_<base64>" signing secret, or None when it is one."""
    from channels_app.providers.base import ConfigurationError
    from channels_app.providers.webhook import SECRET_PREFIX, decode_secret

    if not secret.startswith(SECRET_PREFIX):
        return f"Must start with '{SECRET_PREFIX}' followed by base64 (Standard Webhooks)."
    try:
        raw = decode_secret(secret)
    except ConfigurationError:
        return f"The part after '{SECRET_PREFIX}' must be base64."
    low, high = WEBHOOK_SECRET_BYTES
    if not low <= len(raw) <= high:
        return f"The secret must decode to {low} to {high} bytes, not {len(raw)}."
    return None


@dataclass
class AcceptResult:
    """The outcome of accepting one request."""

    notification: Notification
    duplicate: bool
    deliveries: list[Delivery] = field(default_factory=list)


def request_fingerprint(data: dict[str, Any]) -> str:
    """Return a stable hash of a request body, to tell a retry (same body) from a conflict (other body)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def category_settings(category: str) -> dict[str, Any]:
    """Return the configured rules of a category."""
    return dict(settings.NOTIFIER_CATEGORIES[category])


def notification_accept(*, client: ApiClient, data: dict[str, Any], trace_id: str = "") -> AcceptResult:
    """Accept one validated request: deduplicate, resolve, write in one transaction, publish after commit.

    `data` is the validated body of POST /notifications (see API.md). Raises ApiError for an unknown template
    (400), what notifier.policy.send_policy refuses (category and priority) and a reused dedup_key with another
    body (409).
    """
    try:
        version = template_version_resolve(data["template"])
    except TemplateNotFound as exc:
        raise ApiError(400, "invalid", str(exc), {"template": [str(exc)]}) from None
    category, priority = send_policy(
        client=client, template_category=version.template.category, category=data.get("category"),
        priority=data.get("priority"),
    )  # fmt: skip
    template_channels = version.channels
    channels = list(dict.fromkeys(data.get("channels") or template_channels))
    missing = [c for c in channels if c not in template_channels]
    if missing:
        message = f"Template '{version.template.key}' has no content for channel(s): {', '.join(missing)}."
        raise ApiError(400, "invalid", message, {"channels": [message]})

    request_hash = request_fingerprint(data)
    dedup_key = data.get("dedup_key") or None
    notification_id = uuid.uuid4()
    if dedup_key:
        won, existing = dedup.claim(
            client_id=client.pk, dedup_key=dedup_key, notification_id=str(notification_id), request_hash=request_hash
        )
        if not won:
            found = _existing_duplicate(client=client, dedup_key=dedup_key, request_hash=request_hash, hint=existing)
            if found is not None:
                return found

    notification = Notification(
        id=notification_id,
        client=client,
        dedup_key=dedup_key,
        request_hash=request_hash,
        category=category,
        template_key=version.template.key,
        template_version=version.version,
        channels=channels,
        payload=data.get("payload") or {},
        priority=priority,
        locale=data.get("locale") or "",
        send_at=data.get("send_at"),
        trace_id=trace_id,
    )
    try:
        with transaction.atomic():
            if data.get("topic"):
                deliveries = _prepare_topic(notification, data["topic"])
            else:
                deliveries = _prepare_user(notification, data["recipient"]["user_id"])
    except IntegrityError:
        # Another request with the same dedup_key committed first (we waited on its row lock): it wins.
        if dedup_key:
            dedup.release(client_id=client.pk, dedup_key=dedup_key, notification_id=str(notification_id))
            found = _existing_duplicate(client=client, dedup_key=dedup_key, request_hash=request_hash, hint=None)
            if found is not None:
                return found
        raise
    except BaseException:
        if dedup_key:
            dedup.release(client_id=client.pk, dedup_key=dedup_key, notification_id=str(notification_id))
        raise
    metrics.count_accepted(category, client.name)
    return AcceptResult(notification=notification, duplicate=False, deliveries=deliveries)


def _existing_duplicate(
    *, client: ApiClient, dedup_key: str, request_hash: str, hint: str | None
) -> AcceptResult | None:
    """Return the committed notification for `dedup_key`, a 409 if its body differs, or None if there is none."""
    if hint and "|" in hint and hint.split("|", 1)[1] != request_hash:
        raise ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")
    existing = Notification.objects.filter(client=client, dedup_key=dedup_key).first()
    if existing is None:
        # The first request has not committed (or failed); the insert path will wait on the unique index.
        return None
    if existing.request_hash != request_hash:
        raise ApiError(409, "idempotency_conflict", "This dedup_key was already used with a different request body.")
    return AcceptResult(notification=existing, duplicate=True, deliveries=list(existing.deliveries.order_by("id")))


def _prepare_topic(notification: Notification, topic_key: str) -> list[Delivery]:
    """Write a topic notification; the fan-out task creates its deliveries after commit."""
    from notifier.fanout import fanout_start
    from preferences.models import Topic

    topic = Topic.objects.filter(key=topic_key).first()
    if topic is None:
        raise ApiError(400, "invalid", f"Unknown topic '{topic_key}'.", {"topic": ["Unknown topic."]})
    notification.topic = topic
    notification.status = Notification.Status.FANNING_OUT
    notification.save(force_insert=True)
    transaction.on_commit(lambda: fanout_start(notification_id=notification.pk))
    return []


def _prepare_user(notification: Notification, user_id: str) -> list[Delivery]:
    """Write a single-recipient notification with one delivery per (channel, address); publish after commit."""
    # A user the service has not heard of yet gets a bare recipient: in-app still works, and channels that
    # need contact data are reported as suppressed with reason no_address instead of failing the request.
    recipient = Recipient.objects.filter(user_id=user_id).first()
    if recipient is None:
        recipient, _ = recipient_upsert(user_id=user_id)
    notification.recipient = recipient
    notification.user_id = user_id
    now = timezone.now()
    if notification.send_at and notification.send_at > now:
        notification.status = Notification.Status.SCHEDULED
    notification.save(force_insert=True)

    deliveries = [
        _plan_delivery(notification, recipient, channel, address, now)
        for channel in notification.channels
        for address in channel_addresses(recipient, channel, notification.client)
    ]
    Delivery.objects.bulk_create(deliveries)
    record_events(((d.pk, d.status, d.reason) for d in deliveries), at=now)
    to_publish = [(d.pk, d.channel, d.priority) for d in deliveries if d.status == Delivery.Status.QUEUED]
    if to_publish:
        transaction.on_commit(lambda: publish_now(to_publish))
    return deliveries


def channel_addresses(recipient: Recipient, channel: str, client: ApiClient) -> list[str]:
    """Return the addresses of `recipient` on `channel` ([""] when there is none, reported as no_address)."""
    if channel == "email":
        return [recipient.email]
    if channel == "sms":
        return [recipient.phone]
    if channel == "inapp":
        return [recipient.user_id]
    if channel == "webhook":
        return [recipient.webhook_url or client.webhook_url]
    if channel == "push":
        tokens = list(Device.objects.filter(recipient=recipient, active=True).values_list("token", flat=True))
        return tokens or [""]
    raise ValueError(f"unknown channel {channel}")


def _plan_delivery(
    notification: Notification, recipient: Recipient, channel: str, address: str, now: datetime
) -> Delivery:
    """Decide a new delivery's first status from the compliance verdict and send_at."""
    delivery = Delivery(
        notification=notification,
        recipient=recipient,
        channel=channel,
        priority=notification.priority,
        address=address,
        status=Delivery.Status.QUEUED,
    )
    verdict = evaluate(recipient=recipient, category=notification.category, channel=channel, address=address, now=now)
    apply_verdict(delivery, verdict, send_at=notification.send_at, now=now)
    return delivery


def apply_verdict(delivery: Delivery, verdict: Any, *, send_at: datetime | None, now: datetime) -> None:
    """Set a new delivery's status, reason and not_before from a compliance verdict and the send time."""
    if verdict.action == "suppress":
        delivery.status, delivery.reason = Delivery.Status.SUPPRESSED, verdict.reason
    elif verdict.action == "digest":
        delivery.status, delivery.reason = Delivery.Status.DEFERRED, verdict.reason or "digest"
    elif verdict.action == "defer":
        delivery.status, delivery.reason = Delivery.Status.DEFERRED, verdict.reason or "quiet_hours"
        delivery.not_before = max(verdict.until, send_at) if send_at else verdict.until
    elif send_at and send_at > now:
        delivery.status, delivery.not_before = Delivery.Status.SCHEDULED, send_at


def notification_cancel(*, notification: Notification) -> int:
    """Cancel the deliveries of a notification that are not yet sent; return how many were cancelled."""
    ids = list(notification.deliveries.filter(status__in=CANCELLABLE).values_list("id", flat=True))
    moved = transition(ids, to=Delivery.Status.CANCELLED, detail="cancelled by client", only_from=CANCELLABLE)
    if notification.status != Notification.Status.DONE:
        Notification.objects.filter(pk=notification.pk).update(status=Notification.Status.CANCELLED)
    return len(moved)


def staff_roles_sync() -> None:
    """Create the Support and Marketing groups with their permissions if missing (idempotent).

    The data migration 0006_staff_roles creates them; create_staff_user calls this too, so a database whose
    groups were flushed (or deleted by hand) gets them back with exactly the permissions of notifier/roles.py.
    """
    from django.contrib.auth.models import Group, Permission

    from notifier.roles import ROLE_PERMISSIONS

    for role, names in ROLE_PERMISSIONS.items():
        group, created = Group.objects.get_or_create(name=role)
        if created:
            wanted = [name.split(".") for name in names]
            perms = Permission.objects.filter(codename__in=[codename for _, codename in wanted]).select_related(
                "content_type"
            )
            by_name = {(p.content_type.app_label, p.codename): p for p in perms}
            group.permissions.add(*[by_name[(app, codename)] for app, codename in wanted])
