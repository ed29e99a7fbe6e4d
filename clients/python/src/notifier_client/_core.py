"""What the sync and async clients share: building each request, reading each answer, and the retry policy.

Each API call is a `Call`: method, path, body, query and a parser of the answer. The two clients differ only in
how they send it (and sleep between retries), so everything that could disagree between them lives here.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from notifier_client.errors import NotifierConnectionError, NotifierError, error_for
from notifier_client.models import (
    CancelResult,
    InboxToken,
    Notification,
    PreferenceLink,
    Preferences,
    Recipient,
    SubscribeResult,
    Suppression,
    Topic,
    parse_time,
)

__version__ = "0.1.0"
T = TypeVar("T")
USER_AGENT = f"notifier-client-python/{__version__}"
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    params: Mapping[str, str] | None = None


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
        "base_url": base_url.rstrip("/") + "/api/v1/",
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
    template: str,
    channels: Sequence[str] | None = None,
    payload: Mapping[str, Any] | None = None,
    dedup_key: str | None = None,
    category: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """Return the JSON body of one notification, with a generated dedup_key when none is given.

    `recipient` is a user id or `{"user_id": ...}`; `more` carries any other field of the API (priority,
    locale, send_at, strategy...) as is; None values are left out.
    """
    body: dict[str, Any] = {"template": template}
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
    return lambda body: Page([parse_item(item) for item in body["results"]], body.get("next_cursor"))


def _query(cursor: str | None, **filters: Any) -> dict[str, str]:
    params = {name: str(value) for name, value in filters.items() if value is not None}
    if cursor:
        params["cursor"] = cursor
    return params


def list_notifications(
    *, cursor: str | None = None, user_id: str | None = None, status: str | None = None, category: str | None = None
) -> Call[Page[Notification]]:
    """GET /notifications (one page)."""
    params = _query(cursor, user_id=user_id, status=status, category=category)
    return Call("GET", "notifications", _page(Notification.from_api), params=params)


def list_suppressions(
    *, cursor: str | None = None, channel: str | None = None, address: str | None = None
) -> Call[Page[Suppression]]:
    """GET /suppressions (one page)."""
    params = _query(cursor, channel=channel, address=address)
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
