"""Open and click tracking: signed redirects only to the original URL, the pixel, opt-out, SES Open and Click."""

from __future__ import annotations

import http.client
import re
from collections.abc import Callable
from datetime import date
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core import signing
from django.test import Client
from django.utils import timezone

from channels_app import renderings
from channels_app.models import SandboxMessage
from channels_app.services import deliver
from notifier.callbacks.services import ses_event_apply
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.partitions import delivery_id_bounds
from notifier.statusevents.models import StatusEvent
from notifier.tracking.services import SALT
from preferences.models import Recipient
from preferences.services import recipient_erase, recipient_upsert
from templates_app import selectors as template_selectors
from templates_app.services import template_put
from tests.conftest import free_port, wait_for
from tests.stubs.tcp_relay import TcpRelay

HTML = (
    '<html><body><p>Hi</p><a href="https://shop.example.com/sale?a=1&amp;b=2">Sale</a> '
    "<a class='x' href='http://example.org/p'>P</a> <a href=\"mailto:help@example.com\">Mail</a> "
    '<a href="#top">Top</a></body></html>'
)
CONTENT = {"en": {"email": {"subject": "News", "text": "Sale at https://shop.example.com/sale", "html": HTML}}}


@pytest.fixture
def tracked(settings: Any) -> None:
    categories = {name: dict(rules) for name, rules in settings.NOTIFIER_CATEGORIES.items()}
    categories["marketing"]["track"] = {"opens": True, "clicks": True}
    categories["social"]["track"] = {"opens": True}
    settings.NOTIFIER_CATEGORIES = categories
    settings.PUBLIC_BASE_URL = "https://notify.example.com"
    # The in-process pipeline caches template versions by key: ids from an earlier test's rows are stale.
    template_selectors._exact_versions.clear()
    renderings.forget()
    template_put(key="news", category="marketing", default_locale="en", content=CONTENT)
    template_put(key="note", category="social", default_locale="en", content=CONTENT)
    template_put(key="receipt", category="transactional", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="tr-1", email="tr-1@example.com")
    recipient_upsert(user_id="tr-private", email="tr-private@example.com", tracking_opt_out=True)


def _sent_html(api: Any, template: str, user_id: str = "tr-1") -> tuple[int, str]:
    """Accept, run the worker pipeline on it, and return (delivery id, the HTML the provider got)."""
    category = {"news": "marketing", "note": "social", "receipt": "transactional"}[template]
    body = {"recipient": {"user_id": user_id}, "template": template, "category": category, "channels": ["email"]}
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 202, response.content
    delivery_id = response.json()["deliveries"][0]["id"]
    assert deliver([delivery_id]).sent == 1
    return delivery_id, SandboxMessage.objects.get(delivery_id=delivery_id).content["html"]


def _links(html_text: str) -> list[str]:
    return [m.replace("&amp;", "&") for m in re.findall(r'href=["\']([^"\']+)["\']', html_text)]


def _as_written(html_text: str) -> bool:
    """Return whether the template's HTML went out untouched (an optional category's footer may follow it)."""
    return "/t/" not in html_text and html_text.startswith(HTML.rsplit("</body>", 1)[0])


