"""What the sync and async clients share: building each request, reading each answer, and the retry policy.

Each API call is a `Call`: method, path, body, query and a parser of the answer. The two clients differ only in
how they send it (and sleep between retries), so everything that could disagree between them lives here.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import importlib.metadata as _metadata
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from notifier_client.errors import NotifierConnectionError, NotifierError, error_for
from notifier_client.models import (
    Campaign,
    CancelResult,
    DeadLetter,
    EventAttempt,
    EventEndpoint,
    InboxItem,
    InboxReadAll,
    InboxToken,
    InboxUser,
    Layout,
    Notification,
    PreferenceLink,
    Preferences,
    Preview,
    Project,
    PromotionCandidate,
    PromotionResult,
    Recipient,
    RecipientResult,
    SandboxMessage,
    Stats,
    SubscribeResult,
    Suppression,
    Template,
    TemplateVersion,
    Topic,
    Workflow,
    parse_time,
)

try:  # the installed distribution's version: one number, set in pyproject.toml (the service's own release)
    __version__ = _metadata.version("notifier-client")
except _metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
T = TypeVar("T")
USER_AGENT = f"notifier-client-python/{__version__}"
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer."""

    method: str
    path: str  # relative to /api/v1/; one starting with "/" is relative to the server's root
    parse: Callable[[Any], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None  # on top of the client's (an inbox token's Authorization)

    @property
    def url(self) -> str:
        """Return the path to request, relative to the client's base URL (the server's root)."""
        return self.path.lstrip("/") if self.path.startswith("/") else f"api/v1/{self.path}"


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list."""

    items: list[T]
    next_cursor: str | None


@dataclass
class RetryPolicy:
    """Retry 429, 5xx and connection errors: at most `max_retries` more attempts within `budget_seconds` in all.

    The wait is the server's Retry-After when it sends one, else exponential backoff with jitter from
    `backoff_seconds` up to `max_backoff_seconds`. A wait that would end past the budget is not taken: the
    error is raised instead, so a call never blocks much longer than the budget.
    """

    max_retries: int = 3
    budget_seconds: float = 30.0
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    random: Callable[[], float] = field(default=random.random, repr=False)

    def delay(self, *, attempt: int, elapsed: float, failure: NotifierError) -> float | None:
        """Return how long to wait before retrying after `failure` on attempt `attempt` (0-based), or None."""
        if attempt >= self.max_retries or not is_retryable(failure):
            return None
        if failure.retry_after is not None:
            wait = max(0.0, failure.retry_after)
        else:
            ceiling = min(self.max_backoff_seconds, self.backoff_seconds * (2**attempt))
            wait = ceiling * (0.5 + self.random() / 2)
        if elapsed + wait > self.budget_seconds:
            return None
        return wait


def is_retryable(failure: NotifierError) -> bool:
    """Return whether a failure may succeed when tried again (429, 5xx, no answer)."""
    if isinstance(failure, NotifierConnectionError):
        return True
    return failure.status is not None and (failure.status == 429 or failure.status >= 500)


def retry_after_seconds(value: str | None, *, now: dt.datetime | None = None) -> float | None:
    """Parse a Retry-After header: delta seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - (now or dt.datetime.now(dt.UTC))).total_seconds())


def failure_from_response(response: httpx.Response) -> NotifierError:
    """Return the error an answer of 400 or more stands for."""
    try:
        body = response.json()
    except ValueError:
        body = None
    return error_for(response.status_code, body, retry_after_seconds(response.headers.get("Retry-After")))


