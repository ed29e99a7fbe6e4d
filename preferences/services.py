"""Writes for recipients, devices, preferences, topics, subscriptions and the suppression list."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
from base64 import urlsafe_b64decode, urlsafe_b64encode
from typing import Any

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core import signing
from django.db import connection, transaction
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from audit.services import Actor, audit_forget_target, audit_record, diff
from core.categories import is_optional
from preferences.models import Device, Recipient, Subscription, Suppression, Topic
from preferences.selectors import recipient_for_send
from preferences.signals import recipient_erased
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from projects.scoping import current_environment_id, owner_id, owner_scope

# What a caller may set on a recipient through recipient_upsert(); user_id and erased_at are managed here.
RECIPIENT_FIELDS = frozenset(
    {
        "email",
        "phone",
        "locale",
        "timezone",
        "webhook_url",
        "chat",
        "opted_out",
        "tracking_opt_out",
        "channel_prefs",
        "category_prefs",
        "quiet_start",
        "quiet_end",
    }
)


# Recipient fields an audit entry shows before and after (personal ones are masked by audit_record).
AUDITED_RECIPIENT_FIELDS = ("email", "phone", "locale", "timezone", "webhook_url", "chat", "opted_out")
_PREFERENCE_FIELDS = ("opted_out", "channel_prefs", "category_prefs", "quiet_start", "quiet_end")


def _audit(audit_actor: Any, action: str, target_type: str, target_id: Any, changes: dict[str, Any]) -> None:
    """Record a change made by an API client or a staff user; changes by the pipeline itself pass no actor."""
    if audit_actor is not None:
        audit_record(actor=audit_actor, action=action, target_type=target_type, target_id=target_id, changes=changes)


def _snapshot(recipient: Recipient, names: tuple[str, ...] | list[str]) -> dict[str, Any]:
    return {name: _plain(getattr(recipient, name)) for name in names}


def _plain(value: Any) -> Any:
    """Return a JSON-friendly form of a field value for the audit log (times as text)."""
    return value.isoformat() if isinstance(value, dt.time | dt.datetime) else value


def suppression_add(
    *,
    channel: str,
    address: str,
    source: str,
    reason: str = "",
    audit_actor: Any = None,
    environment_id: int | None = None,
) -> Suppression:
    """Put (channel, address) on an environment's suppression list (idempotent); a suppressed push token is deactivated.

    The list is `environment_id`'s, else the scope's (projects.scoping); outside any scope (provider bounces,
    complaints and invalid addresses reported to the workers and callbacks) it is the installation-wide list every
    project's sends check.
    """
    owner = environment_id if environment_id is not None else current_environment_id()
    # Exactly that list: the scope's manager alone would also show the installation-wide entries.
    if owner is None:
        entries = Suppression.objects.filter(environment__isnull=True)
    else:
        entries = Suppression.objects.filter(environment_id=owner)
    suppression, created = entries.get_or_create(
        channel=channel, address=address, defaults={"source": source, "reason": reason[:255], "environment_id": owner}
    )
    if channel == "push":
        Device.objects.filter(token=address, active=True).update(active=False, deactivated_at=timezone.now())
    if created:
        changes = {"channel": [None, channel], "address": [None, address], "reason": [None, reason[:255]]}
        _audit(audit_actor, "suppression.add", "suppression", suppression.pk, changes)
    return suppression


def recipient_upsert(*, user_id: str, audit_actor: Any = None, **fields: Any) -> tuple[Recipient, bool]:
    """Create or update the recipient `user_id` with `fields`; return it and whether it was created.

    Upserting an erased recipient brings it back (erased_at cleared) with only the data given now. With an
    `audit_actor` (the API client or staff user making the change) the change is written to the audit log.
    """
    unknown = set(fields) - RECIPIENT_FIELDS
    if unknown:
        raise TypeError(f"recipient_upsert() got unknown fields: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        recipient, created = Recipient.objects.select_for_update().get_or_create(user_id=user_id, defaults=fields)
        before = {} if created else _snapshot(recipient, list(fields))
        if not created:
            changed = list(fields)
            for name, value in fields.items():
                setattr(recipient, name, value)
            if recipient.erased_at is not None:
                recipient.erased_at = None
                changed.append("erased_at")
            if changed:
                recipient.save(update_fields=[*changed, "updated_at"])
        changes = diff(before, _snapshot(recipient, list(fields)))
        if created or changes:
            action = "recipient.create" if created else "recipient.update"
            _audit(audit_actor, action, "recipient", user_id, changes)
    return recipient, created


def erased_user_id(recipient: Recipient) -> str:
    """Return the stand-in that replaces an erased recipient's user_id everywhere (it names only the row)."""
    return f"erased:{recipient.pk}"


