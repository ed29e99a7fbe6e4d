"""Typed results: plain dataclasses built from the API's JSON; `raw` keeps the whole answer."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from notifier_client.errors import NotifierError, error_for


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
    # "test" for a test key's notifications (every delivery goes to the sandbox), else "live".
    mode: str = "live"
    # Sent with `workflow`: its key and version, and (to a user) every step with its status and reason.
    workflow: str | None = None
    workflow_version: int | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
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
            mode=data.get("mode") or "live",
            workflow=data.get("workflow"),
            workflow_version=data.get("workflow_version"),
            steps=list(data.get("steps") or []),
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
class RecipientResult:
    """What a batch did with one recipient: `status` 201 created or 200 updated (refused ones are errors)."""

    user_id: str
    status: int


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


@dataclass(frozen=True)
class Template:
    """A template: its header and published version number; `raw` has every version's summary and content."""

    key: str
    category: str = ""
    default_locale: str = ""
    published_version: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Template:
        """Build from the API's JSON."""
        return cls(
            key=data["key"],
            category=data.get("category") or "",
            default_locale=data.get("default_locale") or "",
            published_version=data.get("published_version"),
            raw=data,
        )


@dataclass(frozen=True)
class TemplateVersion:
    """One version of a template (put_template answers the number; get_template_version the content too)."""

    key: str
    version: int
    published: bool = False
    content: dict[str, Any] = field(default_factory=dict)
    layout: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any], key: str = "") -> TemplateVersion:
        """Build from the API's JSON (a version body has no key: the caller's is used)."""
        return cls(
            key=data.get("key") or key,
            version=int(data["version"]),
            published=bool(data.get("published", False)),
            content=dict(data.get("content") or {}),
            layout=data.get("layout") or "",
            raw=data,
        )


@dataclass(frozen=True)
class Preview:
    """A version rendered with a sample payload: per channel, the locale used and the parts."""

    key: str
    version: int
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def parts(self, channel: str) -> dict[str, Any]:
        """Return the rendered parts of one channel ({} if the version does not serve it)."""
        return dict(self.channels.get(channel, {}).get("parts") or {})

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Preview:
        """Build from the API's JSON."""
        return cls(key=data["key"], version=int(data["version"]), channels=dict(data.get("channels") or {}), raw=data)


@dataclass(frozen=True)
class Layout:
    """An email layout in its current version (put_layout answers key and version only)."""

    key: str
    version: int
    html: str = ""
    text: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Layout:
        """Build from the API's JSON."""
        return cls(
            key=data["key"], version=int(data["version"]), html=data.get("html") or "", text=data.get("text") or "",
            raw=data,
        )  # fmt: skip


@dataclass(frozen=True)
class Quota:
    """One channel's daily quota of the key's project environment."""

    limit: int
    used: int
    resets_at: dt.datetime | None  # the next midnight UTC

    @property
    def left(self) -> int:
        """Return how many messages the channel may still send today."""
        return max(0, self.limit - self.used)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Quota:
        """Build from the API's JSON."""
        return cls(limit=int(data["limit"]), used=int(data["used"]), resets_at=parse_time(data.get("resets_at")))


@dataclass(frozen=True)
class Project:
    """The calling key's project and environment: its daily quotas by channel and its promotion rule."""

    slug: str
    name: str
    environment: str  # "live" or "test"
    quotas: dict[str, Quota] = field(default_factory=dict)  # a channel not here has no quota
    promotion: str = "direct"  # "required": live changes only by promotion from test
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Project:
        """Build from the API's JSON."""
        return cls(
            slug=data["slug"], name=data.get("name") or "", environment=data["environment"],
            quotas={channel: Quota.from_api(q) for channel, q in (data.get("quotas") or {}).items()},
            promotion=data.get("promotion") or "direct", raw=data,
        )  # fmt: skip


@dataclass(frozen=True)
class PromotionCandidate:
    """A layout, template or workflow whose version in test differs from live's, with the diff to review."""

    kind: str  # "layout", "template" or "workflow"
    key: str
    test_version: int
    live_version: int | None  # None: live has none yet
    diff: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> PromotionCandidate:
        """Build from the API's JSON."""
        live = data.get("live_version")
        return cls(
            kind=data["kind"], key=data["key"], test_version=int(data["test_version"]),
            live_version=int(live) if live is not None else None, diff=data.get("diff") or "", raw=data,
        )  # fmt: skip


@dataclass(frozen=True)
class PromotionResult:
    """One promoted item's result, in the item's place: live's new version, or the error this item alone had."""

    kind: str
    key: str
    status: int  # the HTTP status this item would have had alone: 200 promoted
    live_version: int | None = None
    error: NotifierError | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def promoted(self) -> bool:
        """Return whether live has the item's test version now."""
        return self.error is None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> PromotionResult:
        """Build from the API's JSON (an item with an error gets the error class its status maps to)."""
        status = int(data.get("status") or 200)
        live = data.get("live_version")
        return cls(
            kind=data.get("kind") or "", key=data.get("key") or "", status=status,
            live_version=int(live) if live is not None else None,
            error=error_for(status, data) if "error" in data or status >= 400 else None, raw=data,
        )  # fmt: skip


