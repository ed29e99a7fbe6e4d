"""In-app items of a topic stored by the fan-out itself: the page that writes the deliveries writes them `sent`.

For a channel worker, "sending" an in-app delivery is writing its rendered content onto the row (the inbox is
our own database, channels_app/providers/inapp.py). Sent through the worker, a topic's in-app message to 10,000
users travels as 20 broker messages, each claimed, loaded, rendered and recorded in turn: seconds between the
fan-out's insert and the last inbox on screen. Here the fan-out renders the message once per locale of the page
and inserts the page's in-app deliveries already `sent` with that content, their `queued` and `sent` events and
the NOTIFY of each new item, in the page's one transaction (notifier/dispatch/fanout.py); nothing goes on the broker.

Every guarantee of the worker's path holds, because the decisions it makes are made here on the same data:

- compliance: the page's plan (notifier/deliveries/planning.py: preferences, opt-out, suppression list, quiet hours) is
  taken the moment before the insert, so only a delivery planned `queued` and due now is stored; the frequency
  cap, which the worker checks for topics, is checked here with the same counters (notifier/deliveries/frequency.py);
- effectively-once: the insert's arbiter is the unique (notification, recipient, channel, address) index, so a
  page redone after a crash inserts nothing, notifies nobody and records no event a second time;
- status events and read state: the rows and events are the worker's (`sent`, provider `inapp`, the content,
  the template version), the calling service's `delivery.sent` events are written in the same transaction
  (notifier/statusevents/record.py), and reading an item moves it to `opened` as before.

What this path does not decide is left to the worker, as before: a test client's deliveries (the sandbox records
them), a fallback chain (its steps are decided on outcomes), an in-app provider chain or rate limit other than
the built-in one, a template that renders `{{ preferences_url }}` (a link per recipient), a rendering that fails
or finds the renderer busy. FANOUT_INAPP_DIRECT=false sends every in-app delivery through the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings

from core import metrics
from core.logs import log_lines
from core.ratelimit import limit_for
from notifier.clients.models import ApiClient
from notifier.deliveries import fallback, frequency
from notifier.deliveries.models import Notification
from preferences.emails import uses_preferences_url
from projects.scoping import owner_id
from templates_app import layouts
from templates_app.models import TemplateVersion
from templates_app.rendering import RenderError, render_many

logger = logging.getLogger(__name__)
# The worker writes one line per outcome to this logger; the same lines for the items stored here.
_audit_log = logging.getLogger("channels_app.services")

CHANNEL = "inapp"
PROVIDER = "inapp"
SENT_DETAIL = "inapp (stored at fan-out)"


def enabled() -> bool:
    """Return whether topic fan-outs store their in-app items themselves (FANOUT_INAPP_DIRECT, default true)."""
    return bool(getattr(settings, "FANOUT_INAPP_DIRECT", True))


def eligible(n: Notification) -> bool:
    """Return whether the in-app deliveries of this topic notification may be stored by the fan-out.

    Only where the worker would do nothing but store them: a live client, no fallback chain, the built-in in-app
    provider first in its chain and no rate limit configured for it.
    """
    if not enabled() or CHANNEL not in n.channels or fallback.is_fallback(n):
        return False
    if n.client.mode == ApiClient.Mode.TEST:
        return False
    chain = settings.CHANNEL_PROVIDERS.get(CHANNEL) or []
    return bool(chain) and chain[0] == PROVIDER and limit_for(PROVIDER)[0].rate is None


@dataclass
class Contents:
    """The rendered in-app content of one notification, per locale asked for; None where the worker must render."""

    version_id: int | None = None
    by_locale: dict[str, dict[str, Any] | None] = field(default_factory=dict)


_versions: dict[tuple[int, str, int], TemplateVersion] = {}
_contents: dict[Any, Contents] = {}
_CACHE_MAX = 256


def _version(n: Notification) -> TemplateVersion | None:
    """Return the (immutable) template version of a notification, cached per process; None if it does not exist.

    Looked up in the notification's environment: another environment may have a template of the same key and
    version number, with its own content.
    """
    environment_id = owner_id(n)
    key = (environment_id, n.template_key, n.template_version or 0)
    version = _versions.get(key)
    if version is None:
        version = (
            TemplateVersion.objects.select_related("template")
            .filter(
                template__environment_id=environment_id, template__key=n.template_key, version=n.template_version or 0
            )
            .first()
        )
        if version is None:
            return None
        if len(_versions) > _CACHE_MAX:
            _versions.clear()
        _versions[key] = version
    return version


def locale_of(n: Notification, recipient_locale: str) -> str:
    """Return the locale a recipient's item renders in, as the worker chooses it ("" if the version is missing)."""
    version = _version(n)
    if version is None:
        return ""
    return n.locale or recipient_locale or version.template.default_locale