def recipient_ensure(*, user_id: str) -> Recipient:
    """Return the recipient `user_id`, creating a bare one (no personal data) for a user never seen.

    What an accept does for a user the service has not heard of, and what minting an inbox token does: a front
    end may open a user's inbox before the first notification for them ever arrives.
    """
    recipient = recipient_for_send(user_id=user_id)
    if recipient is None:
        recipient, _ = recipient_upsert(user_id=user_id)
    return recipient


def recipient_erase(*, recipient: Recipient, audit_actor: Any = None) -> Recipient:
    """Erase a recipient's personal data, keeping the rows that other records point at.

    Wipes contact fields, devices, preferences and topic memberships, replaces the caller's user_id by a
    stand-in (`erased:<row id>`: the same user_id can be used again for a new recipient, and nothing here
    names the person any more), masks the user_id in the audit log, and has each app forget what it sent to
    them (preferences.signals.recipient_erased): payloads, rendered content, addresses and user_ids.
    """
    now = timezone.now()
    with transaction.atomic():
        recipient = Recipient.objects.select_for_update().get(pk=recipient.pk)
        before = {**_snapshot(recipient, AUDITED_RECIPIENT_FIELDS), "devices": recipient.devices.count()}
        user_id = recipient.user_id
        recipient.user_id = erased_user_id(recipient)
        recipient.email = ""
        recipient.phone = ""
        recipient.webhook_url = ""
        recipient.chat = {}
        recipient.locale = ""
        recipient.timezone = ""
        recipient.opted_out = False
        recipient.channel_prefs = {}
        recipient.category_prefs = {}
        recipient.quiet_start = None
        recipient.quiet_end = None
        recipient.erased_at = now
        recipient.save()
        recipient.devices.all().delete()
        # Topic memberships are preferences too; keeping them would make every fan-out write a row for nobody.
        recipient.subscriptions.all().delete()
        # What was sent to them belongs to the apps that sent it: each forgets its own rows.
        # Each app forgets by the recipient's own rows (its deliveries, runs, messages), whatever their parents'
        # owners: outside any scope, so that no owned manager narrows a row out (a sandbox message of no client).
        with owner_scope(None):
            recipient_erased.send(sender=Recipient, recipient=recipient, at=now, user_id=user_id)
        audit_forget_target(target_type="recipient", target_id=user_id, replacement=recipient.user_id)
        # The admin's own history names the object by its str(), the user_id: renamed the same way.
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(Recipient), object_id=str(recipient.pk)
        ).update(object_repr=recipient.user_id)
        after = {**_snapshot(recipient, AUDITED_RECIPIENT_FIELDS), "devices": 0}
        _audit(audit_actor, "recipient.erase", "recipient", recipient.user_id, diff(before, after))
    return recipient


