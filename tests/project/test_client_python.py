"""The Python client (clients/python, import `notifier_client`) against the real server and real workers."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import notifier_client
import pytest
from django.urls import Resolver404, resolve
from notifier_client import (
    NOT_FOR_CLIENTS,
    OPERATIONS,
    AsyncNotifier,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    Notifier,
    NotifierConnectionError,
    NotifierError,
    PermissionDeniedError,
    Preferences,
    RateLimitedError,
    RecipientResult,
    RetryPolicy,
    ServerError,
    WebhookVerificationError,
    webhooks,
)
from standardwebhooks.webhooks import Webhook

from core.scopes import SCOPES
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import preference_token_read, recipient_upsert
from projects import quotas
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID, Environment
from templates_app.services import template_put
from tests.conftest import wait_for

CONTENT = {"en": {"email": {"subject": "Order {{ order_id }}", "text": "Shipped {{ order_id }}"}}}
# The category may be left out (it is the template's); naming it checks that the client sends it as given.
SEND: dict[str, Any] = {"template": "shipped", "category": "transactional"}
FAST = RetryPolicy(max_retries=3, budget_seconds=5, backoff_seconds=0.01, max_backoff_seconds=0.05)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(live_server: Any, settings: Any) -> dict[str, Any]:
    """Return the live server's URL, an API key and a template to send."""
    settings.PUBLIC_BASE_URL = live_server.url
    template_put(key="shipped", category="transactional", default_locale="en", content=CONTENT)
    _, key = api_client_create(name="py-client", scopes=list(SCOPES))
    return {"base_url": live_server.url, "api_key": key}


@pytest.fixture
def notifier(server: dict[str, Any]) -> Iterator[Notifier]:
    with Notifier(base_url=server["base_url"], api_key=server["api_key"], retry=FAST) as client:
        yield client


def test_send_reaches_sent_and_get_shows_it(notifier: Notifier, start_worker: Any) -> None:
    recipient_upsert(user_id="u-py", email="py@example.com")
    start_worker(queues=["email.high", "email.low"])
    n = notifier.send(recipient="u-py", **SEND, channels=["email"], payload={"order_id": "A-1"})
    assert isinstance(n, notifier_client.Notification)
    assert (n.status, n.duplicate, len(n.deliveries)) == ("accepted", False, 1)

    def sent() -> notifier_client.Notification | None:
        current = notifier.get(n.id)
        return current if current.deliveries[0].status == "sent" else None

    done = wait_for(sent, 60)
    delivery = done.deliveries[0]
    assert (delivery.channel, delivery.provider, delivery.attempts) == ("email", "sandbox", 1)
    assert [e.status for e in delivery.events][-1] == "sent"
    assert Delivery.objects.get(pk=delivery.id).status == "sent"
    # A generated dedup_key went with the send, so a retry of that call cannot send twice.
    assert done.dedup_key and done.dedup_key.startswith("nc-")


def test_dedup_key_duplicates_and_conflicts(notifier: Notifier) -> None:
    first = notifier.send(recipient="u-d", **SEND, payload={"order_id": "1"}, dedup_key="k-1")
    again = notifier.send(recipient="u-d", **SEND, payload={"order_id": "1"}, dedup_key="k-1")
    assert (again.id, again.duplicate) == (first.id, True)
    with pytest.raises(ConflictError) as conflict:
        notifier.send(recipient="u-d", **SEND, payload={"order_id": "2"}, dedup_key="k-1")
    assert conflict.value.status == 409
    # Without a key, two calls are two notifications.
    a = notifier.send(recipient="u-d", **SEND, payload={"order_id": "3"})
    b = notifier.send(recipient="u-d", **SEND, payload={"order_id": "3"})
    assert a.id != b.id


def test_errors_map_to_classes_with_status_code_and_fields(server: dict[str, Any], notifier: Notifier) -> None:
    with pytest.raises(BadRequestError) as bad:
        notifier.send(recipient="u-e", template="shipped", category="nonsense")
    assert (bad.value.status, bad.value.code) == (400, "invalid")
    assert "category" in bad.value.fields
    with pytest.raises(NotFoundError) as missing:
        notifier.get("00000000-0000-0000-0000-000000000000")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(AuthenticationError) as unauthenticated:
        Notifier(base_url=server["base_url"], api_key="wrong").get("00000000-0000-0000-0000-000000000000")
    assert unauthenticated.value.status == 401
    _, limited_key = api_client_create(name="only-marketing", allowed_categories=["marketing"])
    limited = Notifier(base_url=server["base_url"], api_key=limited_key)
    with pytest.raises(PermissionDeniedError) as forbidden:
        limited.send(recipient="u-e", **SEND)
    assert forbidden.value.status == 403 and forbidden.value.code
    assert isinstance(forbidden.value, NotifierError)


