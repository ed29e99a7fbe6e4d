"""The TypeScript client (clients/typescript) against the real server and real workers, driven from Node.

Each test here compiles the client with its tests (the pinned `typescript` of clients/typescript/node_modules, put
there by `npm ci`) and runs one of them with `node`: the scenarios of test/live.ts against the live server (their
printed results checked against the database here), the retries of test/offline.test.ts against a scripted
loopback server, and test/webhooks.ts against the server's signer and the standardwebhooks library.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from standardwebhooks.webhooks import Webhook

from channels_app.providers.webhook import sign as server_sign
from core.scopes import SCOPES
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery, Notification
from preferences.models import Recipient
from preferences.services import recipient_upsert
from templates_app.services import template_put

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "clients" / "typescript"
CONTENT = {"en": {"email": {"subject": "Order {{ order_id }}", "text": "Shipped {{ order_id }}"}}}
# One pytest-xdist worker runs the whole module: the compile (module fixture) costs a core for a while, once.
pytestmark = pytest.mark.xdist_group("typescript-client")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed: the TypeScript client's tests need Node.js 20 or later and npm "
            "(Debian: apt-get install nodejs npm), then `make client-ts`"
        )
    return path


def _node() -> str:
    node = _tool("node")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        pytest.fail(f"the TypeScript client needs Node.js 20 or later (fetch, node:test); this one is {version}")
    return node


def _installed(package: str) -> Path:
    path = CLIENT_DIR / "node_modules" / package
    if not path.is_dir():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: run `npm ci` in clients/typescript (or `make client-ts`)")
    return path


def _run(args: list[str], *, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Compile the client and its tests (tsconfig.test.json: strict, type tests included) into a fresh directory."""
    out = tmp_path_factory.mktemp("ts-build")
    tsc = _installed("typescript") / "bin" / "tsc"
    _run([_node(), str(tsc), "-p", str(CLIENT_DIR / "tsconfig.test.json"), "--outDir", str(out)])
    (out / "package.json").write_text('{"type": "module"}\n')  # the compiled files are ES modules, as in the package
    return out


def _live(compiled: Path, scenario: str, env: dict[str, str]) -> Any:
    result = _run([_node(), str(compiled / "test" / "live.js"), scenario], env={**os.environ, **env}, timeout=180)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def server(live_server: Any, settings: Any) -> dict[str, str]:
    """Return the environment of test/live.ts: the live server's URL, a key with every scope and a limited one."""
    settings.PUBLIC_BASE_URL = live_server.url
    template_put(key="shipped", category="transactional", default_locale="en", content=CONTENT)
    _, key = api_client_create(name="ts-client", scopes=list(SCOPES))
    _, limited = api_client_create(name="ts-only-marketing", allowed_categories=["marketing"])
    return {"NOTIFIER_URL": live_server.url, "NOTIFIER_KEY": key, "NOTIFIER_LIMITED_KEY": limited}


@pytest.mark.django_db(transaction=True)
def test_send_reaches_sent_and_get_shows_it(compiled: Path, server: dict[str, str], start_worker: Any) -> None:
    recipient_upsert(user_id="u-ts", email="ts@example.com")
    start_worker(queues=["email.high", "email.low"])
    out = _live(compiled, "send", server)
    delivery = Delivery.objects.get(pk=out["delivery_id"])
    assert (delivery.status, str(delivery.notification_id)) == ("sent", out["id"])
    # The generated dedup_key went with the send: the one the server stored is the one the client made.
    stored = Notification.objects.get(pk=out["id"])
    assert stored.dedup_key == out["dedup_key"] and re.fullmatch(r"nc-[0-9a-f]{32}", stored.dedup_key or "")
    assert out["mode"] == "live"


@pytest.mark.django_db(transaction=True)
def test_dedup_key_duplicates_and_conflicts(compiled: Path, server: dict[str, str]) -> None:
    out = _live(compiled, "dedup", server)
    assert out["conflict_code"]
    keys = dict(Notification.objects.values_list("id", "dedup_key"))
    assert len(keys) == 3  # k-1 once (its repeat a duplicate, its conflict refused), then two without a key
    by_id = {str(pk): key for pk, key in keys.items()}
    assert by_id[out["first"]] == "k-1"
    assert by_id[out["a"]] != by_id[out["b"]] and all(by_id[n].startswith("nc-") for n in (out["a"], out["b"]))