def device_add(*, recipient: Recipient, platform: str, token: str, audit_actor: Any = None) -> tuple[Device, bool]:
    """Register a push token for a recipient (idempotent); a token seen before moves to this recipient.

    Returns the device and whether it was created. Re-registering reactivates a token only if it is not on
    the suppression list (a token the provider called invalid stays dead).
    """
    with transaction.atomic():
        device, created = Device.objects.select_for_update().get_or_create(
            platform=platform, token=token, defaults={"recipient": recipient}
        )
        previous_owner = None if created else device.recipient_id
        if not created:
            suppressed = Suppression.objects.filter(channel="push", address=token).exists()
            device.recipient = recipient
            device.active = not suppressed
            device.deactivated_at = device.deactivated_at if suppressed else None
            device.save(update_fields=["recipient", "active", "deactivated_at"])
        if created or previous_owner != recipient.pk:
            changes: dict[str, Any] = {"platform": [None, platform], "token": [None, token]}
            if previous_owner is not None:
                # A token moving between users is what an attacker would do: say from whom.
                old = Recipient.objects.filter(pk=previous_owner).values_list("user_id", flat=True).first()
                changes["moved_from_user_id"] = [old, recipient.user_id]
            _audit(audit_actor, "device.add", "recipient", recipient.user_id, changes)
    return device, created


def device_remove(*, recipient: Recipient, token: str, audit_actor: Any = None) -> int:
    """Delete a recipient's device by token; return how many were deleted."""
    deleted, _ = Device.objects.filter(recipient=recipient, token=token).delete()
    if deleted:
        _audit(audit_actor, "device.remove", "recipient", recipient.user_id, {"token": [token, None]})
    return deleted


def preferences_set(
    *,
    recipient: Recipient,
    opted_out: bool,
    channels: dict[str, bool],
    categories: dict[str, dict[str, Any]],
    quiet_start: dt.time | None,
    quiet_end: dt.time | None,
    audit_actor: Any = None,
) -> Recipient:
    """Replace a recipient's preferences with the given, already validated, ones."""
    before = _snapshot(recipient, _PREFERENCE_FIELDS)
    recipient.opted_out = opted_out
    recipient.channel_prefs = channels
    recipient.category_prefs = categories
    recipient.quiet_start = quiet_start
    recipient.quiet_end = quiet_end
    recipient.save(
        update_fields=["opted_out", "channel_prefs", "category_prefs", "quiet_start", "quiet_end", "updated_at"]
    )
    changes = diff(before, _snapshot(recipient, _PREFERENCE_FIELDS))
    if changes:
        _audit(audit_actor, "preferences.update", "recipient", recipient.user_id, changes)
    return recipient


def category_disable(*, recipient: Recipient, category: str) -> Recipient:
    """Switch one optional category off for a recipient (the one-click unsubscribe), keeping its other settings."""
    if not is_optional(category):
        raise ValueError(f"category {category!r} cannot be switched off")
    with transaction.atomic():
        recipient = Recipient.objects.select_for_update().get(pk=recipient.pk)
        prefs = dict(recipient.category_prefs or {})
        prefs[category] = {**(prefs.get(category) or {}), "enabled": False}
        recipient.category_prefs = prefs
        recipient.save(update_fields=["category_prefs", "updated_at"])
    return recipient


def suppression_remove(*, suppression: Suppression, audit_actor: Any = None) -> None:
    """Take an address off the suppression list (an operator's decision; devices stay as they are)."""
    changes = {
        "channel": [suppression.channel, None],
        "address": [suppression.address, None],
        "source": [suppression.source, None],
        "reason": [suppression.reason, None],
    }
    target = suppression.pk
    suppression.delete()
    _audit(audit_actor, "suppression.remove", "suppression", target, changes)


def topic_upsert(*, key: str, name: str) -> tuple[Topic, bool]:
    """Create or rename a topic; return it and whether it was created."""
    topic, created = Topic.objects.get_or_create(key=key, defaults={"name": name})
    if not created and topic.name != name:
        topic.name = name
        topic.save(update_fields=["name"])
    return topic, created