def failure_from_transport(exc: httpx.TransportError) -> NotifierConnectionError:
    """Return the error for a request that got no answer."""
    return NotifierConnectionError(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def result(call: Call[T], response: httpx.Response) -> T:
    """Return the parsed answer of a successful call, or raise its error."""
    if response.status_code >= 400:
        raise failure_from_response(response)
    body = response.json() if response.content else None
    return call.parse(body)


def client_options(
    *, base_url: str, api_key: str, timeout: float | httpx.Timeout, headers: Mapping[str, str] | None
) -> dict[str, Any]:
    """Return the httpx client options both clients use."""
    if not api_key:
        raise ValueError("api_key is required")
    return {
        "base_url": base_url.rstrip("/") + "/",
        "headers": {
            "Authorization": f"Bearer {api_key}",
            "User-Agent": USER_AGENT,
            "Accept": "application/json",
            **(headers or {}),
        },
        "timeout": timeout,
    }


# --- Request builders -------------------------------------------------------------------------------------


def _seg(value: str) -> str:
    # user ids may hold anything but a slash (spaces, @, +): one path segment each.
    return quote(str(value), safe="")


def new_dedup_key() -> str:
    """Return a fresh idempotency key: one per send() call, reused by that call's retries."""
    return f"nc-{uuid.uuid4().hex}"


def notification_body(
    *,
    recipient: str | Mapping[str, Any] | None = None,
    topic: str | None = None,
    template: str | None = None,
    workflow: str | None = None,
    channels: Sequence[str] | None = None,
    payload: Mapping[str, Any] | None = None,
    dedup_key: str | None = None,
    category: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """Return the JSON body of one notification, with a generated dedup_key when none is given.

    `recipient` is a user id or `{"user_id": ...}`; `template` names one message, `workflow` a workflow to run
    instead; `more` carries any other field of the API (priority, locale, send_at, strategy...) as is; None
    values are left out.
    """
    if (template is None) == (workflow is None):
        raise ValueError("give exactly one of template and workflow")
    body: dict[str, Any] = {"template": template} if template is not None else {"workflow": workflow}
    if recipient is not None:
        body["recipient"] = {"user_id": recipient} if isinstance(recipient, str) else dict(recipient)
    if topic is not None:
        body["topic"] = topic
    optional: dict[str, Any] = {"channels": list(channels) if channels is not None else None, "payload": payload}
    optional |= {"category": category, **more}
    for name, value in optional.items():
        if value is not None:
            body[name] = value.isoformat() if isinstance(value, dt.datetime) else value
    body["dedup_key"] = dedup_key or new_dedup_key()
    return body


def _batch_result(body: Any) -> list[Notification | NotifierError]:
    out: list[Notification | NotifierError] = []
    for item in body["results"]:
        if "error" in item:
            out.append(error_for(int(item.get("status") or 400), item))
        else:
            out.append(Notification.from_api(item))
    return out


def send(**kwargs: Any) -> Call[Notification]:
    """POST /notifications."""
    return Call("POST", "notifications", Notification.from_api, json=notification_body(**kwargs))


def send_batch(items: Sequence[Mapping[str, Any]]) -> Call[list[Notification | NotifierError]]:
    """POST /notifications/batch; each item takes send()'s arguments and gets its own dedup_key if it has none."""
    bodies = [notification_body(**dict(item)) for item in items]
    return Call("POST", "notifications/batch", _batch_result, json={"notifications": bodies})


def get(notification_id: str) -> Call[Notification]:
    """GET /notifications/{id}."""
    return Call("GET", f"notifications/{_seg(notification_id)}", Notification.from_api)


def cancel(notification_id: str) -> Call[CancelResult]:
    """POST /notifications/{id}/cancel."""
    return Call(
        "POST",
        f"notifications/{_seg(notification_id)}/cancel",
        lambda b: CancelResult(id=str(b["id"]), cancelled=int(b["cancelled"])),
    )


def _page(parse_item: Callable[[Any], T]) -> Callable[[Any], Page[T]]:
    # Every list answers `results`; a few older ones answered `items` (and still do, beside it).
    def parse(body: Any) -> Page[T]:
        items = body["results"] if "results" in body else body.get("items") or []
        return Page([parse_item(item) for item in items], body.get("next_cursor") or None)

    return parse


def _query(cursor: str | None, **filters: Any) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, value in filters.items():
        if value is None:
            continue
        params[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if cursor:
        params["cursor"] = cursor
    return params


def list_notifications(
    *,
    cursor: str | None = None,
    limit: int | None = None,
    user_id: str | None = None,
    status: str | None = None,
    category: str | None = None,
) -> Call[Page[Notification]]:
    """GET /notifications (one page)."""
    params = _query(cursor, limit=limit, user_id=user_id, status=status, category=category)
    return Call("GET", "notifications", _page(Notification.from_api), params=params)


def list_suppressions(
    *, cursor: str | None = None, limit: int | None = None, channel: str | None = None, address: str | None = None
) -> Call[Page[Suppression]]:
    """GET /suppressions (one page)."""
    params = _query(cursor, limit=limit, channel=channel, address=address)
    return Call("GET", "suppressions", _page(Suppression.from_api), params=params)


def add_suppression(*, channel: str, address: str, reason: str = "") -> Call[Suppression]:
    """POST /suppressions."""
    body = {"channel": channel, "address": address, "reason": reason}
    return Call("POST", "suppressions", Suppression.from_api, json=body)


def remove_suppression(suppression_id: int) -> Call[None]:
    """DELETE /suppressions/{id}."""
    return Call("DELETE", f"suppressions/{int(suppression_id)}", lambda _: None)


def put_recipient(user_id: str, **fields: Any) -> Call[Recipient]:
    """PUT /recipients/{user_id}: only the fields given are changed."""
    return Call("PUT", f"recipients/{_seg(user_id)}", Recipient.from_api, json=fields)


def _recipients_result(body: Any) -> list[RecipientResult | NotifierError]:
    out: list[RecipientResult | NotifierError] = []
    for item in body["results"]:
        if "error" in item:
            out.append(error_for(int(item.get("status") or 400), item))
        else:
            out.append(RecipientResult(user_id=str(item["user_id"]), status=int(item["status"])))
    return out


def put_recipients(recipients: Sequence[Mapping[str, Any]]) -> Call[list[RecipientResult | NotifierError]]:
    """POST /recipients/batch: up to 1,000 recipients (each `user_id` and put_recipient's fields, `topics`)."""
    return Call("POST", "recipients/batch", _recipients_result, json={"recipients": [dict(r) for r in recipients]})


def get_recipient(user_id: str) -> Call[Recipient]:
    """GET /recipients/{user_id}."""
    return Call("GET", f"recipients/{_seg(user_id)}", Recipient.from_api)


def delete_recipient(user_id: str) -> Call[None]:
    """DELETE /recipients/{user_id}: erase the recipient's personal data."""
    return Call("DELETE", f"recipients/{_seg(user_id)}", lambda _: None)


def add_device(user_id: str, *, token: str, platform: str = "fcm") -> Call[dict[str, Any]]:
    """POST /recipients/{user_id}/devices."""
    body = {"platform": platform, "token": token}
    return Call("POST", f"recipients/{_seg(user_id)}/devices", dict, json=body)


def remove_device(user_id: str, token: str) -> Call[None]:
    """DELETE /recipients/{user_id}/devices/{token}."""
    return Call("DELETE", f"recipients/{_seg(user_id)}/devices/{_seg(token)}", lambda _: None)


def get_preferences(user_id: str) -> Call[Preferences]:
    """GET /recipients/{user_id}/preferences."""
    return Call("GET", f"recipients/{_seg(user_id)}/preferences", Preferences.from_api)


def set_preferences(user_id: str, preferences: Preferences | Mapping[str, Any]) -> Call[Preferences]:
    """PUT /recipients/{user_id}/preferences: replaces the whole document."""
    body = preferences.to_api() if isinstance(preferences, Preferences) else dict(preferences)
    return Call("PUT", f"recipients/{_seg(user_id)}/preferences", Preferences.from_api, json=body)


def put_topic(key: str, *, name: str = "") -> Call[Topic]:
    """PUT /topics/{key}."""
    return Call("PUT", f"topics/{_seg(key)}", Topic.from_api, json={"name": name})


def get_topic(key: str) -> Call[Topic]:
    """GET /topics/{key}."""
    return Call("GET", f"topics/{_seg(key)}", Topic.from_api)


def subscribe(key: str, user_ids: Sequence[str]) -> Call[SubscribeResult]:
    """POST /topics/{key}/subscribers (up to 10,000 user ids per call)."""
    return Call(
        "POST",
        f"topics/{_seg(key)}/subscribers",
        lambda b: SubscribeResult(added=int(b["added"]), total=int(b["total"])),
        json={"user_ids": list(user_ids)},
    )


def unsubscribe(key: str, user_id: str) -> Call[None]:
    """DELETE /topics/{key}/subscribers/{user_id}."""
    return Call("DELETE", f"topics/{_seg(key)}/subscribers/{_seg(user_id)}", lambda _: None)


def _ttl_body(ttl_seconds: int | None) -> dict[str, int]:
    return {} if ttl_seconds is None else {"ttl_seconds": int(ttl_seconds)}


def create_inbox_token(user_id: str, *, ttl_seconds: int | None = None) -> Call[InboxToken]:
    """POST /recipients/{user_id}/inbox-token."""
    return Call(
        "POST",
        f"recipients/{_seg(user_id)}/inbox-token",
        lambda b: InboxToken(token=b["token"], expires_at=parse_time(b.get("expires_at"))),
        json=_ttl_body(ttl_seconds),
    )


def create_preference_link(user_id: str, *, ttl_seconds: int | None = None) -> Call[PreferenceLink]:
    """POST /recipients/{user_id}/preference-link."""
    return Call(
        "POST",
        f"recipients/{_seg(user_id)}/preference-link",
        lambda b: PreferenceLink(url=b["url"], expires_at=parse_time(b.get("expires_at"))),
        json=_ttl_body(ttl_seconds),
    )


def _none(_: Any) -> None:
    return None


def _drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


# --- Recipients, topics: lists --------------------------------------------------------------------------


def list_recipients(
    *, cursor: str | None = None, limit: int | None = None, email: str | None = None, phone: str | None = None
) -> Call[Page[Recipient]]:
    """GET /recipients (one page), optionally those with one email address or phone number."""
    params = _query(cursor, limit=limit, email=email, phone=phone)
    return Call("GET", "recipients", _page(Recipient.from_api), params=params)


def list_topics(*, cursor: str | None = None, limit: int | None = None) -> Call[Page[Topic]]:
    """GET /topics (one page)."""
    return Call("GET", "topics", _page(Topic.from_api), params=_query(cursor, limit=limit))


# --- Inbox (with the API key, for a user) and the browser inbox (with that user's inbox token) ------------


def list_inbox(
    user_id: str, *, cursor: str | None = None, limit: int | None = None, unread: bool | None = None
) -> Call[Page[InboxItem]]:
    """GET /recipients/{user_id}/inbox (one page)."""
    params = _query(cursor, limit=limit, unread=unread)
    return Call("GET", f"recipients/{_seg(user_id)}/inbox", _page(InboxItem.from_api), params=params)


def mark_inbox_read(user_id: str, delivery_id: int) -> Call[InboxItem]:
    """POST /recipients/{user_id}/inbox/{id}/read."""
    return Call("POST", f"recipients/{_seg(user_id)}/inbox/{int(delivery_id)}/read", InboxItem.from_api)


def inbox_item_action(user_id: str, delivery_id: int, action: str) -> Call[InboxItem]:
    """POST /recipients/{user_id}/inbox/{id}/{archive|unarchive|click}."""
    return Call("POST", f"recipients/{_seg(user_id)}/inbox/{int(delivery_id)}/{action}", InboxItem.from_api)


def _read_all(body: Any) -> InboxReadAll:
    return InboxReadAll(marked_read=int(body["marked_read"]), unread_count=int(body["unread_count"]))


def mark_inbox_all_read(user_id: str) -> Call[InboxReadAll]:
    """POST /recipients/{user_id}/inbox/read-all."""
    return Call("POST", f"recipients/{_seg(user_id)}/inbox/read-all", _read_all)


def _token_header(token: str) -> dict[str, str]:
    if not token:
        raise ValueError("an inbox token is required")
    return {"Authorization": f"Bearer {token}"}


def list_browser_inbox(
    token: str, *, cursor: str | None = None, limit: int | None = None, unread: bool | None = None
) -> Call[Page[InboxItem]]:
    """GET /inbox/v1/messages (one page) with an inbox token, as the front end calls it."""
    params = _query(cursor, limit=limit, unread=unread)
    return Call("GET", "/inbox/v1/messages", _page(InboxItem.from_api), params=params, headers=_token_header(token))


def browser_mark_read(token: str, delivery_id: int) -> Call[InboxItem]:
    """POST /inbox/v1/messages/{id}/read with an inbox token."""
    path = f"/inbox/v1/messages/{int(delivery_id)}/read"
    return Call("POST", path, InboxItem.from_api, headers=_token_header(token))


def browser_item_action(token: str, delivery_id: int, action: str) -> Call[InboxItem]:
    """POST /inbox/v1/messages/{id}/{archive|unarchive|click} with an inbox token."""
    path = f"/inbox/v1/messages/{int(delivery_id)}/{action}"
    return Call("POST", path, InboxItem.from_api, headers=_token_header(token))


def browser_me(token: str) -> Call[InboxUser]:
    """GET /inbox/v1/me with an inbox token."""
    return Call("GET", "/inbox/v1/me", InboxUser.from_api, headers=_token_header(token))


def browser_mark_all_read(token: str) -> Call[InboxReadAll]:
    """POST /inbox/v1/messages/read-all with an inbox token."""
    return Call("POST", "/inbox/v1/messages/read-all", _read_all, headers=_token_header(token))


# --- Templates and layouts ---------------------------------------------------------------------------------


def list_templates(*, cursor: str | None = None, limit: int | None = None) -> Call[Page[Template]]:
    """GET /templates (one page)."""
    return Call("GET", "templates", _page(Template.from_api), params=_query(cursor, limit=limit))


def put_template(
    key: str,
    *,
    category: str,
    content: Mapping[str, Any],
    default_locale: str | None = None,
    publish: bool = True,
    layout: str | None = None,
) -> Call[TemplateVersion]:
    """PUT /templates/{key}: a new version (published unless `publish` is false)."""
    body = _drop_none(
        {"category": category, "content": dict(content), "default_locale": default_locale, "layout": layout}
    )
    body["publish"] = publish
    return Call("PUT", f"templates/{_seg(key)}", lambda b: TemplateVersion.from_api(b, key), json=body)


def get_template(key: str) -> Call[Template]:
    """GET /templates/{key}."""
    return Call("GET", f"templates/{_seg(key)}", Template.from_api)


def get_template_version(key: str, version: int) -> Call[TemplateVersion]:
    """GET /templates/{key}/versions/{version}."""
    path = f"templates/{_seg(key)}/versions/{int(version)}"
    return Call("GET", path, lambda b: TemplateVersion.from_api(b, key))


def preview_template(
    key: str, *, payload: Mapping[str, Any] | None = None, locale: str | None = None, version: int | None = None
) -> Call[Preview]:
    """POST /templates/{key}/preview."""
    body = _drop_none({"payload": dict(payload or {}), "locale": locale, "version": version})
    return Call("POST", f"templates/{_seg(key)}/preview", Preview.from_api, json=body)


def put_layout(key: str, *, html: str, text: str = "") -> Call[Layout]:
    """PUT /layouts/{key}: a new version, used from then on."""
    body = {"html": html, "text": text}
    return Call("PUT", f"layouts/{_seg(key)}", Layout.from_api, json=body)


def get_layout(key: str) -> Call[Layout]:
    """GET /layouts/{key}."""
    return Call("GET", f"layouts/{_seg(key)}", Layout.from_api)


def rollback_template(key: str, *, version: int) -> Call[TemplateVersion]:
    """POST /templates/{key}/rollback: publish an earlier version again, as the next version."""
    path = f"templates/{_seg(key)}/rollback"
    return Call("POST", path, lambda b: TemplateVersion.from_api(b, key), json={"version": int(version)})


def rollback_layout(key: str, *, version: int) -> Call[Layout]:
    """POST /layouts/{key}/rollback: use an earlier version again, as the next version."""
    return Call("POST", f"layouts/{_seg(key)}/rollback", Layout.from_api, json={"version": int(version)})


# --- Workflows ---------------------------------------------------------------------------------------------


def put_workflow(key: str, *, category: str, steps: Sequence[Mapping[str, Any]]) -> Call[Workflow]:
    """PUT /workflows/{key}: a new version."""
    body = {"category": category, "steps": [dict(step) for step in steps]}
    return Call("PUT", f"workflows/{_seg(key)}", lambda b: Workflow.from_api({"key": key, **b}), json=body)


def get_workflow(key: str) -> Call[Workflow]:
    """GET /workflows/{key}."""
    return Call("GET", f"workflows/{_seg(key)}", Workflow.from_api)


def rollback_workflow(key: str, *, version: int) -> Call[Workflow]:
    """POST /workflows/{key}/rollback: run an earlier version again, as the next version."""
    path = f"workflows/{_seg(key)}/rollback"
    return Call("POST", path, lambda b: Workflow.from_api({"key": key, **b}), json={"version": int(version)})


def list_workflows(*, cursor: str | None = None, limit: int | None = None) -> Call[Page[Workflow]]:
    """GET /workflows (one page)."""
    return Call("GET", "workflows", _page(Workflow.from_api), params=_query(cursor, limit=limit))


# --- The key's project -------------------------------------------------------------------------------------


def get_project() -> Call[Project]:
    """GET /project: the key's project and environment, its daily quotas (limit, used, reset) and promotion rule."""
    return Call("GET", "project", Project.from_api)


# --- Promotion from test to live ---------------------------------------------------------------------------


def promotions() -> Call[list[PromotionCandidate]]:
    """GET /promotion: every layout, template and workflow whose test version differs from live's (one list)."""
    return Call("GET", "promotion", lambda b: [PromotionCandidate.from_api(item) for item in b["results"]])


def promote(items: Sequence[Mapping[str, Any]]) -> Call[list[PromotionResult]]:
    """POST /promotion: copy each item's (`{"kind", "key"}`) test version to live; one result per item, in order."""
    body = {"items": [dict(item) for item in items]}  # as given: the server checks each alone, a bad one fails alone
    return Call("POST", "promotion", lambda b: [PromotionResult.from_api(item) for item in b["results"]], json=body)


# --- Campaigns ---------------------------------------------------------------------------------------------


def list_campaigns(
    *, cursor: str | None = None, limit: int | None = None, status: str | None = None
) -> Call[Page[Campaign]]:
    """GET /campaigns (one page)."""
    return Call("GET", "campaigns", _page(Campaign.from_api), params=_query(cursor, limit=limit, status=status))


def _campaign_body(fields: Mapping[str, Any]) -> dict[str, Any]:
    body = _drop_none(fields)
    for name, value in body.items():
        if isinstance(value, dt.datetime):
            body[name] = value.isoformat()
    return body


def create_campaign(*, name: str, template: str, topic: str, **fields: Any) -> Call[Campaign]:
    """POST /campaigns: `fields` are the API's (category, channels, payload, send_at, crontab, draft...)."""
    body = _campaign_body({"name": name, "template": template, "topic": topic, **fields})
    return Call("POST", "campaigns", Campaign.from_api, json=body)


def get_campaign(campaign_id: int) -> Call[Campaign]:
    """GET /campaigns/{id}: with its progress and runs (in `raw`)."""
    return Call("GET", f"campaigns/{int(campaign_id)}", Campaign.from_api)


def update_campaign(campaign_id: int, **fields: Any) -> Call[Campaign]:
    """PATCH /campaigns/{id}: only the fields given change."""
    return Call("PATCH", f"campaigns/{int(campaign_id)}", Campaign.from_api, json=_campaign_body(fields))


CAMPAIGN_ACTIONS = ("cancel", "pause", "resume")


def campaign_action(campaign_id: int, action: str) -> Call[Campaign]:
    """POST /campaigns/{id}/{action}: pause, resume or cancel."""
    if action not in CAMPAIGN_ACTIONS:
        raise ValueError(f"action must be one of {', '.join(CAMPAIGN_ACTIONS)}")
    return Call("POST", f"campaigns/{int(campaign_id)}/{action}", Campaign.from_api)


# --- Operations: dead letters, the sandbox -----------------------------------------------------------------


def list_dead_letters(
    *, cursor: str | None = None, limit: int | None = None, channel: str | None = None, status: str | None = None
) -> Call[Page[DeadLetter]]:
    """GET /dead-letters (one page)."""
    params = _query(cursor, limit=limit, channel=channel, status=status)
    return Call("GET", "dead-letters", _page(DeadLetter.from_api), params=params)


def replay_dead_letter(dead_letter_id: int) -> Call[DeadLetter]:
    """POST /dead-letters/{id}/replay."""
    return Call("POST", f"dead-letters/{int(dead_letter_id)}/replay", DeadLetter.from_api)


def discard_dead_letter(dead_letter_id: int) -> Call[DeadLetter]:
    """POST /dead-letters/{id}/discard."""
    return Call("POST", f"dead-letters/{int(dead_letter_id)}/discard", DeadLetter.from_api)


def replay_dead_letters(
    *, ids: Sequence[int] | None = None, all: bool = False, channel: str | None = None
) -> Call[int]:
    """POST /dead-letters/replay: these ids, or all (of a channel); answers how many were replayed."""
    body = _drop_none({"ids": list(ids) if ids is not None else None, "channel": channel})
    if all:
        body["all"] = True
    return Call("POST", "dead-letters/replay", lambda b: int(b["replayed"]), json=body)


def list_sandbox_messages(
    *,
    cursor: str | None = None,
    limit: int | None = None,
    channel: str | None = None,
    address: str | None = None,
    delivery_id: int | None = None,
) -> Call[Page[SandboxMessage]]:
    """GET /sandbox/messages (one page)."""
    params = _query(cursor, limit=limit, channel=channel, address=address, delivery_id=delivery_id)
    return Call("GET", "sandbox/messages", _page(SandboxMessage.from_api), params=params)


# --- Status events: the endpoint ---------------------------------------------------------------------------


def get_event_endpoint() -> Call[EventEndpoint]:
    """GET /event-endpoint."""
    return Call("GET", "event-endpoint", EventEndpoint.from_api)


def set_event_endpoint(
    *, url: str, events: Sequence[str] | None = None, max_batch: int | None = None
) -> Call[EventEndpoint]:
    """PUT /event-endpoint: its `secret` is in the answer when the endpoint is created."""
    body = _drop_none({"url": url, "events": list(events) if events is not None else None, "max_batch": max_batch})
    return Call("PUT", "event-endpoint", EventEndpoint.from_api, json=body)


def delete_event_endpoint() -> Call[None]:
    """DELETE /event-endpoint."""
    return Call("DELETE", "event-endpoint", _none)


def rotate_event_secret() -> Call[EventEndpoint]:
    """POST /event-endpoint/rotate-secret: the answer carries the new secret."""
    return Call("POST", "event-endpoint/rotate-secret", EventEndpoint.from_api)


def list_event_attempts(*, cursor: str | None = None, limit: int | None = None) -> Call[Page[EventAttempt]]:
    """GET /event-endpoint/attempts (one page), newest first."""
    return Call("GET", "event-endpoint/attempts", _page(EventAttempt.from_api), params=_query(cursor, limit=limit))


# --- Statistics --------------------------------------------------------------------------------------------


def _day(value: dt.date | str) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def stats(
    *,
    from_day: dt.date | str,
    to_day: dt.date | str,
    group_by: Sequence[str] = ("day",),
    mode: str | None = None,
    scope: str | None = None,
) -> Call[Stats]:
    """GET /stats: delivery counts per group (day, channel, status, template, client).

    `scope`: "client" (the server's default) counts this key's notifications, "project" every key's of its
    project environment.
    """
    params = _query(None, to=_day(to_day), group_by=",".join(group_by), mode=mode, scope=scope)
    params["from"] = _day(from_day)
    return Call("GET", "stats", Stats.from_api, params=params)
