"""The inbox in a browser: inbox tokens, /inbox/v1/ with CORS, the SSE stream under uvicorn, the widget in Chromium.

The stream tests run the real ASGI server (uvicorn, config.asgi) and a real in-app worker against this
namespace's database and broker; the widget test drives Debian's headless Chromium with Selenium.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from django.core import signing
from django.test import Client
from rest_framework.test import APIClient

from notifier.accepting.services import notification_accept
from notifier.deliveries.models import Delivery
from notifier.inbox.tokens import SALT as INBOX_TOKEN_SALT
from notifier.inbox.tokens import inbox_token_mint
from preferences.models import Recipient
from preferences.services import recipient_upsert
from projects.services import project_create
from templates_app.services import template_put
from tests import factories
from tests.conftest import bearer_client, free_port, wait_for
from tests.factories import make_recipient

CONTENT = {"en": {"inapp": {"title": "Order {{ order }}", "body": "Order {{ order }} shipped"}}}


def _inapp(**fields: Any) -> Delivery:
    return factories.make_delivery(channel="inapp", content={"title": "t", "body": "b"}, **fields)


# --- tokens and the /inbox/v1/ endpoints (in process) -------------------------------------------------


@pytest.mark.django_db
def test_inbox_token_reads_and_marks_only_its_own_users_inbox(api: APIClient) -> None:
    mine = _inapp()
    theirs = _inapp()
    resp = api.post(f"/api/v1/recipients/{mine.recipient.user_id}/inbox-token", {"ttl_seconds": 600}, format="json")
    assert resp.status_code == 200
    token = resp.json()["token"]
    browser = bearer_client(token)
    listed = browser.get("/inbox/v1/messages").json()
    assert [i["id"] for i in listed["items"]] == [mine.pk] and listed["unread_count"] == 1
    # Another user's item is not there for this token, and cannot be marked read.
    assert browser.post(f"/inbox/v1/messages/{theirs.pk}/read").status_code == 404
    theirs.refresh_from_db()
    assert theirs.read_at is None and theirs.status == "sent"
    assert browser.post(f"/inbox/v1/messages/{mine.pk}/read").json()["status"] == "opened"
    assert browser.post("/inbox/v1/messages/read-all").json() == {"marked_read": 0, "unread_count": 0}
    # ?token= works too (EventSource cannot send headers).
    assert APIClient().get(f"/inbox/v1/messages?token={token}").json()["unread_count"] == 0


@pytest.mark.django_db
def test_inbox_endpoints_refuse_api_keys_tampered_and_expired_tokens(api: APIClient) -> None:
    d = _inapp()
    assert api.get("/inbox/v1/messages").status_code == 401  # an API key is not an inbox token
    good, _ = inbox_token_mint(recipient=d.recipient, ttl_seconds=60)
    expired, _ = inbox_token_mint(recipient=d.recipient, ttl_seconds=-1)
    other = make_recipient(user_id="someone-else")
    theirs, _ = inbox_token_mint(recipient=other, ttl_seconds=60)
    tampered = theirs.split(":")[0] + ":" + good.split(":", 1)[1]  # their claims, my signature
    for token in (expired, tampered, "garbage"):
        resp = APIClient().get("/inbox/v1/messages", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert resp.status_code == 401, token
        assert resp.json()["error"]["code"] == "unauthenticated"
    assert APIClient().get("/inbox/v1/messages").status_code == 401
    too_long = api.post(f"/api/v1/recipients/{'u' * 256}/inbox-token", {}, format="json")
    assert too_long.status_code == 400 and "user_id" in too_long.json()["error"]["fields"]
    bad_ttl = api.post(f"/api/v1/recipients/{d.recipient.user_id}/inbox-token", {"ttl_seconds": 10}, format="json")
    assert bad_ttl.status_code == 400 and "ttl_seconds" in bad_ttl.json()["error"]["fields"]


# Ids no delivery can have: a day past what a date holds (10^18, the last bigint), past a bigint, far past it.
IMPOSSIBLE_ITEM_IDS = [str(10**18), str(2**63 - 1), str(2**63), "9" * 23]


@pytest.mark.django_db
@pytest.mark.parametrize("item_id", IMPOSSIBLE_ITEM_IDS)
def test_an_inbox_item_id_no_delivery_can_have_is_a_404(api: APIClient, item_id: str) -> None:
    mine = _inapp()
    user_id = mine.recipient.user_id
    browser = bearer_client(inbox_token_mint(recipient=mine.recipient, ttl_seconds=60)[0])
    for action in ("read", "archive", "unarchive", "click"):
        for http, path in (
            (api, f"/api/v1/recipients/{user_id}/inbox/{item_id}/{action}"),
            (browser, f"/inbox/v1/messages/{item_id}/{action}"),
        ):
            response = http.post(path)
            assert response.status_code == 404, (path, response.content)
            assert response.json()["error"]["code"] == "not_found"
    mine.refresh_from_db()
    assert (mine.read_at, mine.archived_at, mine.status) == (None, None, "sent")


@pytest.mark.django_db
def test_an_inbox_token_over_its_rate_gets_429_with_retry_after_and_others_are_unaffected(settings: Any) -> None:
    settings.INBOX_TOKEN_RATE_LIMIT = "3/h"
    mine, theirs = _inapp(), _inapp()
    browser = bearer_client(inbox_token_mint(recipient=mine.recipient, ttl_seconds=600)[0])
    # Every /inbox/v1/ endpoint counts against it.
    served = [browser.get(path) for path in ("/inbox/v1/messages", "/inbox/v1/me", "/inbox/v1/messages?unread=1")]
    assert [r.status_code for r in served] == [200, 200, 200]
    refused = browser.post(f"/inbox/v1/messages/{mine.pk}/read")
    assert refused.status_code == 429, refused.content
    error = refused.json()["error"]
    assert set(error) == {"code", "message", "fields"} and error["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1000  # one request per 1,200 s
    mine.refresh_from_db()
    assert mine.read_at is None  # the refused request did nothing
    # A second token of the same user shares the bucket: minting more tokens buys no more requests.
    again = bearer_client(inbox_token_mint(recipient=mine.recipient, ttl_seconds=601)[0])
    assert again.get("/inbox/v1/messages").status_code == 429
    # Another user's token has a bucket of its own.
    other = bearer_client(inbox_token_mint(recipient=theirs.recipient, ttl_seconds=600)[0])
    assert other.post(f"/inbox/v1/messages/{theirs.pk}/read").status_code == 200
    # A request without a valid token is refused for that, before any bucket.
    assert APIClient().get("/inbox/v1/messages", HTTP_AUTHORIZATION="Bearer garbage").status_code == 401


@pytest.mark.pure
def test_a_bad_inbox_token_rate_limit_is_refused_at_start_up(settings: Any) -> None:
    from django.core.management import CommandError, call_command

    settings.INBOX_TOKEN_RATE_LIMIT = "lots"
    with pytest.raises(CommandError, match="INBOX_TOKEN_RATE_LIMIT"):
        call_command("check")


@pytest.mark.django_db
def test_an_inbox_token_for_a_user_never_seen_creates_the_recipient_as_a_send_would(api: APIClient) -> None:
    assert not Recipient.objects.filter(user_id="first-visit").exists()
    resp = api.post("/api/v1/recipients/first-visit/inbox-token", {"ttl_seconds": 600}, format="json")
    assert resp.status_code == 200, resp.content
    recipient = Recipient.objects.get(user_id="first-visit")
    assert (recipient.email, recipient.phone, recipient.webhook_url) == ("", "", "")  # no personal data needed
    token = resp.json()["token"]
    empty = APIClient().get("/inbox/v1/messages", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert (empty["items"], empty["unread_count"]) == ([], 0)
    # The first notification lands in that same recipient's inbox, which the token already reads.
    template_put(key="hello", category="transactional", default_locale="en", content=CONTENT)
    sent = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "first-visit"}, "template": "hello", "payload": {"order": "A-1"}},
        format="json",
    )
    assert sent.status_code == 202, sent.content
    assert Recipient.objects.filter(user_id="first-visit").count() == 1
    Delivery.objects.filter(pk=sent.json()["deliveries"][0]["id"]).update(status="sent", content={"title": "Hi"})
    items = APIClient().get("/inbox/v1/messages", HTTP_AUTHORIZATION=f"Bearer {token}").json()["items"]
    assert [item["title"] for item in items] == ["Hi"]
    # A second token for the same user finds the recipient: no second row.
    assert api.post("/api/v1/recipients/first-visit/inbox-token", {}, format="json").status_code == 200
    assert Recipient.objects.filter(user_id="first-visit").count() == 1


@pytest.mark.django_db
def test_a_token_opens_the_inbox_of_its_own_environments_recipient_of_that_user_id() -> None:
    """The user id `twice` names a recipient in two project environments: each token reads its own."""
    project = project_create(slug="elsewhere")
    ours = make_recipient(user_id="twice", locale="en")  # the default project's
    theirs = make_recipient(user_id="twice", locale="de", environment=project.environments.get(name="live"))
    for recipient in (ours, theirs):
        token, _ = inbox_token_mint(recipient=recipient, ttl_seconds=600)
        assert bearer_client(token).get("/inbox/v1/me").json()["locale"] == recipient.locale
    # A token minted before tokens named their environment: its recipient row says which.
    claims = {"r": theirs.pk, "u": "twice", "e": int(time.time()) + 600}
    token = signing.dumps(claims, salt=INBOX_TOKEN_SALT, compress=True)
    assert bearer_client(token).get("/inbox/v1/me").json()["locale"] == "de"


@pytest.mark.django_db
def test_the_demo_page_shows_the_recipient_of_the_project_environment_asked_for(settings: Any) -> None:
    settings.INBOX_DEMO_ENABLED = True
    project = project_create(slug="elsewhere")
    make_recipient(user_id="twice", locale="en")  # the default project's live one
    make_recipient(user_id="twice", locale="de", environment=project.environments.get(name="test"))

    def locale_of(query: str) -> str:
        page = Client().get(f"/inbox/demo/?user_id=twice{query}")
        assert page.status_code == 200, page.content[:300]
        token = re.search(r'token="([^"]+)"', page.content.decode()).group(1)
        return str(bearer_client(token).get("/inbox/v1/me").json()["locale"])

    assert locale_of("") == "en"
    assert locale_of("&project=elsewhere&mode=test") == "de"
    assert Client().get("/inbox/demo/?user_id=twice&project=elsewhere").status_code == 404  # none in its live one
    assert Client().get("/inbox/demo/?user_id=twice&project=nowhere").status_code == 404


@pytest.mark.django_db
def test_cors_only_for_allowed_origins(settings: Any) -> None:
    settings.INBOX_ALLOWED_ORIGINS = ["https://app.example.com"]
    d = _inapp()
    token, _ = inbox_token_mint(recipient=d.recipient, ttl_seconds=60)
    client = APIClient()
    pre = client.options(
        "/inbox/v1/messages", HTTP_ORIGIN="https://app.example.com", HTTP_ACCESS_CONTROL_REQUEST_METHOD="GET"
    )
    assert pre.status_code == 204 and pre["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert "Authorization" in pre["Access-Control-Allow-Headers"]
    get = client.get("/inbox/v1/messages", HTTP_ORIGIN="https://app.example.com", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert get["Access-Control-Allow-Origin"] == "https://app.example.com"
    evil = client.get("/inbox/v1/messages", HTTP_ORIGIN="https://evil.example", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert "Access-Control-Allow-Origin" not in evil
    # The API proper never answers cross-origin.
    assert "Access-Control-Allow-Origin" not in client.get(
        "/api/v1/notifications", HTTP_ORIGIN="https://app.example.com"
    )


# --- the stream under a real ASGI server ---------------------------------------------------------------


class StreamServer:
    """uvicorn serving config.asgi on a free loopback port (a ServerProcess), and its URL."""

    def __init__(self, process: Any, port: int) -> None:
        self.process, self.port, self.url = process, port, f"http://127.0.0.1:{port}"
        self.proc, self.log_path = process.proc, process.log_path
        process.wait_ready(self._healthy)

    def _healthy(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/healthz", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture
def stream_server(start_process: Callable[..., Any]) -> Callable[..., StreamServer]:
    """Start the inbox stream server as the Procfile runs it (stopped with the test's other processes).

    Its streams never end by themselves: without the Procfile's graceful-shutdown bound, a stop waited for every
    stream a test left open until it was killed (16 s of teardown).
    """

    def _start(env: dict[str, str] | None = None) -> StreamServer:
        port = free_port()
        args = ["uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
        args += ["--timeout-graceful-shutdown", "5"]
        return StreamServer(start_process("stream", args, env), port)

    return _start


class SseReader:
    """A raw-socket EventSource: reads one stream in a thread and keeps every event (and heartbeat) it saw."""

    def __init__(self, port: int, token: str, last_event_id: str | None = None) -> None:
        self.events: list[dict[str, str]] = []
        self.heartbeats = 0
        self.status = 0
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        extra = f"Last-Event-ID: {last_event_id}\r\n" if last_event_id else ""
        self.sock.sendall(
            f"GET /inbox/v1/stream?token={token} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"{extra}\r\n".encode()
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                buffer += chunk
                if not self.status and b"\r\n\r\n" in buffer:
                    head, buffer = buffer.split(b"\r\n\r\n", 1)
                    self.status = int(head.split()[1])
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    self._parse(block.decode())
        except OSError:
            return

    def _parse(self, block: str) -> None:
        # Chunked transfer framing (hex sizes on their own lines) is not SSE: skip lines without a field name.
        event: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(": heartbeat"):
                self.heartbeats += 1
            for field in ("id", "event", "data"):
                if line.startswith(f"{field}: "):
                    event[field] = line[len(field) + 2 :]
        if "event" in event:
            self.events.append(event)

    def of(self, kind: str) -> list[Any]:
        return [json.loads(e["data"]) for e in list(self.events) if e["event"] == kind]

    def close(self) -> None:
        self.sock.close()


def _send_inapp(client: Any, user_id: str, order: str) -> None:
    data = {"recipient": {"user_id": user_id}, "category": "transactional", "template": "inbox-t"}
    notification_accept(client=client, data={**data, "channels": ["inapp"], "payload": {"order": order}})


@pytest.mark.django_db(transaction=True)
def test_stream_pushes_messages_and_counts_and_resumes_without_gaps(
    start_worker: Callable[..., Any], stream_server: Callable[..., StreamServer]
) -> None:
    from notifier.clients.services import api_client_create

    template_put(key="inbox-t", category="transactional", default_locale="en", content=CONTENT)
    client = api_client_create(name="svc-stream")[0]
    me, _ = recipient_upsert(user_id="s-me")
    recipient_upsert(user_id="s-other")
    token, _ = inbox_token_mint(recipient=me, ttl_seconds=600)
    server = stream_server({"INBOX_HEARTBEAT_SECONDS": "1"})
    start_worker(queues=["inapp.high", "inapp.low"])

    first = SseReader(server.port, token)
    wait_for(lambda: first.of("unread") == [{"unread_count": 0}], 20)
    assert first.status == 200
    _send_inapp(client, "s-other", "X")  # another user's message never shows on this stream
    _send_inapp(client, "s-me", "A-1")
    wait_for(lambda: first.of("message"), 30)
    wait_for(lambda: {"unread_count": 1} in first.of("unread"), 10)
    assert [m["title"] for m in first.of("message")] == ["Order A-1"]
    wait_for(lambda: first.heartbeats >= 1, 10)
    last_id = first.events[-1]["id"]
    first.close()

    # While the browser is away, two more arrive and one is read elsewhere.
    _send_inapp(client, "s-me", "A-2")
    _send_inapp(client, "s-me", "A-3")
    mine = Delivery.objects.filter(recipient=me, channel="inapp")
    wait_for(lambda: mine.filter(status="sent").count() == 3, 30)

    again = SseReader(server.port, token, last_event_id=last_id)
    wait_for(lambda: {"Order A-2", "Order A-3"} <= {m["title"] for m in again.of("message")}, 20)
    wait_for(lambda: again.of("unread") and again.of("unread")[-1] == {"unread_count": 3}, 10)
    assert "Order X" not in {m["title"] for m in again.of("message")}
    # A fresh stream without Last-Event-ID replays nothing: the page lists the inbox itself.
    fresh = SseReader(server.port, token)
    wait_for(lambda: fresh.of("unread"), 10)
    assert fresh.of("message") == []
    # Reading (here over the API) is pushed as a new count to every open stream of that user.
    browser = bearer_client(token)
    assert browser.post("/inbox/v1/messages/read-all").json()["marked_read"] == 3
    wait_for(lambda: fresh.of("unread")[-1] == {"unread_count": 0}, 10)
    wait_for(lambda: again.of("unread")[-1] == {"unread_count": 0}, 10)
    bad = SseReader(server.port, "not-a-token")
    wait_for(lambda: bad.status, 10)
    assert bad.status == 401
    for reader in (again, fresh, bad):
        reader.close()


# --- the widget in a real headless Chromium -----------------------------------------------------------


def _shadow(driver: Any, script: str) -> Any:
    """Run `script` with `r` bound to the widget's shadow root; None while the widget is not built yet."""
    return driver.execute_script(
        f"const r = document.querySelector('notifier-inbox')?.shadowRoot; if (!r) return null; {script}"
    )


@pytest.mark.django_db(transaction=True)
def test_widget_shows_a_message_sent_over_the_api_and_marks_it_read(
    start_worker: Callable[..., Any], stream_server: Callable[..., StreamServer], api: APIClient, browser: Any
) -> None:
    template_put(key="inbox-t", category="transactional", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="w-1")
    server = stream_server({"INBOX_DEMO_ENABLED": "true"})
    start_worker(queues=["inapp.high", "inapp.low"])
    browser.get(f"{server.url}/inbox/demo/?user_id=w-1")
    # Polled: the widget builds its list after the page has loaded.
    wait_for(lambda: _shadow(browser, "return r.querySelector('.list')?.textContent") == "No notifications", 20)
    assert _shadow(browser, "return r.querySelector('.badge').hidden") is True

    body = {"recipient": {"user_id": "w-1"}, "category": "transactional", "template": "inbox-t", "channels": ["inapp"]}
    body["payload"] = {"order": "B-7"}
    assert api.post("/api/v1/notifications", body, format="json").status_code == 202
    wait_for(lambda: "Order B-7" in _shadow(browser, "return r.querySelector('.list').textContent"), 30)
    assert _shadow(browser, "return r.querySelector('.badge').textContent") == "1"

    # Keyboard: focus the bell, open with Enter, Tab to the item's "Mark read", activate it.
    from selenium.webdriver.common.keys import Keys

    bell = _shadow(browser, "return r.querySelector('.bell')")
    bell.send_keys(Keys.ENTER)
    assert _shadow(browser, "return r.querySelector('.bell').getAttribute('aria-expanded')") == "true"
    _shadow(browser, "r.querySelector('.mark-read').focus()")
    _shadow(browser, "return r.activeElement").send_keys(Keys.ENTER)
    wait_for(lambda: _shadow(browser, "return r.querySelector('.badge').hidden") is True, 10)
    wait_for(lambda: _shadow(browser, "return r.querySelector('li').className") == "read", 10)
    assert _shadow(browser, "return r.activeElement.tagName") == "LI"  # focus stays in the list
    assert Delivery.objects.get(recipient__user_id="w-1").status == "opened"
    _shadow(browser, "return r.activeElement").send_keys(Keys.ESCAPE)
    wait_for(lambda: _shadow(browser, "return r.querySelector('.panel').hidden") is True, 5)
