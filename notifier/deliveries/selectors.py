"""Reads of the core: notifications with their deliveries and events, cursor-paginated lists."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Prefetch, Q, QuerySet

from core.pagination import decode_cursor, encode_cursor
from notifier.clients.models import ApiClient
from notifier.deliveries import partitions
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from preferences.compliance import evaluate
from preferences.models import Recipient
from projects.scoping import owner_id, owner_scope
from templates_app.layouts import render
from templates_app.rendering import RenderError
from templates_app.selectors import template_version_exact

DELIVERIES_IN_DETAIL = 100


def notification_get(*, client: ApiClient, notification_id: str) -> Notification | None:
    """Return the client's notification with its first deliveries (and their events) in `.first_deliveries`."""
    notification = Notification.objects.filter(client=client, pk=notification_id).select_related("topic").first()
    if notification is None:
        return None
    notification.client = client  # its own client, already loaded: the answer's `mode` is read from it
    # A topic notification can have a million deliveries: the detail shows the first ones and the counts.
    notification.first_deliveries = list(
        notification.day_deliveries()
        .order_by("id")
        .prefetch_related(Prefetch("events", queryset=DeliveryEvent.objects.order_by("id")))[:DELIVERIES_IN_DETAIL]
    )
    return notification


def notification_delivery_counts(*, notification: Notification) -> dict[str, int]:
    """Return the number of deliveries of a notification per status."""
    rows = notification.day_deliveries().values("status").annotate(n=Count("id")).order_by()
    return {row["status"]: row["n"] for row in rows}


def notification_statuses_reached(*, notification_id: uuid.UUID | str) -> set[str]:
    """Return every status the deliveries of a notification are in or passed through (`clicked` included).

    A delivery that was opened was also sent: a condition "was it sent?" must hold for it, so the event history
    counts, not only the current status.
    """
    notification = Notification.objects.filter(pk=notification_id).first()
    if notification is None:
        return set()
    deliveries = notification.day_deliveries()
    reached = set(deliveries.values_list("status", flat=True).distinct().order_by())
    reached.update(
        DeliveryEvent.objects.filter(delivery__in=deliveries.values("id"))
        .values_list("status", flat=True)
        .distinct()
        .order_by()
    )
    return reached


def deliveries_of_notifications(*, notification_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, list[Delivery]]:
    """Return the deliveries of each notification (in id order), for answers that list another's deliveries."""
    ids = list(notification_ids)
    found: dict[uuid.UUID, list[Delivery]] = {nid: [] for nid in ids}
    if ids:
        for delivery in Delivery.objects.filter(notification_id__in=ids).order_by("id"):
            found[delivery.notification_id].append(delivery)
    return found


def _notification_position(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Return the (created_at, id) a notifications cursor points after; ValueError for anything else."""
    position = decode_cursor(cursor)
    created, last_id = position.get("c"), position.get("i")
    if not isinstance(created, str) or not isinstance(last_id, str):
        raise ValueError("invalid cursor")
    at = datetime.fromisoformat(created)  # ValueError when it is not a timestamp
    if at.tzinfo is None:
        raise ValueError("invalid cursor")
    return at, uuid.UUID(last_id)  # ValueError when it is not a UUID


def notification_list(
    *, client: ApiClient, filters: dict[str, Any], cursor: str | None, limit: int = 50
) -> tuple[list[Notification], str | None]:
    """Return a page of the client's notifications, newest first, and the cursor of the next page."""
    qs: QuerySet[Notification] = Notification.objects.filter(client=client).select_related("topic")
    if filters.get("user_id"):
        qs = qs.filter(user_id=filters["user_id"])
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    if filters.get("category"):
        qs = qs.filter(category=filters["category"])
    if cursor:
        created, last_id = _notification_position(cursor)
        qs = qs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=last_id))
    page = list(qs.order_by("-created_at", "-id")[: limit + 1])
    next_cursor = None
    if len(page) > limit:
        page = page[:limit]
        last = page[-1]
        next_cursor = encode_cursor({"c": last.created_at.isoformat(), "i": str(last.pk)})
    for notification in page:
        notification.client = client  # the answer's `mode` is the client's: no query per row
    return page, next_cursor