def topic_subscribe(*, topic: Topic, user_ids: list[str]) -> int:
    """Subscribe recipients to a topic in bulk, creating unknown recipients; return how many were added.

    Two set-based inserts with ON CONFLICT DO NOTHING (recipients, then subscriptions selected by user_id), so
    10,000 user ids cost a handful of round trips, concurrent calls never collide, and the count is exact.
    """
    unique_ids = list(dict.fromkeys(user_ids))
    if not unique_ids:
        return 0
    subscriptions = Subscription._meta.db_table
    recipients = Recipient._meta.db_table
    with transaction.atomic():
        Recipient.objects.bulk_create(
            [Recipient(user_id=uid, environment_id=topic.environment_id) for uid in unique_ids],
            ignore_conflicts=True,
            batch_size=2000,
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {subscriptions} (topic_id, recipient_id, created_at) "  # noqa: S608 - table names only
                f"SELECT %s, r.id, now() FROM {recipients} r WHERE r.environment_id = %s AND r.user_id = ANY(%s) "
                "ON CONFLICT (topic_id, recipient_id) DO NOTHING",
                [topic.pk, topic.environment_id, unique_ids],
            )
            return cursor.rowcount


def topic_unsubscribe(*, topic: Topic, user_id: str) -> int:
    """Remove a recipient from a topic; return how many subscriptions were removed."""
    deleted, _ = Subscription.objects.filter(topic=topic, recipient__user_id=user_id).delete()
    return deleted


UNSUBSCRIBE_SALT = "preferences.unsubscribe"


@functools.cache
def _unsubscribe_key(secret: str) -> bytes:
    # The key salted_hmac would derive on every call, derived once per SECRET_KEY.
    return hashlib.sha256(f"{UNSUBSCRIBE_SALT}{secret}".encode()).digest()


def _unsubscribe_mac(payload: str) -> str:
    return hmac.new(_unsubscribe_key(settings.SECRET_KEY), payload.encode(), hashlib.sha256).hexdigest()[:32]


def unsubscribe_token(*, recipient: Recipient, category: str) -> str:
    """Return a signed, URL-safe token naming a recipient and a category: `<base64 user_id/category>.<env>.<hmac>`.

    One HMAC, not django.core.signing's JSON, timestamp and base62: every optional email of a campaign carries
    one, so this is on the send path of every such delivery. The recipient's environment is signed with it: the
    same user id names another recipient in every other project environment.
    """
    payload = urlsafe_b64encode(f"{recipient.user_id}/{category}".encode()).rstrip(b"=").decode()
    signed = f"{payload}.{owner_id(recipient)}"
    return f"{signed}.{_unsubscribe_mac(signed)}"


def unsubscribe_url(*, recipient: Recipient, category: str) -> str:
    """Return the one-click unsubscribe URL (RFC 8058) for a recipient and an optional category.

    Raises ValueError for a category recipients cannot switch off: such messages carry no unsubscribe link.
    """
    if not is_optional(category):
        raise ValueError(f"category {category!r} cannot be unsubscribed from")
    base = settings.PUBLIC_BASE_URL.rstrip("/")
    return f"{base}/unsubscribe/{unsubscribe_token(recipient=recipient, category=category)}"


def unsubscribe_token_read(token: str) -> tuple[str, str, int]:
    """Return the (user_id, category, environment id) a token names; raise signing.BadSignature when it is not ours.

    A link sent before links named their environment names a recipient of the default project's live
    environment, where every recipient was then.
    """
    signed, _, mac = token.rpartition(".")
    if signed and ":" not in token:
        if not constant_time_compare(mac, _unsubscribe_mac(signed)):
            raise signing.BadSignature("unsubscribe token signature does not match")
        payload, _, owner = signed.partition(".")
        user_id, _, category = urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode().rpartition("/")
        if owner and not owner.isdigit():
            raise signing.BadSignature("malformed unsubscribe token")
        return user_id, category, int(owner) if owner else DEFAULT_LIVE_ENVIRONMENT_ID
    # Links sent before the compact format were django.core.signing tokens; they keep working.
    data = signing.loads(token, salt=UNSUBSCRIBE_SALT)
    if not isinstance(data, dict) or not isinstance(data.get("r"), str) or not isinstance(data.get("c"), str):
        raise signing.BadSignature("malformed unsubscribe token")
    return data["r"], data["c"], DEFAULT_LIVE_ENVIRONMENT_ID


