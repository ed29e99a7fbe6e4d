"""Apply verified provider callbacks: move delivery statuses forward, record events, suppress addresses.

Every write here is safe to repeat. Status moves go through `transition(..., only_from=...)`, so a late or
repeated callback never moves a delivery backwards or twice; events that change no status carry the
callback's own id in their detail and are written once per delivery; suppressions are idempotent. Redis
remembers processed SNS MessageIds as the fast path that turns a replay away before it touches the database.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parseaddr
from typing import Any

import redis
from django.db import transaction
from django.db.models import QuerySet

from core import provider_accounts
from core.redis_guard import get_redis, rkey
from notifier.callbacks import conf
from notifier.callbacks.verify import (
    MalformedCallback,
    VerificationError,
    verify_sns_message,
    verify_twilio_request,
    visit_subscribe_url,
)
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.partitions import recent_delivery_ids
from notifier.deliveries.status import CLICKED, record_events, transition
from preferences.services import suppression_add

logger = logging.getLogger(__name__)

S = Delivery.Status
# Where each outcome may come from: statuses only move forward (sent → delivered → opened), and a hard
# bounce may still follow a "delivery" (the receiving server accepted, then bounced asynchronously).
DELIVERED_FROM = (S.SENT,)
OPENED_FROM = (S.SENT, S.DELIVERED)
BOUNCED_FROM = (S.SENDING, S.SENT, S.DELIVERED)
FAILED_FROM = (S.SENDING, S.SENT)

TWILIO_STOP_ERROR_CODE = "21610"  # "Attempt to send to unsubscribed recipient": the number replied STOP.
_TWILIO_STATUS_RE = re.compile(r"^[a-z_]{1,32}$")


class ReplayedCallback(VerificationError):
    """A callback with an id already processed: it is turned away and changes nothing."""


@dataclass
class CallbackResult:
    """What one callback did (returned to the caller, and logged without personal data)."""

    kind: str
    matched: int = 0
    moved: list[int] = field(default_factory=list)
    events: int = 0
    suppressed: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-able dict."""
        return {
            "kind": self.kind,
            "matched": self.matched,
            "moved": len(self.moved),
            "events": self.events,
            "suppressed": self.suppressed,
        }


def _claim_once(kind: str, ident: str) -> bool:
    """Remember `ident` as processed; return False if it already was.

    When Redis is unreachable the claim is granted: the idempotent writes below are the backstop.
    """
    try:
        return bool(get_redis().set(rkey("cb", kind, ident), "1", nx=True, ex=conf.callback_dedup_ttl_seconds()))
    except redis.RedisError:
        logger.warning("callback dedup unavailable (Redis); relying on idempotent writes", extra={"cb": kind})
        return True


def _release(kind: str, ident: str) -> None:
    """Forget a claim whose processing failed, so the provider's retry is processed."""
    try:
        get_redis().delete(rkey("cb", kind, ident))
    except redis.RedisError:
        logger.warning("could not release callback claim", extra={"cb": kind})


def _norm_email(address: str) -> str:
    return parseaddr(address)[1].strip().lower()


def _targets(deliveries: Sequence[Delivery], addresses: Iterable[object] | None) -> list[Delivery]:
    """Return the deliveries an event is about: those whose address is listed, or all when none are listed.

    `addresses` come from the provider's JSON: anything that is not a non-empty string is skipped.
    """
    wanted = {_norm_email(a) for a in (addresses or []) if isinstance(a, str) and a}
    if not wanted:
        return list(deliveries)
    return [d for d in deliveries if _norm_email(d.address) in wanted]


def _record_once(deliveries: Sequence[Delivery], detail: str, status: str = "", *, forget_erased: bool = False) -> int:
    """Append an event that changes no status (`status`, else the delivery's current one), once per detail.

    `forget_erased`: for an erased recipient's delivery only the detail's first word is kept (record_events).
    """
    ids = [d.pk for d in deliveries]
    if not ids:
        return 0
    seen = set(DeliveryEvent.objects.filter(delivery_id__in=ids, detail=detail).values_list("delivery_id", flat=True))
    current = dict(Delivery.objects.filter(pk__in=ids).values_list("pk", "status"))
    rows = [(did, status or current[did], detail) for did in ids if did not in seen and did in current]
    record_events(rows, existing=forget_erased, forget_erased=forget_erased)
    return len(rows)


def _suppress(*, channel: str, addresses: Iterable[str], source: str, reason: str) -> int:
    """Put addresses on the suppression list (idempotent)."""
    count = 0
    for address in dict.fromkeys(a for a in addresses if a):
        suppression_add(channel=channel, address=address, source=source, reason=reason)
        count += 1
    return count