def notifications_by_dedup_key(dedup_key: str) -> QuerySet[Notification]:
    """Return the notifications with this dedup key, of any client (notification_dedup_idx: every client)."""
    client_ids = list(ApiClient.objects.values_list("pk", flat=True))
    return Notification.objects.filter(client_id__in=client_ids, dedup_key=dedup_key)


def delivery_search(*, query: str) -> QuerySet[Delivery]:
    """Find deliveries by what a customer or a provider can tell support: each term served by an index.

    Matches the address a delivery went to (email, phone: delivery_address_hash), the recipient's current
    email, phone or user id (recipient_email_idx, recipient_phone_idx, the user_id unique index, then
    delivery_recipient_idx), a provider message id (delivery_provider_msg_idx, with every configured provider
    as its leading column), a notification id (delivery_target_uniq), a dedup key (notification_dedup_idx,
    with every client as its leading column) and a delivery id. The ids are looked up first, so the final
    query is an OR of index conditions on literal values and its plan does not depend on join estimates.
    """
    term = query.strip()
    if not term:
        return Delivery.objects.none()
    recipient_ids = list(
        Recipient.objects.filter(Q(user_id=term) | Q(email=term) | Q(phone=term)).values_list("pk", flat=True)[:50]
    )
    notification_ids: list[Any] = []
    try:
        notification_ids.append(uuid.UUID(term))
    except ValueError:
        pass
    notification_ids += list(notifications_by_dedup_key(term).values_list("pk", flat=True)[:50])
    providers = sorted({p for names in settings.CHANNEL_PROVIDERS.values() for p in names} | _known_providers())
    condition = Q(address=term) | Q(provider__in=providers, provider_message_id=term)
    if recipient_ids:
        condition |= Q(recipient_id__in=recipient_ids)
    if notification_ids:
        condition |= Q(notification_id__in=notification_ids)
    if term.isdigit() and int(term) < 2**63:
        condition |= Q(pk=int(term))
    return Delivery.objects.filter(condition)


# Every provider name a delivery may carry (also ones configured before, not now). channels_app sits above this
# layer and adds its registry's names at start-up (ChannelsAppConfig.ready); these two exist without it.
_KNOWN_PROVIDERS: set[str] = {"sandbox", "inapp"}


def register_provider_names(names: Iterable[str]) -> None:
    """Add provider names that deliveries may carry (the delivery search looks their message ids up)."""
    _KNOWN_PROVIDERS.update(names)


def _known_providers() -> set[str]:
    """Return every provider name a delivery may carry."""
    return set(_KNOWN_PROVIDERS)


# What each event status means on a delivery's timeline (kind, label); anything else is shown as it is.
TIMELINE_KINDS: dict[str, tuple[str, str]] = {
    "queued": ("accepted", "Queued"),
    "scheduled": ("accepted", "Scheduled"),
    "sending": ("attempt", "Attempt"),
    "sent": ("attempt", "Accepted by the provider"),
    "failed": ("error", "Failed"),
    "deferred": ("wait", "Deferred"),
    "delivered": ("callback", "Delivered (provider callback)"),
    "opened": ("callback", "Opened"),
    "bounced": ("error", "Bounced (provider callback)"),
    "suppressed": ("compliance", "Suppressed"),
    "cancelled": ("wait", "Cancelled"),
    "digested": ("wait", "Folded into a digest"),
    "resent": ("resend", "Resent"),
}


def delivery_timeline(*, delivery: Delivery) -> list[dict[str, Any]]:
    """Return a delivery's whole story, oldest first: the request accepted, then every event, numbered attempts."""
    notification = delivery.notification
    entries: list[dict[str, Any]] = [
        {
            "at": notification.created_at,
            "kind": "accepted",
            "label": "Request accepted",
            "detail": f"from {notification.client.name}, template {notification.template_key}"
            + (f"@{notification.template_version}" if notification.template_version else ""),
        }
    ]
    if delivery.resent_from_id:
        entries.append(
            {
                "at": delivery.created_at,
                "kind": "resend",
                "label": "Resend of",
                "detail": f"delivery #{delivery.resent_from_id}",
                "delivery_id": delivery.resent_from_id,
            }
        )
    attempt = 0
    for event in DeliveryEvent.objects.filter(delivery_id=delivery.pk).order_by("id"):
        kind, label = TIMELINE_KINDS.get(event.status, ("other", event.status))
        if event.status == "sending":
            attempt += 1
            label = f"Attempt {attempt}"
        entry: dict[str, Any] = {
            "at": event.at,
            "kind": kind,
            "label": label,
            "detail": event.detail,
            "status": event.status,
        }
        if event.status == "resent" and event.detail.startswith("resent as #"):
            entry["delivery_id"] = event.detail.removeprefix("resent as #")
        entries.append(entry)
    return entries


