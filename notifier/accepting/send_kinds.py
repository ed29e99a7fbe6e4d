"""Sends that run something other than one template (a workflow's steps), registered by the app that runs them.

The notifications API takes `workflow` in place of `template`. The workflows app sits above accepting (its
steps send through it), so it cannot be imported here: it registers at start-up what the API calls for such a
send, and the API asks this registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notifier.accepting.services import AcceptResult
    from notifier.deliveries.models import Notification


@dataclass(frozen=True)
class SendKind:
    """What the notifications API calls for one kind of send."""

    # The body field that selects the kind ("workflow"), and the Notification.strategy of what it creates.
    field: str
    strategy: str
    # accept(client=, data=, trace_id=) like notification_accept.
    accept: Callable[..., AcceptResult]
    # What the kind adds to a notification's answers (NotificationWorkflowOutput), or None.
    describe: Callable[[Notification], dict[str, Any] | None]
    # Stop what the notification started; return how many items were cancelled.
    cancel: Callable[[Notification], int]


_kinds: dict[str, SendKind] = {}


def send_kind_register(kind: SendKind) -> None:
    """Register (or replace) a kind of send."""
    _kinds[kind.field] = kind


def send_kind_of_request(data: Mapping[str, Any]) -> SendKind | None:
    """Return the kind a validated send body selects, or None for a send of one template."""
    return next((kind for field, kind in _kinds.items() if data.get(field)), None)


def send_kind_of_notification(notification: Notification) -> SendKind | None:
    """Return the kind that created this notification, or None for a send of one template."""
    return next((kind for kind in _kinds.values() if kind.strategy == notification.strategy), None)