# --- Amazon SES via SNS ----------------------------------------------------------------------------------


def sns_message_handle(*, message: Mapping[str, Any]) -> CallbackResult:
    """Verify one SNS HTTP message and act on it: confirm a subscription or apply an SES event.

    Raises MalformedCallback (400), VerificationError / ReplayedCallback (403).
    """
    verify_sns_message(message)
    msg_type = message["Type"]
    message_id = message["MessageId"]
    if msg_type == "UnsubscribeConfirmation":
        logger.info("SNS unsubscribe confirmation received", extra={"sns_message_id": message_id})
        return CallbackResult(kind="unsubscribe_confirmation")
    event: Any = None
    if msg_type == "Notification":
        try:
            event = json.loads(message["Message"])
        except ValueError as exc:
            raise MalformedCallback("Message is not JSON") from exc
        if not isinstance(event, dict):
            raise MalformedCallback("Message is not a JSON object")
    if not _claim_once("sns", message_id):
        raise ReplayedCallback("message already processed")
    try:
        if msg_type == "SubscriptionConfirmation":
            return _sns_subscription_confirm(message=message)
        return ses_event_apply(event=event, sns_message_id=message_id)
    except BaseException:
        _release("sns", message_id)
        raise


def _sns_subscription_confirm(*, message: Mapping[str, Any]) -> CallbackResult:
    """Confirm the subscription by visiting SubscribeURL, only when it is on an allowed SNS host."""
    url = message.get("SubscribeURL")
    if not isinstance(url, str) or not url:
        raise MalformedCallback("SubscribeURL is missing")
    status = visit_subscribe_url(url)
    if status != 200:
        raise VerificationError(f"SubscribeURL answered {status}")
    logger.info("SNS subscription confirmed", extra={"topic_arn": message.get("TopicArn")})
    return CallbackResult(kind="subscription_confirmation")


def provider_message_queries(
    provider: str | tuple[str, ...], message_id: str, fields: tuple[str, ...]
) -> tuple[QuerySet[Delivery], QuerySet[Delivery]]:
    """Return the queries for the deliveries a provider's message id names: in the recent days, and anywhere.

    A status callback comes minutes after the send, and almost every send is of a delivery made in the last
    CALLBACK_RECENT_DAYS days (its id says its day), so the first query touches that many partitions; the rest
    (a delivery scheduled far ahead, an unknown id) pay one probe of each partition's partial index.
    """
    # A project's named accounts of that provider send under their own names (core.provider_accounts).
    names = provider_accounts.names_of_provider(*((provider,) if isinstance(provider, str) else provider))
    found = Delivery.objects.filter(provider_message_id=message_id).only(*fields)
    found = found.filter(provider=names[0]) if len(names) == 1 else found.filter(provider__in=names)
    low, high = recent_delivery_ids()
    return found.filter(id__gte=low, id__lt=high), found


def _by_provider_message(provider: str | tuple[str, ...], message_id: str, fields: tuple[str, ...]) -> list[Delivery]:
    """Return the deliveries a provider's message id names, looking in the recent days first."""
    recent, anywhere = provider_message_queries(provider, message_id, fields)
    return list(recent) or list(anywhere)


def ses_event_apply(*, event: Mapping[str, Any], sns_message_id: str) -> CallbackResult:
    """Apply one SES event (notification or event-publishing format) to the deliveries it is about."""
    kind = str(event.get("eventType") or event.get("notificationType") or "")
    mail = event.get("mail")
    ses_message_id = mail.get("messageId") if isinstance(mail, dict) else None
    if not kind or not isinstance(ses_message_id, str) or not ses_message_id:
        raise MalformedCallback("not an SES event (eventType/notificationType and mail.messageId required)")
    result = CallbackResult(kind=kind.lower())
    with transaction.atomic():
        deliveries = _by_provider_message("ses", ses_message_id, ("id", "address", "status"))
        result.matched = len(deliveries)
        if not deliveries:
            logger.info("SES event for an unknown message", extra={"ses_event": kind, "sns_message_id": sns_message_id})
            return result
        tag = f"sns:{sns_message_id}"
        if kind == "Delivery":
            body = _section(event, "delivery")
            targets = _targets(deliveries, body.get("recipients"))
            result.moved = transition(
                [d.pk for d in targets], to=S.DELIVERED, only_from=DELIVERED_FROM, detail=f"ses:delivery {tag}"
            )
        elif kind == "Open":
            result.moved = transition(
                [d.pk for d in deliveries], to=S.OPENED, only_from=OPENED_FROM, detail=f"ses:open {tag}"
            )
        elif kind == "Click":
            # Counted as our own redirect counts a click: a `clicked` event (notifier/tracking).
            body = _section(event, "click")
            link = str(body.get("link") or "")[:900]
            detail = f"ses:click {tag} {link}".strip()
            result.events = _record_once(deliveries, detail, status=CLICKED, forget_erased=True)
        elif kind == "Bounce":
            _apply_ses_bounce(event, deliveries, tag, result)
        elif kind == "Complaint":
            body = _section(event, "complaint")
            listed = [r.get("emailAddress") for r in body.get("complainedRecipients") or [] if isinstance(r, dict)]
            targets = _targets(deliveries, listed)
            feedback = _token(body.get("complaintFeedbackType")) or "unknown"
            result.events = _record_once(targets, f"ses:complaint {feedback} {tag}")
            result.suppressed = _suppress(
                channel="email",
                addresses=[d.address for d in targets],
                source="complaint",
                reason=f"SES complaint ({feedback})",
            )
        else:
            result.kind = f"ignored:{kind.lower()}"[:64]
    logger.info(
        "SES event applied",
        extra={"ses_event": kind, "matched": result.matched, "moved": len(result.moved), "events": result.events},
    )
    return result