def delivery_rendered(*, delivery: Delivery) -> dict[str, Any]:
    """Return the message as sent: kept content (in-app), else the same immutable version rendered again.

    A version never changes and the payload is stored, so rendering them again gives what was sent (the
    per-recipient unsubscribe link aside, which is added by the channel at send time).
    """
    if delivery.recipient.erased_at is not None:
        # Its payload and content are gone; rendering the template again would show a message made up of
        # whatever is left, so the page says what happened instead.
        return {"parts": {}, "source": "", "erased": True, "error": "Erased: the recipient's personal data was erased."}
    if delivery.content:
        return {"parts": delivery.content, "source": "stored with the delivery"}
    notification = delivery.notification
    version = delivery.template_version
    if version is None and notification.template_version:
        version = template_version_exact(
            environment_id=owner_id(notification), key=notification.template_key, version=notification.template_version
        )
    if version is None:
        return {"parts": {}, "source": "", "error": "No template version recorded."}
    locale = notification.locale or delivery.recipient.locale or version.template.default_locale
    try:
        # Staff pages read across environments: the layout is the template's environment's, as when it was sent.
        with owner_scope(owner_id(version.template)):
            rendered = render(version, channel=delivery.channel, locale=locale, payload=notification.payload)
    except RenderError as exc:
        return {"parts": {}, "source": str(version), "error": exc.message}
    parts = {name: value for name, value in rendered.parts.items() if value not in ("", {})}  # parts it has
    return {"parts": parts, "source": f"{version} rendered again in locale {rendered.locale}"}


def delivery_compliance(*, delivery: Delivery) -> dict[str, Any]:
    """Return the compliance decision taken at acceptance (its first event) and the one that would apply now."""
    first = DeliveryEvent.objects.filter(delivery_id=delivery.pk).order_by("id").first()
    verdict = evaluate(
        recipient=delivery.recipient,
        category=delivery.notification.category,
        channel=delivery.channel,
        address=delivery.address,
    )
    return {
        "at_accept": {"status": first.status, "reason": first.detail} if first else None,
        "category": delivery.notification.category,
        "now": {"action": verdict.action, "reason": verdict.reason, "until": verdict.until},
    }


# ---- statistics ------------------------------------------------------------------------------------------

# What each `group_by` key reads: a delivery's day is the day its id carries (its partition).
STATS_GROUPS = {
    "day": f"d.id >> {partitions.DAY_SHIFT}",
    "channel": "d.channel",
    "status": "d.status",
    "template": "n.template_key",
    # The id of the key that sent them; the answer names the key.
    "client": "n.client_id",
}