def test_batch_topic_cancel_and_paginated_iterator(notifier: Notifier) -> None:
    items = [{"recipient": f"u-b{i}", **SEND, "payload": {"order_id": str(i)}} for i in range(60)]
    items.append({"recipient": "u-bad", "template": "shipped", "category": "nonsense"})
    results = notifier.send_batch(items)
    assert len(results) == 61
    assert all(isinstance(r, notifier_client.Notification) for r in results[:60])
    assert isinstance(results[60], BadRequestError) and "category" in results[60].fields
    # The server pages by 50: the iterator follows the cursor across pages without repeats.
    listed = [n.id for n in notifier.notifications()]
    assert len(listed) == len(set(listed)) == 60
    assert set(listed) == {r.id for r in results[:60] if isinstance(r, notifier_client.Notification)}
    assert [n.id for n in notifier.notifications(user_id="u-b7")] == [results[7].id]

    notifier.put_topic("py-news", name="News")
    assert notifier.subscribe("py-news", ["u-t1", "u-t2"]).total == 2
    notifier.unsubscribe("py-news", "u-t2")
    assert notifier.get_topic("py-news").subscribers == 1
    later = "2099-01-01T00:00:00Z"
    topic = notifier.send_topic(topic="py-news", **SEND, payload={"order_id": "T"}, send_at=later)
    assert topic.id and topic.status == "accepted"
    cancelled = notifier.cancel(topic.id)
    assert cancelled.id == topic.id and notifier.get(topic.id).status == "cancelled"


def test_recipients_preferences_and_preference_links(notifier: Notifier) -> None:
    # A user id that needs quoting in a URL path.
    odd = notifier.put_recipient("u r+1@x", locale="de")
    assert (odd.id, odd.locale) == ("u r+1@x", "de")
    assert notifier.get_recipient("u r+1@x").id == "u r+1@x"
    plain = notifier.put_recipient("u-r@x", email="r@example.com", locale="de", timezone="Europe/Berlin")
    assert (plain.id, plain.user_id, plain.timezone) == ("u-r@x", "u-r@x", "Europe/Berlin")
    assert notifier.get_recipient("u-r@x").email == "r@example.com"
    with pytest.raises(BadRequestError) as bad:
        notifier.put_recipient("u-r@x", timezone="Mars/Olympus")
    assert "timezone" in bad.value.fields
    results = notifier.put_recipients(
        [
            {"user_id": "u-r@x", "locale": "fr"},
            {"user_id": "u-b", "email": "b@example.com"},
            {"user_id": "u-c", "phone": "1"},
        ]
    )
    assert results[:2] == [RecipientResult(user_id="u-r@x", status=200), RecipientResult(user_id="u-b", status=201)]
    assert isinstance(results[2], BadRequestError) and "phone" in results[2].fields
    assert notifier.get_recipient("u-r@x").locale == "fr"

    prefs = Preferences(
        channels={"sms": False},
        categories={"marketing": {"enabled": False, "frequency": "immediate"}},
        quiet_hours={"start": "22:00", "end": "07:00"},
    )
    saved = notifier.set_preferences("u-r@x", prefs)
    assert saved == notifier.get_preferences("u-r@x") == Preferences.from_api(prefs.to_api())

    link = notifier.create_preference_link("u-r@x", ttl_seconds=600)
    assert preference_token_read(link.url.rsplit("/", 1)[1])[0] == "u-r@x"
    assert link.expires_at is not None and link.expires_at.tzinfo is not None
    with pytest.raises(NotFoundError):
        notifier.create_preference_link("nobody")

    notifier.delete_recipient("u-r@x")
    with pytest.raises(NotFoundError):
        notifier.get_recipient("u-r@x")


def test_inbox_tokens(notifier: Notifier) -> None:
    recipient_upsert(user_id="u-i")
    token = notifier.create_inbox_token("u-i", ttl_seconds=600)
    assert token.token and token.expires_at is not None


