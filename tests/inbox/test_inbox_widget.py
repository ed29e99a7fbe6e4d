"""The inbox widget's features end to end: archive, action URLs and their clicks, pages, the token user's locale and
preference link (over /inbox/v1/ and /api/v1/ in process), then the widget itself in headless Chromium: German
strings and relative times, "Load more" through every page, tabs, archive and a counted click, by keyboard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.inbox.tokens import inbox_token_mint
from templates_app.rendering import render
from templates_app.services import template_put
from tests import factories
from tests.conftest import bearer_client, wait_for
from tests.inbox.test_inbox_browser import StreamServer, _shadow, stream_server  # noqa: F401 (a fixture)

# Into docs/ only when refreshing the documentation's pictures (NOTIFIER_SCREENSHOTS=docs), like tests/browser.py.
_ROOT = Path(__file__).resolve().parents[2]
_PICTURES = _ROOT / "docs" if os.environ.get("NOTIFIER_SCREENSHOTS") == "docs" else _ROOT / "var"
SCREENSHOT = _PICTURES / "inbox-widget.png"


def _item(recipient: Any = None, **content: str) -> Delivery:
    fields = {"title": "t", "body": "b", **content}
    if recipient is None:
        return factories.make_delivery(channel="inapp", content=fields)
    return factories.make_delivery(channel="inapp", content=fields, recipient=recipient)


def _token_client(d: Delivery) -> APIClient:
    return bearer_client(inbox_token_mint(recipient=d.recipient, ttl_seconds=600)[0])


@pytest.mark.django_db
def test_archive_takes_an_item_out_of_the_default_list_and_reads_it(api: APIClient) -> None:
    kept = _item()
    gone = _item(recipient=kept.recipient)
    theirs = _item()
    browser = _token_client(kept)
    assert browser.get("/inbox/v1/messages").json()["unread_count"] == 2
    archived = browser.post(f"/inbox/v1/messages/{gone.pk}/archive").json()
    assert archived["archived_at"] and archived["read_at"] and archived["status"] == "opened"
    listed = browser.get("/inbox/v1/messages").json()
    assert [i["id"] for i in listed["items"]] == [kept.pk] and listed["unread_count"] == 1
    assert [i["id"] for i in browser.get("/inbox/v1/messages?archived=true").json()["items"]] == [gone.pk]
    # Idempotent, and only for the token's own user.
    assert browser.post(f"/inbox/v1/messages/{gone.pk}/archive").status_code == 200
    assert browser.post(f"/inbox/v1/messages/{theirs.pk}/archive").status_code == 404
    theirs.refresh_from_db()
    assert theirs.archived_at is None and theirs.read_at is None
    # The API side: the same, by user id; unarchive brings it back, still read.
    user = kept.recipient.user_id
    back = api.post(f"/api/v1/recipients/{user}/inbox/{gone.pk}/unarchive").json()
    assert back["archived_at"] is None and back["read_at"]
    assert {i["id"] for i in api.get(f"/api/v1/recipients/{user}/inbox").json()["items"]} == {kept.pk, gone.pk}
    assert api.post(f"/api/v1/recipients/{user}/inbox/{kept.pk}/archive").json()["archived_at"]
    assert api.get(f"/api/v1/recipients/{user}/inbox?archived=true").json()["items"][0]["id"] == kept.pk
    bad = api.get(f"/api/v1/recipients/{user}/inbox?archived=maybe")
    assert bad.status_code == 400 and "archived" in bad.json()["error"]["fields"]


@pytest.mark.django_db
def test_inapp_url_is_rendered_like_the_other_parts_and_a_click_is_counted() -> None:
    content = {
        "en": {"inapp": {"title": "Order {{ order }}", "body": "Shipped", "url": "https://shop.example/o/{{ order }}"}}
    }
    version = template_put(key="with-url", category="transactional", default_locale="en", content=content)
    assert render(version, channel="inapp", locale="en", payload={"order": "A-1"}).parts["url"] == (
        "https://shop.example/o/A-1"
    )
    d = _item(url="https://shop.example/o/A-1")
    script = _item(recipient=d.recipient, url="javascript:alert(1)")
    browser = _token_client(d)
    items = {i["id"]: i for i in browser.get("/inbox/v1/messages").json()["items"]}
    assert items[d.pk]["url"] == "https://shop.example/o/A-1"
    assert items[script.pk]["url"] == ""  # only http(s) is ever handed to a page to open
    clicked = browser.post(f"/inbox/v1/messages/{d.pk}/click").json()
    assert clicked["read_at"] and clicked["status"] == "opened"
    events = DeliveryEvent.objects.filter(delivery_id=d.pk, status="clicked")
    assert [e.detail for e in events] == ["inbox https://shop.example/o/A-1"]
    # Without a web URL there is nothing to click: no event, the item unchanged.
    assert browser.post(f"/inbox/v1/messages/{script.pk}/click").json()["read_at"] is None
    assert not DeliveryEvent.objects.filter(delivery_id=script.pk, status="clicked").exists()
    assert browser.post("/inbox/v1/messages/999999999/click").status_code == 404


@pytest.mark.django_db
def test_me_gives_the_recipients_locale_and_a_working_preference_link() -> None:
    recipient = factories.make_recipient(user_id="me-de", locale="de-AT", email="me-de@example.com")
    d = _item(recipient=recipient)
    me = _token_client(d).get("/inbox/v1/me").json()
    assert me["user_id"] == "me-de" and me["locale"] == "de-AT"
    page = APIClient().get(urlsplit(me["preferences_url"]).path)
    assert page.status_code == 200 and 'lang="de"' in page.content.decode()
    assert APIClient().get("/inbox/v1/me").status_code == 401


@pytest.mark.django_db
def test_every_item_is_reachable_by_cursor_pages() -> None:
    first = _item()
    ids = {first.pk} | {_item(recipient=first.recipient).pk for _ in range(6)}
    browser = _token_client(first)
    seen: list[int] = []
    url = "/inbox/v1/messages?limit=3"
    while url:
        page = browser.get(url).json()
        seen += [i["id"] for i in page["items"]]
        url = f"/inbox/v1/messages?limit=3&cursor={page['next_cursor']}" if page["next_cursor"] else ""
    assert seen == sorted(ids, reverse=True)


# --- the widget in a real headless Chromium -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_widget_in_german_pages_tabs_archive_and_a_counted_click(
    stream_server: Callable[..., StreamServer],  # noqa: F811 (the imported fixture)
    browser: Any,
) -> None:
    from selenium.webdriver.common.keys import Keys

    server = stream_server({"INBOX_DEMO_ENABLED": "true"})
    recipient = factories.make_recipient(user_id="w-de", locale="de-DE")
    client = factories.make_api_client(name="svc-widget")
    items = [
        factories.make_delivery(
            channel="inapp", recipient=recipient, client=client, content={"title": f"Nachricht {k}", "body": "b"}
        )
        for k in range(24)
    ]
    # The newest links back to this server (a loopback page), so opening it is harmless.
    newest = items[-1]
    newest.content = {"title": "Nachricht 23", "body": "b", "url": f"{server.url}/healthz"}
    newest.save(update_fields=["content"])
    Delivery.objects.filter(pk=newest.pk).update(created_at=timezone.now() - timedelta(minutes=5))

    browser.get(f"{server.url}/inbox/demo/?user_id=w-de")
    wait_for(lambda: _shadow(browser, "return r.querySelectorAll('li[data-id]').length") == 20, 20)
    # German from the recipient's locale: labels, tabs and a relative time from Intl.RelativeTimeFormat.
    assert _shadow(browser, "return r.querySelector('.read-all').textContent") == "Alle als gelesen markieren"
    tabs = _shadow(browser, "return [...r.querySelectorAll('.tab')].map((t) => t.textContent)")
    assert tabs == ["Alle", "Ungelesen", "Archiviert"]
    assert _shadow(browser, "return r.querySelector('.bell .label').textContent") == "Benachrichtigungen, 24 ungelesen"
    first_time = _shadow(browser, "return r.querySelector('li time').textContent")
    assert first_time == "vor 5 Minuten", first_time
    # The bell is an inline SVG, not a character a font may lack.
    assert _shadow(browser, "return r.querySelector('.bell svg') !== null") is True
    assert _shadow(browser, "return /[\\u{1F300}-\\u{1FAFF}]/u.test(r.querySelector('.bell').textContent)") is False
    prefs = _shadow(browser, "return r.querySelector('.prefs').href")
    assert "/preferences/" in prefs and _shadow(browser, "return r.querySelector('.prefs').hidden") is False

    # Keyboard: open, then "Mehr laden" reaches the last four items.
    bell = _shadow(browser, "return r.querySelector('.bell')")
    bell.send_keys(Keys.ENTER)
    SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.set_window_size(560, 760)
    browser.save_screenshot(str(SCREENSHOT))
    _shadow(browser, "r.querySelector('.more').focus()")
    _shadow(browser, "return r.activeElement").send_keys(Keys.ENTER)
    wait_for(lambda: _shadow(browser, "return r.querySelectorAll('li[data-id]').length") == 24, 10)
    assert _shadow(browser, "return r.querySelector('.more').hidden") is True
    # Focus lands on the first item of the new page (the 21st newest).
    assert _shadow(browser, "return r.activeElement.dataset.id") == str(items[3].pk)

    # Archive the oldest by keyboard: it leaves the list and the badge, focus stays in the list.
    oldest = items[0]
    _shadow(browser, f"r.querySelector('li[data-id=\"{oldest.pk}\"] .archive').focus()")
    _shadow(browser, "return r.activeElement").send_keys(Keys.ENTER)
    wait_for(lambda: _shadow(browser, f"return !r.querySelector('li[data-id=\"{oldest.pk}\"]')"), 10)
    assert _shadow(browser, "return r.activeElement.tagName") == "LI"
    wait_for(lambda: _shadow(browser, "return r.querySelector('.badge').textContent") == "23", 10)
    oldest.refresh_from_db()
    assert oldest.archived_at is not None and oldest.status == "opened"
    # The archived tab shows it (and only it).
    _shadow(browser, "r.querySelector('.tab[data-tab=\"archived\"]').click()")
    wait_for(lambda: _shadow(browser, "return [...r.querySelectorAll('li[data-id]')].map((li) => +li.dataset.id)")
             == [oldest.pk], 10)  # fmt: skip
    assert _shadow(browser, "return r.querySelector('li .unarchive').textContent") == "Wiederherstellen"
    # The unread tab: only unread items; back to all.
    _shadow(browser, "r.querySelector('.tab[data-tab=\"unread\"]').click()")
    wait_for(lambda: _shadow(browser, "return r.querySelectorAll('li.unread').length") == 20, 10)
    assert _shadow(browser, "return r.querySelectorAll('li.read').length") == 0
    _shadow(browser, "r.querySelector('.tab[data-tab=\"all\"]').click()")
    newest_title = "return r.querySelector('li[data-id] a.title')?.textContent"
    wait_for(lambda: _shadow(browser, newest_title) == "Nachricht 23", 10)

    # Clicking the action URL opens it and counts a click; the item is read.
    windows = len(browser.window_handles)
    link = _shadow(browser, "return r.querySelector('li[data-id] a.title')")
    assert link.get_attribute("href") == f"{server.url}/healthz"
    link.send_keys(Keys.ENTER)
    wait_for(lambda: DeliveryEvent.objects.filter(delivery_id=newest.pk, status="clicked").exists(), 10)
    wait_for(lambda: Delivery.objects.get(pk=newest.pk).read_at is not None, 10)
    wait_for(lambda: len(browser.window_handles) == windows + 1, 10)


@pytest.mark.django_db(transaction=True)
def test_widget_locale_attribute_wins_over_the_recipients(
    stream_server: Callable[..., StreamServer],  # noqa: F811 (the imported fixture)
    browser: Any,
) -> None:
    server = stream_server({"INBOX_DEMO_ENABLED": "true"})
    recipient = factories.make_recipient(user_id="w-en", locale="de")
    d = _item(recipient=recipient)
    Delivery.objects.filter(pk=d.pk).update(created_at=timezone.now() - timedelta(hours=2, minutes=5))
    browser.get(f"{server.url}/inbox/demo/?user_id=w-en&locale=en-GB")
    wait_for(lambda: _shadow(browser, "return r.querySelectorAll('li[data-id]').length") == 1, 20)
    assert _shadow(browser, "return r.querySelector('.read-all').textContent") == "Mark all read"
    assert _shadow(browser, "return r.querySelector('li time').textContent") == "2 hours ago"
    assert _shadow(browser, "return r.querySelector('li .archive').textContent") == "Archive"


@pytest.mark.django_db(transaction=True)
def test_widget_opens_one_stream_and_loads_its_list_once(
    stream_server: Callable[..., StreamServer],  # noqa: F811 (the imported fixture)
    browser: Any,
) -> None:
    from core.redis_guard import get_redis, rkey

    server = stream_server({"INBOX_DEMO_ENABLED": "true"})
    recipient = factories.make_recipient(user_id="w-one")
    _item(recipient=recipient, title="only")
    browser.get(f"{server.url}/inbox/demo/?user_id=w-one")
    wait_for(lambda: _shadow(browser, "return r.querySelectorAll('li[data-id]').length") == 1, 20)
    # The element is upgraded with its attributes set: each of them and the connection would each start it.
    streams = rkey("inbox-streams", "recipient", recipient.pk)
    wait_for(lambda: get_redis().zcard(streams) >= 1, 10)
    # Three starts opened their streams a moment apart: give any second one the time to show up.
    for _ in range(10):
        assert get_redis().zcard(streams) == 1
        time.sleep(0.1)
    lists = browser.execute_script(
        "return performance.getEntriesByType('resource').filter((e) => e.name.includes('/inbox/v1/messages')).length"
    )
    assert lists == 1


# --- the stream server's batched reads (a topic's burst of changes), without a worker -------------------


def _unread_is(reader: Any, counts: list[dict[str, int]]) -> bool:
    return bool(reader.of("unread") == counts)


def _unread_has(reader: Any, count: dict[str, int]) -> bool:
    return count in reader.of("unread")


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_inbox_changes_reaches_every_stream_with_only_its_own_item(
    stream_server: Callable[..., StreamServer],  # noqa: F811 (the imported fixture)
) -> None:
    from notifier.deliveries.status import transition
    from tests.inbox.test_inbox_browser import SseReader

    server = stream_server()
    client = factories.make_api_client(name="svc-burst")
    notification = factories.make_notification(client=client, channels=["inapp"])
    recipients = [factories.make_recipient(user_id=f"burst-{k}") for k in range(40)]
    items = [
        factories.make_delivery(
            channel="inapp", status="queued", notification=notification, recipient=r, content={"title": r.user_id}
        )
        for r in recipients
    ]
    readers = [SseReader(server.port, inbox_token_mint(recipient=r, ttl_seconds=600)[0]) for r in recipients]
    for reader in readers:
        wait_for(partial(_unread_is, reader, [{"unread_count": 0}]), 20)
    # One commit, forty NOTIFYs, as the in-app worker's outcome write of a fan-out batch makes them.
    assert len(transition([d.pk for d in items], to="sent", only_from=["queued"])) == 40
    for r, reader in zip(recipients, readers, strict=True):
        wait_for(partial(reader.of, "message"), 20)
        wait_for(partial(_unread_has, reader, {"unread_count": 1}), 10)
        assert [m["title"] for m in reader.of("message")] == [r.user_id]
    # Archiving (over /inbox/v1) reads the item: its stream gets the new count, the others nothing.
    first = items[0]
    assert _token_client(first).post(f"/inbox/v1/messages/{first.pk}/archive").status_code == 200
    wait_for(lambda: readers[0].of("unread")[-1] == {"unread_count": 0}, 10)
    assert readers[1].of("unread")[-1] == {"unread_count": 1}
    for reader in readers:
        reader.close()