def delivery_stats(
    *, client: ApiClient, first: date, last: date, group_by: Sequence[str], scope: str = "client"
) -> list[dict[str, Any]]:
    """Count deliveries of the UTC days `first`..`last` (both included) per group of `group_by`.

    `scope` "client": the client's own; "project": those of every client of its project environment (grouped
    by `client`, each row names its key).

    The delivery-id range of those days prunes the deliveries to their partitions; the notifications (for the
    client and the template) are bounded by the same days, widened by NOTIFICATION_ID_SLACK: a delivery made
    just after midnight may belong to a notification of the last minutes of the day before, so the neighbouring
    partitions are read for those minutes only, through the created_at index. Days outside are never read.
    """
    low = partitions.delivery_id_bounds(first)[0]
    high = partitions.delivery_id_bounds(last)[1]
    start = partitions.day_bounds(partitions.NOTIFICATION, first)[0] - partitions.NOTIFICATION_ID_SLACK
    end = partitions.day_bounds(partitions.NOTIFICATION, last)[1] + partitions.NOTIFICATION_ID_SLACK
    columns = [STATS_GROUPS[key] for key in group_by]
    select = ", ".join([*columns, "count(*)"])
    grouping = f" GROUP BY {', '.join(map(str, range(1, len(columns) + 1)))}" if columns else ""
    ordering = f" ORDER BY {', '.join(map(str, range(1, len(columns) + 1)))}" if columns else ""
    sql = (
        f"SELECT {select} FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id"  # noqa: S608
        " WHERE d.id >= %s AND d.id < %s AND n.created_at >= %s AND n.created_at < %s"
        f" AND {'n.environment_id' if scope == 'project' else 'n.client_id'} = %s"
        f"{grouping}{ordering}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [low, high, start, end, owner_id(client) if scope == "project" else client.pk])
        rows = cursor.fetchall()
    names: dict[int, str] = {}
    if "client" in group_by:
        ids = {row[group_by.index("client")] for row in rows}
        names = dict(ApiClient.objects.filter(pk__in=ids, environment_id=owner_id(client)).values_list("pk", "name"))
    results = []
    for row in rows:
        item: dict[str, Any] = dict(zip(group_by, row[:-1], strict=True))
        if "day" in item:
            item["day"] = partitions.EPOCH + timedelta(days=int(item["day"]))
        if "client" in item:
            item["client"] = names.get(item["client"], "")
        item["count"] = row[-1]
        results.append(item)
    if "client" in group_by:  # sorted by the keys' names, as every other group is by its value
        results.sort(key=lambda item: tuple(item[key] for key in group_by))
    return results


def delivery_mode(delivery: Delivery) -> str:
    """Return "test" for a delivery of a test client's notification, else "live".

    Read from what the batch already loaded (the notification with its client): never a query. A delivery
    without them loaded counts as live.
    """
    notification = delivery._state.fields_cache.get("notification")
    client = notification._state.fields_cache.get("client") if notification is not None else None
    return "test" if client is not None and client.mode == "test" else "live"


def event_counts_by_bucket(
    start: Any,
    column: str,
    statuses: tuple[str, ...],
    *,
    bucket_seconds: int,
    environment_ids: list[int] | None = None,
) -> list[tuple[Any, ...]]:
    """Count events per bucket of `bucket_seconds`, delivery `column` and status since `start` (one grouped query).

    `environment_ids`: only the deliveries of those environments (a staff member's projects); None: all.
    """
    owners = "" if environment_ids is None else " AND d.environment_id = ANY(%s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT floor(extract(epoch FROM e.at - %s) / %s)::int AS bucket, d.{column}, e.status, count(*)"  # noqa: S608 - a column name of ours
            " FROM notifier_deliveryevent e JOIN notifier_delivery d ON d.id = e.delivery_id"
            f" WHERE e.at >= %s AND e.status = ANY(%s){owners} GROUP BY 1, 2, 3",
            [start, bucket_seconds, start, list(statuses), *([] if environment_ids is None else [environment_ids])],
        )
        return cursor.fetchall()


def outbox_state(stale_after_seconds: float) -> tuple[int, float]:
    """Return (relay backlog, age in seconds of the oldest delivery waiting in a queue).

    The backlog is what the relay has to publish: queued deliveries never published (the fast path missed
    them) or published longer ago than `stale_after_seconds`. Both read the partial index on queued
    deliveries (delivery_outbox_idx); the count stops at 100,000.
    """
    sql = """
        SELECT
          (SELECT count(*) FROM (
             SELECT 1 FROM notifier_delivery
             WHERE status = 'queued'
               AND (published_at IS NULL OR published_at < now() - make_interval(secs => %s))
             LIMIT 100000) AS backlog),
          (SELECT coalesce(extract(epoch FROM now() - min(published_at)), 0)
             FROM notifier_delivery WHERE status = 'queued' AND published_at IS NOT NULL)
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [stale_after_seconds])
        backlog, oldest = cursor.fetchone()
    return int(backlog), max(float(oldest), 0.0)
