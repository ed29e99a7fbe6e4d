"""Typed results: plain dataclasses built from the API's JSON; `raw` keeps the whole answer."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any


def parse_time(value: Any) -> dt.datetime | None:
    """Parse an ISO 8601 time as the API writes it ("...Z" or "+00:00"); None stays None."""
    if not value:
        return None
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return dt.datetime.fromisoformat(text)


@dataclass(frozen=True)
class DeliveryEvent:
    """One step of a delivery's status history."""

    status: str
    detail: str
    at: dt.datetime | None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> DeliveryEvent:
        """Build from the API's JSON."""
        return cls(status=data.get("status", ""), detail=data.get("detail") or "", at=parse_time(data.get("at")))


@dataclass(frozen=True)
class Delivery:
    """A notification on one channel to one recipient."""

    id: int
    channel: str
    status: str
    reason: str = ""
    provider: str | None = None
    provider_message_id: str | None = None
    attempts: int | None = None
    last_error: str | None = None
    events: list[DeliveryEvent] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Delivery:
        """Build from the API's JSON."""
        return cls(
            id=data["id"],
            channel=data.get("channel", ""),
            status=data.get("status", ""),
            reason=data.get("reason") or "",
            provider=data.get("provider") or None,
            provider_message_id=data.get("provider_message_id") or None,
            attempts=data.get("attempts"),
            last_error=data.get("last_error") or None,
            events=[DeliveryEvent.from_api(e) for e in data.get("events") or []],
            raw=data,
        )


@dataclass(frozen=True)
class Notification:
    """A notification: what send() answers (status "accepted") and what get() and the lists show."""

    id: str
    status: str
    duplicate: bool = False
    deliveries: list[Delivery] = field(default_factory=list)
    category: str | None = None
    template: str | None = None
    user_id: str | None = None
    topic: str | None = None
    dedup_key: str | None = None
    created_at: dt.datetime | None = None
    delivery_counts: dict[str, int] = field(default_factory=dict)
    recipients_total: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Notification:
        """Build from the API's JSON."""
        return cls(
            id=str(data["id"]),
            status=data.get("status", ""),
            duplicate=bool(data.get("duplicate", False)),
            deliveries=[Delivery.from_api(d) for d in data.get("deliveries") or []],
            category=data.get("category"),
            template=data.get("template"),
            user_id=data.get("user_id"),
            topic=data.get("topic"),
            dedup_key=data.get("dedup_key"),
            created_at=parse_time(data.get("created_at")),
            delivery_counts=dict(data.get("delivery_counts") or {}),
            recipients_total=data.get("recipients_total"),
            raw=data,
        )


@dataclass(frozen=True)
class CancelResult:
    """What cancel() answers: how many deliveries were cancelled."""

    id: str
    cancelled: int
    status: str = "cancelled"


@dataclass(frozen=True)
class Recipient:
    """A recipient; `id` is the caller's own user id."""

    id: str
    email: str = ""
    phone: str = ""
    locale: str = ""
    timezone: str = ""
    webhook_url: str = ""
    devices: list[dict[str, Any]] = field(default_factory=list)
    preferences: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def user_id(self) -> str:
        """The caller's user id (the same as `id`)."""
        return self.id

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Recipient:
        """Build from the API's JSON."""
        return cls(
            id=data["user_id"],
            email=data.get("email") or "",
            phone=data.get("phone") or "",
            locale=data.get("locale") or "",
            timezone=data.get("timezone") or "",
            webhook_url=data.get("webhook_url") or "",
            devices=list(data.get("devices") or []),
            preferences=dict(data.get("preferences") or {}),
            raw=data,
        )


@dataclass(frozen=True)
class Preferences:
    """A recipient's preferences, in the API's shape."""

    opted_out: bool = False
    channels: dict[str, bool] = field(default_factory=dict)
    categories: dict[str, dict[str, Any]] = field(default_factory=dict)
    quiet_hours: dict[str, str] | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Preferences:
        """Build from the API's JSON."""
        return cls(
            opted_out=bool(data.get("opted_out", False)),
            channels=dict(data.get("channels") or {}),
            categories=dict(data.get("categories") or {}),
            quiet_hours=data.get("quiet_hours"),
        )

    def to_api(self) -> dict[str, Any]:
        """Return the API's JSON for a PUT."""
        return {
            "opted_out": self.opted_out,
            "channels": self.channels,
            "categories": self.categories,
            "quiet_hours": self.quiet_hours,
        }


@dataclass(frozen=True)
class Topic:
    """A topic; `id` is its key."""

    id: str
    name: str = ""
    subscribers: int = 0
    created_at: dt.datetime | None = None

    @property
    def key(self) -> str:
        """The topic's key (the same as `id`)."""
        return self.id

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Topic:
        """Build from the API's JSON."""
        return cls(
            id=data["key"],
            name=data.get("name") or "",
            subscribers=int(data.get("subscribers") or 0),
            created_at=parse_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class SubscribeResult:
    """How many subscriptions a call added, and the topic's total."""

    added: int
    total: int


@dataclass(frozen=True)
class Suppression:
    """An address Notifier will not send to on a channel."""

    id: int
    channel: str
    address: str
    reason: str = ""
    source: str = ""
    created_at: dt.datetime | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Suppression:
        """Build from the API's JSON."""
        return cls(
            id=data["id"],
            channel=data["channel"],
            address=data["address"],
            reason=data.get("reason") or "",
            source=data.get("source") or "",
            created_at=parse_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class InboxToken:
    """A short-lived token for one user's inbox, to hand to a front end."""

    token: str
    expires_at: dt.datetime | None


@dataclass(frozen=True)
class PreferenceLink:
    """A signed, expiring link to a recipient's preference center."""

    url: str
    expires_at: dt.datetime | None