@pytest.mark.django_db(transaction=True)
def test_errors_carry_the_api_error_shape(compiled: Path, server: dict[str, str]) -> None:
    out = _live(compiled, "errors", server)
    assert out["bad"]["code"] == "invalid" and out["bad"]["message"]
    assert list(out["bad"]["fields"]) == ["category"] and all(
        isinstance(r, str) for r in out["bad"]["fields"]["category"]
    )
    assert out["forbidden"]["code"] and out["forbidden"]["message"]
    assert not Notification.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_batch_topic_cancel_and_pages(compiled: Path, server: dict[str, str]) -> None:
    out = _live(compiled, "batch", server)
    singles = {str(pk) for pk in Notification.objects.filter(topic__isnull=True).values_list("id", flat=True)}
    assert set(out["accepted"]) == singles and len(singles) == 60
    assert out["listed"] == [
        str(pk)
        for pk in Notification.objects.filter(topic__isnull=True)
        .order_by("-created_at", "-id")
        .values_list("id", flat=True)
    ]
    assert Notification.objects.get(pk=out["topic"]).status == "cancelled"
    # Each item got its own key, made by the client.
    keys = set(Notification.objects.filter(topic__isnull=True).values_list("dedup_key", flat=True))
    assert len(keys) == 60 and all(k.startswith("nc-") for k in keys)


@pytest.mark.django_db(transaction=True)
def test_recipients_lists_and_any_operation(compiled: Path, server: dict[str, str]) -> None:
    for key in ("a1", "a2", "a3"):
        template_put(key=key, category="transactional", default_locale="en", content=CONTENT)
        recipient_upsert(user_id=f"u-{key}", email=f"{key}@example.com")
    out = _live(compiled, "recipients", server)
    assert out["odd"] == "u r+1@x" and Recipient.objects.filter(user_id="u r+1@x", locale="de").exists()
    assert out["templates"] == ["shipped", "a1", "a2", "a3"]  # oldest first, a page of one at a time
    assert out["layout_version"] == 1


@pytest.mark.django_db(transaction=True)
def test_recipients_with_chat_addresses_one_and_in_a_batch_then_chat_to_them(
    compiled: Path, server: dict[str, str]
) -> None:
    template_put(key="deploy", category="transactional", default_locale="en", content={"en": {"chat": {"text": "Hi"}}})
    out = _live(compiled, "chatRecipients", server)
    assert out["refused"] == 2
    chats = dict(Recipient.objects.filter(user_id__startswith="u-").values_list("user_id", "chat"))
    assert chats == {"u-chat": {"telegram": "123456789"}, "u-b1": {"slack": "#ops", "telegram": "@newsroom"}}
    sent = Delivery.objects.filter(notification_id=out["user"]).order_by("channel")
    assert [(d.channel, d.address) for d in sent] == [("slack", "#ops"), ("telegram", "@newsroom")]
    (bare,) = Delivery.objects.filter(notification_id=out["bare"])
    assert (bare.channel, bare.address) == ("slack", "#alerts")


@pytest.mark.django_db(transaction=False)
def test_retries_pages_and_the_wire_against_a_scripted_server(compiled: Path) -> None:
    result = _run([_node(), "--test", "--test-reporter=tap", str(compiled / "test" / "offline.test.js")], timeout=120)
    assert re.search(r"^# pass 7$", result.stdout, re.M) and re.search(r"^# fail 0$", result.stdout, re.M), (
        result.stdout
    )


def test_webhook_verification_agrees_with_the_server_and_the_library(compiled: Path) -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = json.dumps({"type": "delivery.sent", "data": {"delivery_id": 7, "note": "é ✓"}}, ensure_ascii=False)
    now = int(time.time())
    library = Webhook(secret).sign("evt_1", datetime.fromtimestamp(now, tz=UTC), body)
    ours = server_sign(secret=secret, msg_id="evt_2", timestamp=now, body=body.encode())
    bogus = "v1," + "A" * 43 + "="
    headers = {"Webhook-Id": "evt_1", "Webhook-Timestamp": str(now), "Webhook-Signature": library}
    server_headers = {"webhook-id": "evt_2", "webhook-timestamp": str(now), "webhook-signature": f"{bogus} {ours}"}
    cases: list[dict[str, Any]] = [
        {"body": body, "headers": headers},  # signed by the library
        {"body": body, "headers": server_headers},  # by the server's sender, one valid signature of two
        {"body": body, "headers": {**headers, "Webhook-Id": "evt_other"}},
        {"body": body, "headers": {**headers, "Webhook-Signature": library[:-4] + "AAA="}},
        {"body": body, "headers": {k: v for k, v in headers.items() if k != "Webhook-Signature"}},
        {"body": body + " ", "headers": headers},
        {"body": body, "headers": headers, "now": now + 301},  # replayed later than the tolerance
        {"body": body, "headers": headers, "secret": "whsec_" + "A" * 32},
        {"body": body, "headers": {**headers, "Webhook-Signature": "v2," + library[3:]}},
    ]
    to_sign = [{"msgId": "evt_3", "timestamp": now, "body": body}]
    stdin = json.dumps({"secret": secret, "verify": cases, "sign": to_sign}, ensure_ascii=False)
    result = _run([_node(), str(compiled / "test" / "webhooks.js")], input=stdin, timeout=60)
    out = json.loads(result.stdout)
    event = json.loads(body)
    assert out["verified"] == [event, event] + [{"error": "WebhookVerificationError"}] * 7
    # Signed by the client, verified by the library, and the same bytes as the server's signer.
    [signed] = out["signed"]
    assert signed == server_sign(secret=secret, msg_id="evt_3", timestamp=now, body=body.encode())
    library_headers = {"webhook-id": "evt_3", "webhook-timestamp": str(now), "webhook-signature": signed}
    assert Webhook(secret).verify(body, library_headers) == event