def test_async_client_sends_iterates_and_raises(server: dict[str, Any]) -> None:
    async def scenario() -> tuple[list[str], list[str], str]:
        async with AsyncNotifier(base_url=server["base_url"], api_key=server["api_key"], retry=FAST) as client:
            sent = await asyncio.gather(
                *(client.send(recipient=f"u-a{i}", **SEND, payload={"order_id": str(i)}) for i in range(3))
            )
            listed = [n.id async for n in client.notifications()]
            fetched = await client.get(sent[0].id)
            with pytest.raises(NotFoundError) as missing:
                await client.get("00000000-0000-0000-0000-000000000000")
            assert missing.value.status == 404
            return [n.id for n in sent], listed, fetched.id

    sent, listed, fetched = asyncio.run(scenario())
    assert sorted(listed) == sorted(sent) and len(set(sent)) == 3 and fetched == sent[0]


# --- Retries, against a scripted local server (the real one does not fail on demand) -----------------------


class _Scripted(BaseHTTPRequestHandler):
    script: list[tuple[int, dict[str, str], dict[str, Any]]]
    seen: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"at": time.monotonic(), "body": body})
        status, headers, answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        payload = json.dumps(answer).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self.seen.append({"at": time.monotonic(), "path": self.path, "auth": self.headers.get("Authorization")})
        status, _headers, answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[Any]:
    """Start a loopback server answering POSTs from a script of (status, headers, body)."""
    handler: Any = type("Handler", (_Scripted,), {"script": [], "seen": []})  # a class made here, given a url
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield handler
    httpd.shutdown()
    httpd.server_close()


ACCEPTED = {"id": "n-1", "status": "accepted", "duplicate": False, "deliveries": []}
BUSY = {"error": {"code": "rate_limited", "message": "Slow down.", "fields": {}}}


@pytest.mark.django_db(transaction=False)
def test_retries_honour_retry_after_and_reuse_the_generated_dedup_key(scripted: Any) -> None:
    scripted.script[:] = [(429, {"Retry-After": "1"}, BUSY), (503, {}, {}), (202, {}, ACCEPTED)]
    client = Notifier(base_url=scripted.url, api_key="k", retry=FAST)
    n = client.send(recipient="u-1", template="t")
    assert (n.id, n.status) == ("n-1", "accepted")
    assert len(scripted.seen) == 3
    keys = {attempt["body"]["dedup_key"] for attempt in scripted.seen}
    assert len(keys) == 1 and next(iter(keys)).startswith("nc-")
    assert scripted.seen[1]["at"] - scripted.seen[0]["at"] >= 0.95  # Retry-After: 1 was honoured
    # The next call generates its own key.
    scripted.script[:] = [(202, {}, ACCEPTED)]
    client.send(recipient="u-1", template="t")
    assert scripted.seen[-1]["body"]["dedup_key"] not in keys


@pytest.mark.django_db(transaction=False)
def test_retries_stop_at_the_budget_and_raise_the_last_error(scripted: Any) -> None:
    scripted.script[:] = [(503, {}, {"error": {"code": "database_unavailable", "message": "Down.", "fields": {}}})]
    client = Notifier(base_url=scripted.url, api_key="k", retry=FAST)
    with pytest.raises(ServerError) as down:
        client.send(recipient="u-1", template="t")
    assert (down.value.status, down.value.code) == (503, "database_unavailable")
    assert len(scripted.seen) == 1 + FAST.max_retries
    # A Retry-After beyond the budget is not waited for: the 429 is raised at once.
    scripted.seen.clear()
    scripted.script[:] = [(429, {"Retry-After": "120"}, BUSY)]
    started = time.monotonic()
    with pytest.raises(RateLimitedError) as limited:
        client.send(recipient="u-1", template="t")
    assert limited.value.retry_after == 120 and len(scripted.seen) == 1
    assert time.monotonic() - started < 2
    # 4xx other than 429 are never retried.
    scripted.seen.clear()
    scripted.script[:] = [(400, {}, {"error": {"code": "invalid", "message": "No.", "fields": {"template": ["x"]}}})]
    with pytest.raises(BadRequestError):
        client.send(recipient="u-1", template="t")
    assert len(scripted.seen) == 1


@pytest.mark.django_db(transaction=False)
def test_connection_errors_are_retried_then_raised() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Notifier(base_url=f"http://127.0.0.1:{port}", api_key="k", retry=FAST)
    started = time.monotonic()
    with pytest.raises(NotifierConnectionError) as failure:
        client.send(recipient="u-1", template="t")
    assert failure.value.status is None and "Connect" in str(failure.value)
    assert time.monotonic() - started < FAST.budget_seconds

    async def via_async() -> None:
        async with AsyncNotifier(base_url=f"http://127.0.0.1:{port}", api_key="k", retry=FAST) as aclient:
            await aclient.get("x")

    with pytest.raises(NotifierConnectionError):
        asyncio.run(via_async())