def _path(url: str) -> str:
    return urlsplit(url).path


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_links_redirect_to_their_original_url_and_record_the_click(api: Any) -> None:
    delivery_id, html_text = _sent_html(api, "news")
    links = _links(html_text)
    sale, page, mail, anchor = links[:4]
    # An optional category's email ends with the preference and unsubscribe links: never rewritten.
    assert len(links) == 6 and not any("/t/" in link for link in links[4:])
    assert sale.startswith("https://notify.example.com/t/c/") and page.startswith("https://notify.example.com/t/c/")
    assert (mail, anchor) == ("mailto:help@example.com", "#top")
    text = SandboxMessage.objects.get(delivery_id=delivery_id).content["text"]
    assert text.startswith("Sale at https://shop.example.com/sale\n")  # the text part's links are left alone

    web = Client()
    answer = web.get(_path(sale))
    assert answer.status_code == 302 and answer["Location"] == "https://shop.example.com/sale?a=1&b=2"
    assert web.get(_path(page))["Location"] == "http://example.org/p"
    clicks = list(
        DeliveryEvent.objects.filter(delivery_id=delivery_id, status="clicked").values_list("detail", flat=True)
    )
    assert clicks == ["redirect https://shop.example.com/sale?a=1&b=2", "redirect http://example.org/p"]
    assert Delivery.objects.get(pk=delivery_id).status == "sent"  # a click is an event, not a status

    # Tampered: another URL under the same signature, a flipped character, garbage: all refused, none recorded.
    token = _path(sale).rsplit("/", 1)[1]
    other = signing.Signer(salt=SALT).sign_object({"d": delivery_id, "u": "https://evil.example"}, compress=True)
    forged = other.rsplit(":", 1)[0] + ":" + token.rsplit(":", 1)[1]
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    for bad in (forged, flipped, "nonsense", token + "x"):
        refused = web.get(f"/t/c/{bad}")
        assert refused.status_code == 400 and "Location" not in refused
    assert DeliveryEvent.objects.filter(delivery_id=delivery_id, status="clicked").count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_a_signed_token_for_a_non_web_url_is_refused(api: Any) -> None:
    """Even a correctly signed token (a leaked key, a future bug) never redirects outside http(s)."""
    signer = signing.Signer(salt=SALT)
    for url in ("javascript:alert(1)", "//evil.example/x", "data:text/html,hi", "https://ok.example/\r\nX: y"):
        token = signer.sign_object({"d": 1, "u": url}, compress=True)
        assert Client().get(f"/t/c/{token}").status_code == 400


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_the_pixel_moves_the_delivery_to_opened_once(api: Any) -> None:
    delivery_id, html_text = _sent_html(api, "note")  # social: opens only
    assert "/t/c/" not in html_text and "https://shop.example.com/sale?a=1&amp;b=2" in html_text
    pixel = re.search(r'<img src="([^"]+)"', html_text).group(1)
    assert html_text.index(pixel) < html_text.index("</body>")
    web = Client()
    answer = web.get(_path(pixel))
    assert answer.status_code == 200 and answer["Content-Type"] == "image/gif"
    assert "no-cache" in answer["Cache-Control"]
    web.get(_path(pixel))
    assert Delivery.objects.get(pk=delivery_id).status == "opened"
    assert DeliveryEvent.objects.filter(delivery_id=delivery_id, status="opened").count() == 1
    assert web.get("/t/o/abc:def.gif").status_code == 400


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_untracked_categories_and_opted_out_recipients_get_the_html_as_written(api: Any) -> None:
    _, receipt = _sent_html(api, "receipt")
    _, private = _sent_html(api, "news", user_id="tr-private")
    # Marketing email gets its footer (preference center and unsubscribe) appended after the template's HTML.
    assert receipt == HTML and _as_written(private)
    detail = api.get("/api/v1/recipients/tr-private").json()
    assert detail["tracking_opt_out"] is True
    assert api.put("/api/v1/recipients/tr-1", {"tracking_opt_out": True}, format="json").status_code == 200
    _, now_private = _sent_html(api, "news")
    assert _as_written(now_private)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_ses_open_and_click_events_count_the_same_way(api: Any) -> None:
    delivery_id, _ = _sent_html(api, "news")
    Delivery.objects.filter(pk=delivery_id).update(provider="ses", provider_message_id="ses-msg-1")
    click = {"eventType": "Click", "mail": {"messageId": "ses-msg-1"}, "click": {"link": "https://shop.example.com/"}}
    assert ses_event_apply(event=click, sns_message_id="sns-1").events == 1
    assert ses_event_apply(event=click, sns_message_id="sns-1").events == 0  # a redelivered SNS message
    ses_event_apply(event={"eventType": "Open", "mail": {"messageId": "ses-msg-1"}}, sns_message_id="sns-2")
    statuses = list(DeliveryEvent.objects.filter(delivery_id=delivery_id).values_list("status", flat=True))
    assert statuses.count("clicked") == 1 and statuses[-1] == "opened"
    assert Delivery.objects.get(pk=delivery_id).status == "opened"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_a_click_after_the_recipients_erasure_counts_without_its_url(api: Any) -> None:
    """A link's URL is rendered from the recipient's payload: clicked after their erasure, only the source stays."""
    recipient_upsert(user_id="tr-2", email="tr-2@example.com")
    erased_id, erased_html = _sent_html(api, "news")
    kept_id, kept_html = _sent_html(api, "news", user_id="tr-2")
    Delivery.objects.filter(pk=erased_id).update(provider="ses", provider_message_id="ses-erased")
    web = Client()
    web.get(_path(_links(erased_html)[0]))
    recipient_erase(recipient=Recipient.objects.get(user_id="tr-1"))

    answer = web.get(_path(_links(erased_html)[0]))  # the old email still takes its reader to the shop
    assert answer.status_code == 302 and answer["Location"] == "https://shop.example.com/sale?a=1&b=2"
    click = {"eventType": "Click", "mail": {"messageId": "ses-erased"}, "click": {"link": "https://shop.example.com/x"}}
    assert ses_event_apply(event=click, sns_message_id="sns-erased").events == 1
    web.get(_path(_links(kept_html)[0]))  # another recipient's click keeps its URL

    clicks = DeliveryEvent.objects.filter(status="clicked").order_by("id")
    assert [(c.delivery_id, c.detail) for c in clicks] == [
        (erased_id, "redirect"),  # before the erasure: its URL dropped by it
        (erased_id, "redirect"),  # after it: never written
        (erased_id, "ses:click"),
        (kept_id, "redirect https://shop.example.com/sale?a=1&b=2"),
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_a_click_is_a_delivery_clicked_status_event_for_the_calling_service(api: Any) -> None:
    # The sender is not started here: the event waits in the calling service's queue of status events.
    endpoint = {"url": "https://hooks.example.com/events", "events": ["delivery.clicked"], "max_batch": 1}
    assert api.put("/api/v1/event-endpoint", endpoint, format="json").status_code in (200, 201)
    delivery_id, html_text = _sent_html(api, "news")
    Client().get(_path(_links(html_text)[0]))
    events = StatusEvent.objects.filter(delivery_id=delivery_id)
    assert [e.type for e in events] == ["delivery.clicked"]  # sent was not subscribed, so only the click
    assert events[0].data["delivery_id"] == delivery_id


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_a_link_older_than_the_delivery_log_still_redirects_and_counts_nothing(api: Any) -> None:
    """Retention drops whole days: a link or a pixel of an email older than them answers, and records nothing."""
    endpoint = {"url": "https://hooks.example.com/events", "events": ["delivery.clicked"], "max_batch": 1}
    assert api.put("/api/v1/event-endpoint", endpoint, format="json").status_code in (200, 201)
    signer = signing.Signer(salt=SALT)
    dropped_day = delivery_id_bounds(date(2020, 1, 1))[0] + 7  # a day no partition holds any more
    gone = delivery_id_bounds(timezone.now().date())[1] - 1  # today's partition, a delivery it does not hold
    web = Client()
    for delivery_id in (dropped_day, gone):
        token = signer.sign_object({"d": delivery_id, "u": "https://shop.example.com/old"}, compress=True)
        answer = web.get(f"/t/c/{token}")
        assert answer.status_code == 302 and answer["Location"] == "https://shop.example.com/old"
        pixel = web.get(f"/t/o/{signer.sign_object({'d': delivery_id})}.gif")
        assert pixel.status_code == 200 and pixel["Content-Type"] == "image/gif"
    assert not DeliveryEvent.objects.filter(status__in=["clicked", "opened"]).exists()
    assert not StatusEvent.objects.exists()

    delivery_id, html_text = _sent_html(api, "news")  # one the log holds still counts, beside them
    web.get(_path(_links(html_text)[0]))
    clicked = DeliveryEvent.objects.filter(status="clicked").values_list("delivery_id", flat=True)
    assert list(clicked) == [delivery_id]
    assert [e.delivery_id for e in StatusEvent.objects.all()] == [delivery_id]


def _answer(port: int, path: str) -> tuple[int, str]:
    """GET `path` from a server on loopback without following a redirect; return (status, Location)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Location") or ""
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("tracked")
def test_the_redirect_and_the_pixel_answer_while_the_database_is_away(
    api: Any, start_process: Callable[..., Any]
) -> None:
    """The API's database is cut: the reader still reaches the link's page and the pixel; the click is not counted."""
    delivery_id, html_text = _sent_html(api, "news")
    link = _path(_links(html_text)[0])
    pixel = _path(re.search(r'<img src="([^"]+)"', html_text).group(1))
    db = settings.DATABASES["default"]
    tcp = TcpRelay(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).start()
    try:
        port = free_port()
        url = f"postgres://{db['USER']}@127.0.0.1:{tcp.port}/{db['TEST']['NAME']}"
        args = ["gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{port}", "-w", "1"]
        server = start_process("api", args, {"DATABASE_URL": url, "LOG_LEVEL": "WARNING"})
        server.wait_ready(lambda: _reachable(port))
        tcp.cut()
        assert _answer(port, link) == (302, "https://shop.example.com/sale?a=1&b=2")
        assert _answer(port, pixel)[0] == 200
        assert "not recorded" in server.log() and "shop.example.com" not in server.log()
        assert not DeliveryEvent.objects.filter(delivery_id=delivery_id, status__in=["clicked", "opened"]).exists()

        tcp.restore()  # the same server records again once the database is back
        wait_for(lambda: _answer(port, link)[0] == 302 and _clicks(delivery_id) > 0, timeout=30)
    finally:
        tcp.stop()


def _reachable(port: int) -> bool:
    try:
        return _answer(port, "/healthz")[0] == 200
    except OSError:
        return False


def _clicks(delivery_id: int) -> int:
    return DeliveryEvent.objects.filter(delivery_id=delivery_id, status="clicked").count()
