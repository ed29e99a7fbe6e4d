"""Open and click tracking: rewrite an email's HTML links to signed redirects, add an open pixel, record both.

Per category (`track: {"opens": bool, "clicks": bool}` in NOTIFIER_CATEGORIES; off unless set) and never for a
recipient who opted out of tracking (`tracking_opt_out`). The token is signed with the SECRET_KEY
(django.core.signing, its own salt) and carries the delivery id and, for a click, the original URL, so the
redirect answers without reading the database and can only ever go where the email pointed: a token whose
signature does not match, or whose URL is not http(s), is refused (never an open redirect).

A click is one indexed write (an appended `clicked` event); an open moves the delivery to `opened` through
the guarded transition (only from sent or delivered, so repeated opens change nothing), like an SES Open
event or an inbox read.
"""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import signing
from django.db import connection, transaction

from notifier.deliveries.status import CLICKED, record_events, transition

SALT = "notifier.tracking"
OPENED_FROM = ("sent", "delivered")
# <a ... href="…"> (either quote); the URL is HTML-escaped inside the attribute.
_HREF = re.compile(r"""(<a\b[^>]*?\bhref\s*=\s*)(["'])(.*?)\2""", re.IGNORECASE | re.DOTALL)
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)
_signer = signing.Signer(salt=SALT)


class BadToken(Exception):
    """A tracking token that was tampered with, or does not carry an http(s) URL."""


def track_of(category: str) -> tuple[bool, bool]:
    """Return (opens, clicks): what is tracked for `category`."""
    rules = settings.NOTIFIER_CATEGORIES.get(category) or {}
    track = rules.get("track") if isinstance(rules, dict) else None
    if not isinstance(track, dict):
        return False, False
    return bool(track.get("opens")), bool(track.get("clicks"))


def is_web_url(url: str) -> bool:
    """Return whether `url` is an absolute http(s) URL (the only kind a redirect may go to)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not any(c in url for c in "\r\n\t ")


def _base() -> str:
    return (getattr(settings, "TRACKING_BASE_URL", "") or settings.PUBLIC_BASE_URL).rstrip("/")


def click_url(delivery_id: int, url: str) -> str:
    """Return the signed redirect to `url` for delivery `delivery_id`."""
    token = _signer.sign_object({"d": delivery_id, "u": url}, compress=True)
    return f"{_base()}/t/c/{token}"


def open_url(delivery_id: int) -> str:
    """Return the signed open pixel of delivery `delivery_id`."""
    return f"{_base()}/t/o/{_signer.sign_object({'d': delivery_id})}.gif"


def rewrite_html(body: str, delivery_id: int, *, opens: bool, clicks: bool) -> str:
    """Return `body` with its http(s) links replaced by signed redirects and/or an open pixel appended."""
    if clicks:

        def swap(match: re.Match[str]) -> str:
            url = html.unescape(match.group(3)).strip()
            if not is_web_url(url):
                return match.group(0)  # mailto:, tel:, anchors and the like stay as they are
            return f"{match.group(1)}{match.group(2)}{html.escape(click_url(delivery_id, url))}{match.group(2)}"

        body = _HREF.sub(swap, body)
    if opens:
        pixel = f'<img src="{html.escape(open_url(delivery_id))}" width="1" height="1" alt="" style="display:none">'
        ends = list(_BODY_END.finditer(body))
        body = body[: ends[-1].start()] + pixel + body[ends[-1].start() :] if ends else body + pixel
    return body


def decorate(delivery: Any, parts: dict[str, Any]) -> dict[str, Any]:
    """Return an email delivery's rendered parts with tracking applied where its category and recipient allow it.

    The rendered parts are shared between the deliveries of a batch, so a changed copy is returned.
    """
    if delivery.channel != "email" or not parts.get("html"):
        return parts
    opens, clicks = track_of(delivery.notification.category)
    if not (opens or clicks) or getattr(delivery.recipient, "tracking_opt_out", False):
        return parts
    return {**parts, "html": rewrite_html(str(parts["html"]), delivery.pk, opens=opens, clicks=clicks)}


def click_resolve(token: str) -> tuple[int, str]:
    """Return (delivery id, URL) of a click token; raise BadToken if it was tampered with or is not http(s)."""
    try:
        value = _signer.unsign_object(token)
    except (signing.BadSignature, ValueError, TypeError) as exc:
        raise BadToken("bad signature") from exc
    if not isinstance(value, dict) or not isinstance(value.get("d"), int) or not isinstance(value.get("u"), str):
        raise BadToken("bad token")
    if not is_web_url(value["u"]):
        raise BadToken("not an http(s) URL")
    return value["d"], value["u"]


def open_resolve(token: str) -> int:
    """Return the delivery id of an open token; raise BadToken if it was tampered with."""
    try:
        value = _signer.unsign_object(token)
    except (signing.BadSignature, ValueError, TypeError) as exc:
        raise BadToken("bad signature") from exc
    if not isinstance(value, dict) or not isinstance(value.get("d"), int):
        raise BadToken("bad token")
    return value["d"]


def click_record(*, delivery_id: int, url: str, source: str = "redirect") -> None:
    """Append a `clicked` event to the delivery (one insert; the delivery's status does not change).

    Only while the delivery log still holds the delivery: a link in an email older than the log's retention
    still redirects, and its click is not counted. A click after the recipient's erasure counts without its URL
    (rendered from their payload, it is theirs). The commit does not wait for its WAL flush: a click lost to a
    database crash in the next few milliseconds costs a statistic, while waiting for the flush was most of the
    redirect's time.
    """
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
        record_events([(delivery_id, CLICKED, f"{source} {url}"[:1024])], existing=True, forget_erased=True)


def open_record(*, delivery_id: int, source: str = "pixel") -> list[int]:
    """Move the delivery to `opened` (once: only from sent or delivered); return the ids moved."""
    return transition([delivery_id], to="opened", only_from=OPENED_FROM, detail=f"open:{source}")