def _types_from(schema: Path, out: Path) -> str:
    cli = _installed("openapi-typescript") / "bin" / "cli.js"
    script = json.loads((CLIENT_DIR / "package.json").read_text())["scripts"]["generate"]
    options = script.split("../../var/openapi.yml", 1)[1].split("--output", 1)[0].split()
    _run([_node(), str(cli), str(schema), *options, "--output", str(out)], cwd=CLIENT_DIR)
    return out.read_text()


@pytest.mark.django_db(transaction=False)
def test_the_committed_types_are_the_schema(tmp_path: Path, settings: Any) -> None:
    # The document `make test` checks (manage.py spectacular), made here the same way, then the pinned generator.
    settings.DEBUG = True
    schema = tmp_path / "openapi.yml"
    call_command("spectacular", "--file", str(schema))
    generated = _types_from(schema, tmp_path / "schema.ts")
    committed = (CLIENT_DIR / "src" / "schema.ts").read_text()
    assert "export interface paths" in generated and '"/api/v1/notifications/batch"' in generated
    assert committed == generated, (
        "clients/typescript/src/schema.ts is not what the schema generates: run `make client-ts-types` and commit it"
    )


def _npm_version(python_version: str) -> str:
    # PEP 440's "0.1.0.dev0" is semver's "0.1.0-dev.0": the same release, spelled for each registry.
    return re.sub(r"\.?(dev|a|b|rc)(\d+)$", r"-\1.\2", python_version)


def test_npm_pack_builds_a_package_without_dependencies_that_installs(tmp_path: Path) -> None:
    npm = _tool("npm")
    _installed("typescript")
    package = json.loads((CLIENT_DIR / "package.json").read_text())
    service = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert package["version"] == _npm_version(service)
    assert not {"dependencies", "peerDependencies", "optionalDependencies", "bundleDependencies"} & set(package)
    lock = json.loads((CLIENT_DIR / "package-lock.json").read_text())
    assert lock["packages"][""]["devDependencies"] == package["devDependencies"]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", pin) for pin in package["devDependencies"].values())  # exact pins

    packed = _run([npm, "pack", "--json", "--pack-destination", str(tmp_path)], cwd=CLIENT_DIR)
    [info] = json.loads(packed.stdout[packed.stdout.index("[") :])
    files = {f["path"] for f in info["files"]}
    assert {"package.json", "README.md", "LICENSE", "dist/index.js", "dist/index.d.ts", "dist/schema.d.ts"} <= files
    assert not {f for f in files if f.startswith(("src/", "test/", "node_modules/"))}
    tarball = tmp_path / info["filename"]
    with tarfile.open(tarball) as tf:
        assert json.load(tf.extractfile("package/package.json"))["version"] == package["version"]  # type: ignore[arg-type]

    # Installed into an empty project from the tarball alone (no registry: it has nothing to fetch).
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true, "type": "module"}\n')
    _run([npm, "install", "--offline", "--no-audit", "--no-fund", str(tarball)], cwd=app)
    probe = (
        "import * as n from 'notifier-client';"
        "console.log(n.VERSION, n.USER_AGENT, typeof n.Notifier, typeof n.webhooks.verify)"
    )
    result = _run([_node(), "--input-type=module", "-e", probe], cwd=app, timeout=60)
    assert result.stdout.split() == [
        package["version"],
        f"notifier-client-typescript/{package['version']}",
        "function",
        "function",
    ]