# --- Event signatures -----------------------------------------------------------------------------------


def test_webhook_verification_agrees_with_the_standardwebhooks_library() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = json.dumps({"type": "delivery.sent", "data": {"delivery_id": 7}})
    now = int(time.time())
    # Signed by the library, verified by the client.
    from datetime import UTC, datetime

    library_signature = Webhook(secret).sign("evt_1", datetime.fromtimestamp(now, tz=UTC), body)
    headers = {"Webhook-Id": "evt_1", "Webhook-Timestamp": str(now), "Webhook-Signature": library_signature}
    assert webhooks.verify(body.encode(), headers, secret) == json.loads(body)
    # Signed by the client, verified by the library.
    ours = webhooks.sign(secret, msg_id="evt_2", timestamp=now, body=body)
    assert ours == Webhook(secret).sign("evt_2", datetime.fromtimestamp(now, tz=UTC), body)
    bogus = "v1," + "A" * 43 + "="
    headers2 = {"webhook-id": "evt_2", "webhook-timestamp": str(now), "webhook-signature": f"{bogus} {ours}"}
    assert Webhook(secret).verify(body, headers2) == json.loads(body)
    assert webhooks.verify(body, headers2, secret) == json.loads(body)  # one valid signature of several is enough

    for changed in (
        {**headers, "Webhook-Id": "evt_other"},
        {**headers, "Webhook-Signature": library_signature[:-4] + "AAA="},
        {k: v for k, v in headers.items() if k != "Webhook-Signature"},
    ):
        with pytest.raises(WebhookVerificationError):
            webhooks.verify(body, changed, secret)
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(body + " ", headers, secret)
    with pytest.raises(WebhookVerificationError):  # replayed later than the tolerance
        webhooks.verify(body, headers, secret, now=now + 301)
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(body, headers, "whsec_" + "A" * 32)


# --- Coverage of the API, types, release artifacts -----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "clients" / "python"


def _schema_operation_ids() -> set[str]:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {op["operationId"] for ops in schema["paths"].values() for op in ops.values() if "operationId" in op}


@pytest.mark.django_db(transaction=False)
def test_every_schema_operation_has_a_method_in_both_clients() -> None:
    operations = _schema_operation_ids()
    assert len(operations) > 40  # the schema was generated, not an empty document
    missing = sorted(operations - set(OPERATIONS))
    assert not missing, f"operations without a client method (add them to notifier_client/operations.py): {missing}"
    for operation_id, method in OPERATIONS.items():
        if method is None:
            assert NOT_FOR_CLIENTS.get(operation_id), f"{operation_id} is excluded without a reason"
            continue
        sync_method = getattr(Notifier, method, None)
        async_method = getattr(AsyncNotifier, method, None)
        assert callable(sync_method), f"Notifier has no {method}() for {operation_id}"
        assert callable(async_method), f"AsyncNotifier has no {method}() for {operation_id}"
        # The async client awaits each call, and lists are async iterators.
        returns = str(inspect.signature(async_method).return_annotation)
        assert inspect.iscoroutinefunction(async_method) or returns.startswith("AsyncIterator"), method
        assert not inspect.iscoroutinefunction(sync_method), method
    assert set(NOT_FOR_CLIENTS) <= {op for op, method in OPERATIONS.items() if method is None}


def test_the_client_type_checks_strictly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "src/notifier_client"],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (CLIENT_DIR / "src" / "notifier_client" / "py.typed").exists()


def _version(pyproject: Path) -> str:
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def test_the_client_version_follows_the_service() -> None:
    service = _version(ROOT / "pyproject.toml")
    assert _version(CLIENT_DIR / "pyproject.toml") == service
    assert notifier_client.__version__ == service  # the installed client's metadata, not a second constant
    assert notifier_client._core.USER_AGENT == f"notifier-client-python/{service}"