def _section(event: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Return `event[key]` when it is a JSON object, else an empty one."""
    value = event.get(key)
    return value if isinstance(value, dict) else {}


def _token(value: Any) -> str:
    """Keep a provider-supplied label to a short, log-safe token."""
    return re.sub(r"[^A-Za-z0-9_.-]", "", str(value or ""))[:64]


def _apply_ses_bounce(
    event: Mapping[str, Any], deliveries: Sequence[Delivery], tag: str, result: CallbackResult
) -> None:
    """Permanent bounce: `bounced` and suppress the address; transient or undetermined: an event only."""
    body = _section(event, "bounce")
    listed = [r.get("emailAddress") for r in body.get("bouncedRecipients") or [] if isinstance(r, dict)]
    targets = _targets(deliveries, listed)
    bounce_type = _token(body.get("bounceType")) or "Undetermined"
    detail = f"ses:bounce {bounce_type}/{_token(body.get('bounceSubType')) or 'General'} {tag}"
    if bounce_type == "Permanent":
        result.moved = transition(
            [d.pk for d in targets],
            to=S.BOUNCED,
            only_from=BOUNCED_FROM,
            detail=detail,
            fields={"last_error": detail, "reason": "hard bounce"},
        )
        result.suppressed = _suppress(
            channel="email", addresses=[d.address for d in targets], source="bounce", reason="SES permanent bounce"
        )
    else:
        result.events = _record_once(targets, detail)


# --- Twilio --------------------------------------------------------------------------------------------


def twilio_status_handle(
    *, urls: Sequence[str], params: Mapping[str, Any], signature: str, headers: Mapping[str, str]
) -> CallbackResult:
    """Verify a Twilio message status callback and apply it to the delivery with that MessageSid."""
    verify_twilio_request(urls=urls, params=params, signature=signature, headers=headers)
    sid = params.get("MessageSid") or params.get("SmsSid") or ""
    status = str(params.get("MessageStatus") or params.get("SmsStatus") or "").lower()
    if not sid or not _TWILIO_STATUS_RE.match(status):
        raise MalformedCallback("MessageSid and MessageStatus are required")
    error_code = _token(params.get("ErrorCode"))
    result = CallbackResult(kind=f"twilio:{status}")
    with transaction.atomic():
        # SMS and WhatsApp messages of the installation's account and of every named account.
        deliveries = _by_provider_message(conf.TWILIO_KINDS, sid, ("id", "address", "channel"))
        result.matched = len(deliveries)
        ids = [d.pk for d in deliveries]
        detail = f"twilio:{status}" + (f" ErrorCode={error_code}" if error_code else "")
        if status == "delivered":
            result.moved = transition(ids, to=S.DELIVERED, only_from=DELIVERED_FROM, detail=detail)
        elif status == "read":
            result.moved = transition(ids, to=S.OPENED, only_from=OPENED_FROM, detail=detail)
        elif status in {"undelivered", "failed"}:
            result.moved = transition(
                ids, to=S.FAILED, only_from=FAILED_FROM, detail=detail, fields={"last_error": detail, "reason": status}
            )
            if error_code == TWILIO_STOP_ERROR_CODE:
                for channel in sorted({d.channel for d in deliveries}):
                    result.suppressed += _suppress(
                        channel=channel,
                        addresses=[d.address for d in deliveries if d.channel == channel],
                        source="stop",
                        reason="Twilio 21610: recipient replied STOP",
                    )
        else:
            result.events = _record_once(deliveries, detail)
    logger.info(
        "Twilio status applied",
        extra={"twilio_status": status, "matched": result.matched, "moved": len(result.moved)},
    )
    return result