def contents(n: Notification, locales: Iterable[str]) -> Contents:
    """Render the notification's in-app content once per locale (kept per process across its pages).

    A locale whose rendering fails, finds the renderer busy or uses `{{ preferences_url }}` maps to None: its
    deliveries go to the worker, which fails, retries or personalizes them as it always does.
    """
    found = _contents.get(n.pk)
    if found is None:
        if len(_contents) > _CACHE_MAX:
            _contents.clear()
        found = _contents[n.pk] = Contents()
    version = _version(n)
    if version is None:
        return found
    found.version_id = version.pk
    wanted = [locale for locale in dict.fromkeys(locales) if locale and locale not in found.by_locale]
    if not wanted:
        return found
    try:
        outcomes = render_many([(version, CHANNEL, locale, n.payload) for locale in wanted])
    except Exception:
        logger.exception("rendering in-app content at fan-out failed; the worker renders it")
        return found
    for locale, outcome in zip(wanted, outcomes, strict=True):
        content: dict[str, Any] | None = None
        if outcome.rendered is not None:
            try:
                rendered = layouts.apply(version, outcome.rendered, channel=CHANNEL, payload=n.payload)
            except RenderError:
                rendered = None
            if rendered is not None and not uses_preferences_url(rendered.parts, rendered.link_marker):
                content = rendered.parts
        found.by_locale[locale] = content
    return found


def store_rows(
    n: Notification,
    rows: list[tuple[Any, ...]],
    locales: Sequence[str],
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]], int | None]:
    """Mark the page rows the fan-out stores itself: in-app, planned `queued`, due now, within the frequency cap.

    `rows` are the fan-out's (recipient_id, channel, address, status, reason, not_before) and `locales` each
    row's recipient locale. Returns the rows with a seventh element, the index of the row's content in the
    returned list of contents (None: not stored here), with status `sent`, or `suppressed` (frequency_cap) for a
    recipient over the cap; and the template version id.
    """
    candidates = [
        i for i, row in enumerate(rows) if row[1] == CHANNEL and row[3] == "queued" and row[5] is None and row[2]
    ]
    if not candidates:
        return rows, [], None
    wanted = {i: locale_of(n, locales[i]) for i in candidates}
    rendered = contents(n, wanted.values())
    index: dict[str, int] = {}
    bodies: list[dict[str, Any]] = []
    for locale, content in rendered.by_locale.items():
        if content is not None:
            index[locale] = len(bodies)
            bodies.append(content)
    chosen = [i for i in candidates if wanted[i] in index]
    refused = _over_cap(n, [rows[i][0] for i in chosen])
    out = list(rows)
    for i in chosen:
        row = rows[i]
        if row[0] in refused:
            out[i] = (row[0], row[1], row[2], "suppressed", frequency.REASON, None)
        else:
            out[i] = (row[0], row[1], row[2], "sent", "", None, index[wanted[i]])
    return out, bodies, rendered.version_id


def _over_cap(n: Notification, recipient_ids: list[int]) -> set[int]:
    """Return the recipients whose frequency cap refuses this notification (the worker's re-check, made here)."""
    return frequency.refused_recipients(
        category=n.category, notification_id=str(n.pk), created_at=n.created_at, recipient_ids=recipient_ids
    )


def after_commit(n: Notification, stored: int, at: datetime, ids: Sequence[int] = ()) -> None:
    """Count the stored items as the worker's outcome writer counts sends (metrics, latency, audit lines)."""
    if not stored:
        return
    metrics.count_deliveries(CHANNEL, PROVIDER, "sent", stored, mode="live")
    metrics.observe_delivery_latency(CHANNEL, n.priority, [(at - n.created_at).total_seconds()] * stored)
    if _audit_log.isEnabledFor(logging.INFO):
        line = {"event": "delivery sent", "notification_id": str(n.pk), "channel": CHANNEL, "provider": PROVIDER}
        extra = {"trace_id": n.trace_id} if n.trace_id else {}
        log_lines(_audit_log, logging.INFO, [{**line, "delivery_id": i, "attempts": 1, **extra} for i in ids])