@dataclass(frozen=True)
class Campaign:
    """A campaign: a template sent to a topic now, later or on a schedule."""

    id: int
    name: str
    status: str
    template: str = ""
    topic: str = ""
    category: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Campaign:
        """Build from the API's JSON."""
        return cls(
            id=int(data["id"]),
            name=data.get("name") or "",
            status=data.get("status") or "",
            template=data.get("template") or "",
            topic=data.get("topic") or "",
            category=data.get("category") or "",
            raw=data,
        )


@dataclass(frozen=True)
class DeadLetter:
    """A delivery whose retries ran out, kept to replay or discard."""

    id: int
    delivery_id: int
    notification_id: str
    status: str = ""
    delivery_status: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> DeadLetter:
        """Build from the API's JSON."""
        return cls(
            id=int(data["id"]),
            delivery_id=int(data["delivery_id"]),
            notification_id=str(data.get("notification_id") or ""),
            status=data.get("status") or "",
            delivery_status=data.get("delivery_status") or "",
            raw=data,
        )


@dataclass(frozen=True)
class EventEndpoint:
    """Where this client's status events go; `secret` (whsec_...) only on creation and rotation."""

    url: str
    events: list[str] = field(default_factory=list)
    max_batch: int = 1
    is_active: bool = True
    secret: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> EventEndpoint:
        """Build from the API's JSON."""
        return cls(
            url=data["url"],
            events=list(data.get("events") or []),
            max_batch=int(data.get("max_batch") or 1),
            is_active=bool(data.get("is_active", True)),
            secret=data.get("secret") or None,
            raw=data,
        )


@dataclass(frozen=True)
class EventAttempt:
    """One try to deliver status events to the endpoint."""

    id: int
    ok: bool
    status_code: int | None = None
    error: str = ""
    events: int = 0
    at: dt.datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> EventAttempt:
        """Build from the API's JSON."""
        return cls(
            id=int(data["id"]),
            ok=bool(data.get("ok")),
            status_code=data.get("status_code"),
            error=data.get("error") or "",
            events=int(data.get("events") or 0),
            at=parse_time(data.get("at")),
            raw=data,
        )


@dataclass(frozen=True)
class InboxItem:
    """One message of a recipient's in-app inbox."""

    id: int
    notification_id: str
    title: str = ""
    body: str = ""
    category: str = ""
    status: str = ""
    created_at: dt.datetime | None = None
    read_at: dt.datetime | None = None
    url: str = ""
    archived_at: dt.datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> InboxItem:
        """Build from the API's JSON."""
        return cls(
            id=int(data["id"]),
            notification_id=str(data.get("notification_id") or ""),
            title=data.get("title") or "",
            body=data.get("body") or "",
            category=data.get("category") or "",
            status=data.get("status") or "",
            created_at=parse_time(data.get("created_at")),
            read_at=parse_time(data.get("read_at")),
            url=data.get("url") or "",
            archived_at=parse_time(data.get("archived_at")),
            raw=data,
        )


@dataclass(frozen=True)
class InboxUser:
    """Who an inbox token opens: the user, their locale and a signed link to their preference center."""

    user_id: str
    locale: str = ""
    preferences_url: str = ""
    preferences_expires_at: dt.datetime | None = None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> InboxUser:
        """Build from the API's JSON."""
        return cls(
            user_id=str(data["user_id"]),
            locale=data.get("locale") or "",
            preferences_url=data.get("preferences_url") or "",
            preferences_expires_at=parse_time(data.get("preferences_expires_at")),
        )


@dataclass(frozen=True)
class InboxReadAll:
    """What marking a whole inbox read did."""

    marked_read: int
    unread_count: int


@dataclass(frozen=True)
class SandboxMessage:
    """A message the sandbox provider recorded instead of sending it."""

    id: int
    delivery_id: int
    channel: str
    address: str
    content: dict[str, Any] = field(default_factory=dict)
    created_at: dt.datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SandboxMessage:
        """Build from the API's JSON."""
        return cls(
            id=int(data["id"]),
            delivery_id=int(data["delivery_id"]),
            channel=data.get("channel") or "",
            address=data.get("address") or "",
            content=dict(data.get("content") or {}),
            created_at=parse_time(data.get("created_at")),
            raw=data,
        )


@dataclass(frozen=True)
class Stats:
    """Delivery counts per group (day, channel, status, template, client) over a range of days."""

    rows: list[dict[str, Any]]
    from_day: str = ""
    to_day: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Stats:
        """Build from the API's JSON."""
        return cls(
            rows=list(data.get("results") or []),
            from_day=str(data.get("from") or ""),
            to_day=str(data.get("to") or ""),
            raw=data,
        )


@dataclass(frozen=True)
class Workflow:
    """A workflow: its key and current version; `raw` has its steps."""

    key: str
    version: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Workflow:
        """Build from the API's JSON."""
        version = data.get("version")
        return cls(key=data["key"], version=int(version) if version is not None else None, raw=data)