PREFERENCES_SALT = "preferences.center"


@functools.cache
def _preference_signer(secret: str) -> signing.Signer:
    return signing.Signer(key=secret, salt=PREFERENCES_SALT)


def preference_token(*, user_id: str, environment_id: int, expires_at: int) -> str:
    """Return the signed token naming a recipient until `expires_at` (a Unix time).

    `<b64 user_id>.<b62 expiry>.<b62 environment id>:<sig>`: django.core.signing with a salt of its own, signing
    a compact string rather than JSON (sign_object() costs about twice as much, and every optional email carries
    a link, so this is on the send path). The expiry travels inside the signed value: each link has its own
    lifetime, which one `max_age` could not express. So does the recipient's environment: the same user id names
    another recipient in every other project environment.
    """
    payload = urlsafe_b64encode(user_id.encode()).rstrip(b"=").decode()
    value = f"{payload}.{signing.b62_encode(expires_at)}.{signing.b62_encode(environment_id)}"
    return _preference_signer(settings.SECRET_KEY).sign(value)


def preference_link(*, recipient: Recipient, ttl_seconds: int) -> tuple[str, dt.datetime]:
    """Return a signed URL to the recipient's preference center, valid for `ttl_seconds`, and when it expires."""
    expires = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=ttl_seconds)
    token = preference_token(
        user_id=recipient.user_id, environment_id=owner_id(recipient), expires_at=int(expires.timestamp())
    )
    return f"{settings.PUBLIC_BASE_URL.rstrip('/')}/preferences/{token}", expires


def preference_token_read(token: str) -> tuple[str, int]:
    """Return the (user_id, environment id) a preference-center token names.

    Raises signing.SignatureExpired for a link past its expiry, signing.BadSignature for anything not ours. A link
    minted before links named their environment names a recipient of the default project's live environment,
    where every recipient was then.
    """
    value = _preference_signer(settings.SECRET_KEY).unsign(token)
    payload, _, rest = value.partition(".")
    expiry, _, owner = rest.partition(".")
    try:
        user_id = urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
        expires_at = signing.b62_decode(expiry)
        environment_id = signing.b62_decode(owner) if owner else DEFAULT_LIVE_ENVIRONMENT_ID
    except (ValueError, UnicodeDecodeError):
        raise signing.BadSignature("malformed preference token") from None
    if expires_at <= timezone.now().timestamp():
        raise signing.SignatureExpired("preference link expired")
    return user_id, environment_id


def preferences_save_by_recipient(
    *,
    recipient: Recipient,
    opted_out: bool,
    channels: dict[str, bool],
    categories: dict[str, dict[str, Any]],
    quiet_start: dt.time | None,
    quiet_end: dt.time | None,
    timezone_name: str,
) -> Recipient:
    """Save what a recipient chose in the preference center through the API's own writes, audited as theirs.

    The writes audit themselves (`audit_actor`): "preferences.update" and, for a new time zone,
    "recipient.update", each with the recipient as the actor; an untouched form writes no entry.
    """
    actor = Actor("recipient", recipient.user_id, recipient.user_id)
    with transaction.atomic():
        recipient = Recipient.objects.select_for_update().get(pk=recipient.pk)
        if timezone_name != recipient.timezone:
            recipient, _ = recipient_upsert(user_id=recipient.user_id, timezone=timezone_name, audit_actor=actor)
        recipient = preferences_set(
            recipient=recipient,
            opted_out=opted_out,
            channels=channels,
            categories=categories,
            quiet_start=quiet_start,
            quiet_end=quiet_end,
            audit_actor=actor,
        )
    return recipient