def test_wheel_and_sdist_build_pass_twine_check_and_install(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(CLIENT_DIR, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", ".mypy_cache"))
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    version = _version(ROOT / "pyproject.toml")
    wheel = out / f"notifier_client-{version}-py3-none-any.whl"
    sdist = out / f"notifier_client-{version}.tar.gz"
    assert wheel.exists() and sdist.exists(), sorted(p.name for p in out.iterdir())
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"notifier_client-{version}.dist-info/METADATA").decode()
    modules = {f"notifier_client/{p.name}" for p in (CLIENT_DIR / "src" / "notifier_client").glob("*.py")}
    assert modules | {"notifier_client/py.typed"} <= names
    assert f"Version: {version}" in metadata and "Requires-Dist: httpx" in metadata
    assert "License-Expression: Apache-2.0" in metadata and "Description-Content-Type: text/markdown" in metadata
    with tarfile.open(sdist) as tf:
        members = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    assert {"README.md", "LICENSE", "pyproject.toml", "src/notifier_client/py.typed"} <= members
    # The wheel imports on its own (httpx from this environment), with its version.
    target = tmp_path / "installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    probe = subprocess.run(
        [sys.executable, "-c", "import notifier_client as n; print(n.__version__, n.__file__)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    printed_version, location = probe.stdout.split()
    assert printed_version == version and location.startswith(str(target))


# --- The rest of the API, against the live server --------------------------------------------------------------


def _has_route(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def test_templates_layouts_and_previews(notifier: Notifier) -> None:
    layout = notifier.put_layout("brand", html="<style>p{color:red}</style><div>ACME</div>{{ content }}")
    assert (layout.key, layout.version) == ("brand", 1)
    assert notifier.get_layout("brand").html.startswith("<style>")
    content = {"en": {"email": {"subject": "Hi {{ name }}", "html": "<p>Hi {{ name }}</p>"}}}
    v1 = notifier.put_template("welcome", category="transactional", content=content, layout="brand")
    v2 = notifier.put_template("welcome", category="transactional", content=content, publish=False)
    assert (v1.version, v1.published, v2.version, v2.published) == (1, True, 2, False)
    template = notifier.get_template("welcome")
    assert (template.key, template.published_version, template.category) == ("welcome", 1, "transactional")
    version = notifier.get_template_version("welcome", 1)
    assert version.layout == "brand" and version.content == content
    preview = notifier.preview_template("welcome", payload={"name": "Bo"})
    assert '<p style="color: red;">Hi Bo</p>' in preview.parts("email")["html"]
    with pytest.raises(BadRequestError) as missing:
        notifier.preview_template("welcome", payload={})
    assert "payload.name" in missing.value.fields
    with pytest.raises(BadRequestError) as bad:
        notifier.put_layout("broken", html="<p>no slot</p>")
    assert "html" in bad.value.fields


def test_workflows_put_get_list_and_send(notifier: Notifier) -> None:
    content = {"en": {"inapp": {"title": "Hi", "body": "Hi {{ name }}"}}}
    notifier.put_template("hello", category="transactional", content=content)
    steps = [{"id": "bell", "type": "send", "channel": "inapp", "template": "hello"}]
    first = notifier.put_workflow("greet", category="transactional", steps=steps)
    second = notifier.put_workflow(
        "greet", category="transactional", steps=[*steps, {"id": "w", "type": "delay", "seconds": 60}]
    )
    assert (first.key, first.version, second.version) == ("greet", 1, 2)
    read = notifier.get_workflow("greet")
    assert read.version == 2 and len(read.raw["steps"]) == 2
    assert [w.key for w in notifier.workflows()] == ["greet"]
    with pytest.raises(BadRequestError) as bad:
        notifier.put_workflow("broken", category="transactional", steps=[{"id": "x", "type": "teleport"}])
    assert "step 'x'" in str(bad.value) or "steps[0].type" in bad.value.fields
    sent = notifier.send(recipient="u-wf", workflow="greet@1", payload={"name": "Bo"})
    assert (sent.workflow, sent.workflow_version) == ("greet", 1)
    assert [s["id"] for s in sent.steps] == ["bell"]
    assert notifier.get(sent.id).steps[0]["status"] == "pending"


def test_promotion_from_test_to_live_and_rollbacks(server: dict[str, Any], notifier: Notifier) -> None:
    _, test_key = api_client_create(name="py-client-test", scopes=list(SCOPES), mode="test")
    steps = [{"id": "mail", "type": "send", "channel": "email", "template": "promo"}]
    with Notifier(base_url=server["base_url"], api_key=test_key, retry=FAST) as staging:
        staging.put_layout("promo-brand", html="<div>{{ content }}</div>")
        staging.put_template("promo", category="transactional", content=CONTENT, layout="promo-brand")
        staging.put_workflow("promo-flow", category="transactional", steps=steps)
        candidates = {(c.kind, c.key): c for c in staging.promotions()}
    assert {("layout", "promo-brand"), ("template", "promo"), ("workflow", "promo-flow")} <= set(candidates)
    template = candidates["template", "promo"]
    assert (template.test_version, template.live_version) == (1, None) and "Order {{ order_id }}" in template.diff
    # Either environment's key may promote; the items are written layouts first, whatever their order here.
    results = notifier.promote(
        [
            {"kind": "workflow", "key": "promo-flow"},
            {"kind": "template", "key": "promo"},
            {"kind": "layout", "key": "promo-brand"},
            {"kind": "layout", "key": "nowhere"},
        ]
    )
    assert [(r.kind, r.key, r.status, r.live_version, r.promoted) for r in results[:3]] == [
        ("workflow", "promo-flow", 200, 1, True),
        ("template", "promo", 200, 1, True),
        ("layout", "promo-brand", 200, 1, True),
    ]
    assert (results[3].status, results[3].live_version, results[3].promoted) == (404, None, False)
    assert isinstance(results[3].error, NotFoundError) and results[3].error.code == "not_found"
    assert notifier.get_template("promo").published_version == 1
    assert not {("template", "promo"), ("layout", "promo-brand")} & {(c.kind, c.key) for c in notifier.promotions()}

    # Rollbacks, in live: each publishes the earlier version again as the next one.
    notifier.put_template("promo", category="transactional", content={"en": {"email": {"subject": "v2", "text": "2"}}})
    rolled = notifier.rollback_template("promo", version=1)
    assert (rolled.key, rolled.version, rolled.published) == ("promo", 3, True)
    assert notifier.get_template("promo").published_version == 3
    assert notifier.get_template_version("promo", 3).content == CONTENT
    with pytest.raises(NotFoundError):
        notifier.rollback_template("promo", version=99)
    with pytest.raises(BadRequestError) as bad:
        notifier.rollback_template("promo", version=0)
    assert "version" in bad.value.fields
    notifier.put_layout("promo-brand", html="<p>{{ content }}</p>")
    layout = notifier.rollback_layout("promo-brand", version=1)
    assert (layout.key, layout.version) == ("promo-brand", 3)
    assert notifier.get_layout("promo-brand").html == "<div>{{ content }}</div>"
    notifier.put_workflow(
        "promo-flow", category="transactional", steps=[*steps, {"id": "w", "type": "delay", "seconds": 5}]
    )
    workflow = notifier.rollback_workflow("promo-flow", version=1)
    assert (workflow.key, workflow.version, len(workflow.raw["steps"])) == ("promo-flow", 3, 1)
    with pytest.raises(NotFoundError):
        notifier.rollback_workflow("no-such-flow", version=1)

    async def via_async() -> tuple[list[str], int, int, int]:
        async with AsyncNotifier(base_url=server["base_url"], api_key=server["api_key"], retry=FAST) as client:
            listed = [c.key for c in await client.promotions()]
            promoted = await client.promote([{"kind": "template", "key": "nowhere"}])
            again = await client.rollback_template("promo", version=2)
            layout = await client.rollback_layout("promo-brand", version=2)
            workflow = await client.rollback_workflow("promo-flow", version=2)
            assert promoted[0].status == 404 and isinstance(promoted[0].error, NotFoundError)
            assert workflow.version is not None
            return listed, again.version, layout.version, workflow.version

    listed, template_version, layout_version, workflow_version = asyncio.run(via_async())
    assert "promo" not in listed and (template_version, layout_version, workflow_version) == (4, 4, 4)


def test_get_project_shows_the_quotas_a_send_uses(
    notifier: Notifier, server: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quotas' day by a clock the test sets (the live server runs in this process): 22:30 UTC.
    monkeypatch.setattr(quotas.daily, "clock", lambda: dt.datetime(2031, 3, 4, 22, 30, tzinfo=dt.UTC))
    environment = Environment.objects.get(pk=DEFAULT_LIVE_ENVIRONMENT_ID)
    environment.quotas = {"email": 2, "sms": 50}
    environment.save()
    for n in range(2):
        notifier.send(recipient=f"u-q{n}", **SEND, channels=["email"], payload={"order_id": n})
    with pytest.raises(RateLimitedError) as refused:
        notifier.send(recipient="u-q9", **SEND, channels=["email"], payload={"order_id": 9})
    assert refused.value.code == "quota_exceeded" and refused.value.fields == {"channel": ["email"]}
    assert refused.value.retry_after == 5400  # until midnight UTC: beyond any retry budget, raised at once

    project = notifier.get_project()

    assert (project.slug, project.environment, project.promotion) == ("default", "live", "direct")
    email = project.quotas["email"]
    assert (email.limit, email.used, email.left) == (2, 2, 0)
    assert email.resets_at == dt.datetime(2031, 3, 5, tzinfo=dt.UTC)
    assert (project.quotas["sms"].used, project.quotas["sms"].left) == (0, 50)

    async def via_async() -> int:
        async with AsyncNotifier(base_url=server["base_url"], api_key=server["api_key"], retry=FAST) as client:
            return (await client.get_project()).quotas["email"].used

    assert asyncio.run(via_async()) == 2


def test_event_endpoint_lifecycle(notifier: Notifier, settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    created = notifier.set_event_endpoint(url="http://127.0.0.1:9/events", events=["delivery.sent"], max_batch=10)
    assert created.secret and created.secret.startswith("whsec_")
    assert (created.events, created.max_batch) == (["delivery.sent"], 10)
    fetched = notifier.get_event_endpoint()
    assert fetched.url == "http://127.0.0.1:9/events" and fetched.secret is None
    rotated = notifier.rotate_event_secret()
    assert rotated.secret and rotated.secret != created.secret
    assert list(notifier.event_attempts()) == []
    notifier.delete_event_endpoint()
    with pytest.raises(NotFoundError):
        notifier.get_event_endpoint()


def test_campaigns_dead_letters_and_pages_of_one(notifier: Notifier) -> None:
    notifier.put_topic("news", name="News")
    created = [
        notifier.create_campaign(name=f"c{i}", template="shipped", topic="news", draft=True, payload={"order_id": "1"})
        for i in range(3)
    ]
    assert {c.status for c in created} == {"draft"}
    renamed = notifier.update_campaign(created[0].id, name="renamed")
    assert renamed.name == "renamed" and notifier.get_campaign(created[0].id).name == "renamed"
    cancelled = notifier.campaign_action(created[1].id, "cancel")
    assert cancelled.status == "cancelled"
    with pytest.raises(ValueError):
        notifier.campaign_action(created[1].id, "explode")
    # limit=1: three pages, each followed by its next_cursor.
    assert sorted(c.id for c in notifier.campaigns(limit=1)) == sorted(c.id for c in created)
    assert list(notifier.dead_letters(limit=1)) == []
    assert notifier.replay_dead_letters(all=True, channel="email") == 0
    with pytest.raises(NotFoundError):
        notifier.replay_dead_letter(999_999)
    with pytest.raises(NotFoundError):
        notifier.discard_dead_letter(999_999)


def test_inbox_and_sandbox_messages_sync_and_async(server: dict[str, Any], notifier: Notifier) -> None:
    from channels_app.services import deliver

    recipient_upsert(user_id="u-box", email="box@example.com")
    inapp = {"en": {"inapp": {"title": "T{{ n }}", "body": "B{{ n }}"}, "email": {"subject": "S{{ n }}", "text": "x"}}}
    template_put(key="boxed", category="transactional", default_locale="en", content=inapp)
    ids: list[int] = []
    for n in range(3):
        sent = notifier.send(recipient="u-box", template="boxed", category="transactional", payload={"n": n})
        ids.extend(d.id for d in sent.deliveries)
    deliver(ids)
    items = list(notifier.inbox("u-box", limit=1))
    assert [i.title for i in items] == ["T2", "T1", "T0"] and all(i.read_at is None for i in items)
    assert notifier.mark_inbox_read("u-box", items[0].id).read_at is not None
    assert [i.title for i in notifier.inbox("u-box", unread=True)] == ["T1", "T0"]
    token = notifier.create_inbox_token("u-box", ttl_seconds=600).token
    assert [i.title for i in notifier.browser_inbox(token, unread=True, limit=1)] == ["T1", "T0"]
    assert notifier.browser_mark_read(token, items[1].id).read_at is not None
    assert notifier.browser_mark_all_read(token).unread_count == 0
    assert notifier.mark_inbox_all_read("u-box").marked_read == 0
    emails = list(notifier.sandbox_messages(channel="email", address="box@example.com", limit=2))
    assert sorted(m.content["subject"] for m in emails) == ["S0", "S1", "S2"]
    with pytest.raises(AuthenticationError):
        list(notifier.browser_inbox("not-a-token"))

    async def scenario() -> tuple[list[str], list[str], int]:
        async with AsyncNotifier(base_url=server["base_url"], api_key=server["api_key"], retry=FAST) as client:
            titles = [i.title async for i in client.inbox("u-box", limit=2)]
            subjects = [m.content["subject"] async for m in client.sandbox_messages(channel="email", limit=1)]
            layout = await client.put_layout("async-brand", html="<b>{{ content }}</b>")
            return titles, subjects, layout.version

    titles, subjects, layout_version = asyncio.run(scenario())
    assert titles == ["T2", "T1", "T0"] and sorted(subjects) == ["S0", "S1", "S2"] and layout_version == 1


def test_lists_of_templates_topics_and_recipients(notifier: Notifier) -> None:
    if not _has_route("/api/v1/templates"):
        pytest.skip("this server has no template, topic and recipient lists yet")
    for key in ("a1", "a2", "a3"):
        template_put(key=key, category="transactional", default_locale="en", content=CONTENT)
        notifier.put_topic(key, name=key)
        recipient_upsert(user_id=f"u-{key}", email=f"{key}@example.com")
    assert {"a1", "a2", "a3"} <= {t.key for t in notifier.templates(limit=1)}
    assert {"a1", "a2", "a3"} <= {t.key for t in notifier.topics(limit=2)}
    assert [r.id for r in notifier.recipients(email="a2@example.com")] == ["u-a2"]


def test_statistics(notifier: Notifier) -> None:
    if not _has_route("/api/v1/stats"):
        pytest.skip("this server has no statistics endpoint yet")
    from django.utils import timezone

    today = timezone.now().date()
    stats = notifier.stats(from_day=today, to_day=today, group_by=["day", "channel"])
    assert stats.from_day == today.isoformat() and isinstance(stats.rows, list)


@pytest.mark.django_db(transaction=False)
def test_list_iterators_follow_next_cursor_in_either_page_shape(scripted: Any) -> None:
    # Lists answer `results` (some older ones `items` too); a page without next_cursor (or "") is the last.
    scripted.script[:] = [
        (200, {}, {"results": [{"key": "t1"}, {"key": "t2"}], "next_cursor": "c2"}),
        (200, {}, {"items": [{"key": "t3"}], "next_cursor": ""}),
    ]
    client = Notifier(base_url=scripted.url + "/", api_key="k", retry=FAST)
    assert [t.key for t in client.templates(limit=2)] == ["t1", "t2", "t3"]
    assert [hit["path"] for hit in scripted.seen] == [
        "/api/v1/templates?limit=2",
        "/api/v1/templates?limit=2&cursor=c2",
    ]

    scripted.seen.clear()
    scripted.script[:] = [(200, {}, {"results": [{"user_id": "u-1", "email": "a@example.com"}], "next_cursor": None})]

    async def via_async() -> list[str]:
        async with AsyncNotifier(base_url=scripted.url, api_key="k", retry=FAST) as aclient:
            return [r.id async for r in aclient.recipients(email="a@example.com")]

    assert asyncio.run(via_async()) == ["u-1"]
    assert scripted.seen[0]["path"] == "/api/v1/recipients?email=a%40example.com"
    assert scripted.seen[0]["auth"] == "Bearer k"


@pytest.mark.django_db(transaction=False)
def test_stats_and_the_browser_inbox_send_what_the_contract_says(scripted: Any) -> None:
    row = {"day": "2026-12-01", "channel": "email", "status": "sent", "count": 3}
    scripted.script[:] = [(200, {}, {"results": [row], "from": "2026-11-30", "to": "2026-12-01"})]
    client = Notifier(base_url=scripted.url, api_key="k", retry=FAST)
    stats = client.stats(
        from_day=dt.date(2026, 11, 30), to_day="2026-12-01", group_by=["day", "channel"], mode="test", scope="project"
    )
    assert (stats.rows, stats.from_day, stats.to_day) == ([row], "2026-11-30", "2026-12-01")
    path = scripted.seen[0]["path"]
    assert path.startswith("/api/v1/stats?") and set(path.split("?")[1].split("&")) == {
        "from=2026-11-30", "to=2026-12-01", "group_by=day%2Cchannel", "mode=test", "scope=project"
    }  # fmt: skip
    # The browser inbox is under /inbox/v1/ and authenticates with the inbox token, not the API key.
    scripted.seen.clear()
    scripted.script[:] = [(200, {}, {"items": [], "results": [], "unread_count": 0, "next_cursor": None})]
    assert list(client.browser_inbox("tok-1", unread=True)) == []
    assert scripted.seen[0]["path"] == "/inbox/v1/messages?unread=true"
    assert scripted.seen[0]["auth"] == "Bearer tok-1"
