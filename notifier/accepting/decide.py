"""What an accept decides before it writes anything: the send's rules, then what each recipient gets.

The one decision of every accept (a single, each request of a group commit, each item of a batch) and of a topic
subscriber's planning: the category, priority, template version and channels of a request (`notification_decide`),
then a recipient's deliveries in their first statuses (`recipient_decide`: compliance and the send time, the
category's frequency cap, the fallback chain). Nothing here writes; only a capped category's counter is asked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.db import InstanceBuilder
from core.errors import ApiError
from notifier.accepting.policy import send_policy
from notifier.clients.models import ApiClient
from notifier.deliveries import fallback, frequency
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.planning import delivery_plan
from preferences.models import Recipient
from projects.scoping import owner_id
from templates_app.models import TemplateVersion
from templates_app.selectors import TemplateNotFound, template_version_cached

# New deliveries, built without Model.__init__ (core.db.InstanceBuilder says why).
_deliveries = InstanceBuilder(Delivery)


def request_fingerprint(data: dict[str, Any]) -> str:
    """Return a stable hash of a request body, to tell a retry (same body) from a conflict (other body)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class AcceptDecision:
    """What accepting one request decided before anything is written."""

    category: str
    priority: str
    version: TemplateVersion
    channels: list[str]
    request_hash: str
    dedup_key: str | None


def notification_decide(
    *, client: ApiClient, data: dict[str, Any], templates: dict[str, Any] | None = None
) -> AcceptDecision:
    """Decide the category, template version, channels and priority of one validated request.

    The category and priority are notifier.accepting.policy's decision (the template decides the category; the
    category caps the priority). Raises ApiError for an unknown template or a channel the template has no
    content for (400) and for what send_policy refuses. `templates` memoizes template resolution for the length
    of one call (a batch resolves each template spec once).
    """
    spec = data["template"]
    templates = {} if templates is None else templates
    if spec not in templates:
        try:
            # Resolved once per process until a template changes (notifier/lookup_cache.py).
            templates[spec] = template_version_cached(spec, environment_id=owner_id(client))
        except TemplateNotFound as exc:
            templates[spec] = ApiError(400, "invalid", str(exc), {"template": [str(exc)]})
    found = templates[spec]
    if isinstance(found, ApiError):
        raise found
    version: TemplateVersion = found
    category, priority = send_policy(
        client=client, template_category=version.template.category, category=data.get("category"),
        priority=data.get("priority"),
    )  # fmt: skip
    return AcceptDecision(
        category=category,
        priority=priority,
        version=version,
        channels=channels_decide(data.get("channels"), version.channels, template_key=version.template.key),
        request_hash=request_fingerprint(data),
        dedup_key=data.get("dedup_key") or None,
    )


def channels_decide(
    requested: Sequence[str] | None, template_channels: Sequence[str], *, template_key: str
) -> list[str]:
    """Return the channels of a send, in order, each once: those asked for, else the template's.

    The order is a fallback chain's order of steps. Raises ApiError (400) for a channel the template has no
    content for.
    """
    channels = list(dict.fromkeys(requested or template_channels))
    missing = [c for c in channels if c not in template_channels]
    if missing:
        message = f"Template '{template_key}' has no content for channel(s): {', '.join(missing)}."
        raise ApiError(400, "invalid", message, {"channels": [message]})
    return channels


def recipient_decide(
    notification: Notification,
    recipient: Recipient,
    targets: Sequence[tuple[str, str]],
    now: datetime,
    *,
    dead: set[tuple[str, str]],
    capped: bool,
    earlier: int = 0,
) -> list[Delivery]:
    """Decide what one recipient gets of a single-recipient notification: its deliveries, unsaved, in first statuses.

    Compliance and the send time (`deliveries_plan`), then the category's frequency cap when `capped` (a person's
    allowance; not a team's channel), then the fallback chain, whose later steps wait as pending. `dead` holds
    the targets on the suppression list; `earlier` counts the notifications of this category the same accept
    already admitted for this recipient (the database's count cannot see rows not yet written). Queries nothing,
    except the cap's counter for a capped category with a delivery that would go
    (notifier/deliveries/frequency.py).
    """
    deliveries = deliveries_plan(notification, recipient, targets, now, dead=dead)
    if capped:
        frequency.apply_at_accept(notification, recipient, deliveries, earlier=earlier)
    fallback.plan_at_accept(notification, deliveries, now)
    return deliveries


def deliveries_plan(
    notification: Notification,
    recipient: Recipient,
    targets: Sequence[tuple[str, str]],
    now: datetime,
    *,
    dead: set[tuple[str, str]],
) -> list[Delivery]:
    """Return a notification's new deliveries to `targets` (channel, address), each in the status planning decides.

    A notification whose send_at is ahead of `now` is marked scheduled. `dead` holds the targets on the
    suppression list (`suppressed_addresses`, looked up by the caller for many at once); no query here.
    """
    if notification.send_at and notification.send_at > now:
        notification.status = Notification.Status.SCHEDULED
    return [
        delivery_new(notification, recipient, channel, address, now, suppressed=(channel, address) in dead)
        for channel, address in targets
    ]


def delivery_new(
    notification: Notification,
    recipient: Recipient,
    channel: str,
    address: str,
    now: datetime,
    *,
    suppressed: bool | None = None,
) -> Delivery:
    """Build a new delivery in the first status delivery planning decides (notifier/deliveries/planning.py)."""
    plan = delivery_plan(
        recipient=recipient,
        category=notification.category,
        channel=channel,
        address=address,
        send_at=notification.send_at,
        now=now,
        suppressed=suppressed,
    )
    return _deliveries.new(
        notification=notification,
        environment_id=notification.environment_id,
        recipient=recipient,
        channel=channel,
        priority=notification.priority,
        address=address,
        status=plan.status,
        reason=plan.reason,
        not_before=plan.not_before,
    )
