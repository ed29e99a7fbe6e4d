"""Test keys: the whole pipeline runs for a `test` client, but every delivery goes to the sandbox provider."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from channels_app import services as pipeline
from channels_app.models import SandboxMessage
from channels_app.providers import registry
from core import metrics
from core.scopes import SCOPES
from notifier.accepting.services import notification_accept
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID, DEFAULT_TEST_ENVIRONMENT_ID
from projects.scoping import owner_scope
from templates_app.services import template_put
from tests.conftest import bearer_client, wait_for
from tests.stubs.config import configure_settings

CONTENT = {
    "en": {
        "email": {"subject": "Shipped {{ order }}", "text": "Order {{ order }} is on its way"},
        "webhook": {"body": {"event": "order.shipped", "order": "{{ order }}"}},
        "inapp": {"title": "Shipped", "body": "Order {{ order }}"},
    }
}


def _send(http: Any, user_id: str, channels: list[str]) -> dict[str, Any]:
    response = http.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": user_id}, "template": "shipped", "channels": channels, "payload": {"order": "A-1"}},
        format="json",
    )
    assert response.status_code == 202, response.content
    return response.json()


def _settled(body: dict[str, Any], n: int) -> list[Delivery]:
    ids = [d["id"] for d in body["deliveries"]]
    try:
        return wait_for(
            lambda: (rows := list(Delivery.objects.filter(pk__in=ids, status="sent"))) and len(rows) == n and rows, 60
        )
    except AssertionError:
        states = list(Delivery.objects.filter(pk__in=ids).values_list("channel", "status", "provider", "last_error"))
        raise AssertionError(f"not all sent: {states}") from None


def _verify_sender(aws_env: dict[str, str]) -> None:
    """Verify the sender identity in moto, as an SES account must before it sends (the live key's email)."""
    import boto3

    boto3.client(
        "sesv2",
        endpoint_url=aws_env["SES_ENDPOINT_URL"],
        region_name=aws_env["AWS_REGION"],
        aws_access_key_id=aws_env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=aws_env["AWS_SECRET_ACCESS_KEY"],
    ).create_email_identity(EmailIdentity="no-reply@notifier.test")


def _in_both_environments(make: Any) -> None:
    """Make the same rows in the default project's live and test environments (each key sees only its own)."""
    for environment_id in (DEFAULT_LIVE_ENVIRONMENT_ID, DEFAULT_TEST_ENVIRONMENT_ID):
        with owner_scope(environment_id):
            make()


@pytest.mark.django_db(transaction=True)
def test_a_test_keys_email_and_webhook_reach_only_the_sandbox_a_live_keys_reach_the_providers(
    start_worker: Any, aws_stub: Any, aws_env: dict[str, str], webhook_receiver: Any, webhook_env: dict[str, str]
) -> None:
    test_client, test_key = api_client_create(name="staging", scopes=list(SCOPES), mode="test")
    live_client, live_key = api_client_create(name="production", scopes=list(SCOPES))

    def make() -> None:
        template_put(key="shipped", category="transactional", default_locale="en", content=CONTENT)
        for user_id in ("u-test", "u-live"):
            recipient_upsert(
                user_id=user_id, email=f"{user_id}@example.com", webhook_url=f"{webhook_receiver.url}/hooks"
            )

    _in_both_environments(make)
    _verify_sender(aws_env)
    start_worker(env={**aws_env, **webhook_env, "EMAIL_PROVIDERS": "ses", "WEBHOOK_PROVIDERS": "webhook"})

    staging, production = bearer_client(test_key), bearer_client(live_key)
    accepted = _send(staging, "u-test", ["email", "webhook", "inapp"])
    assert accepted["mode"] == "test"
    sent = _settled(accepted, 3)
    assert {d.provider for d in sent} == {"sandbox"}
    recorded = SandboxMessage.objects.filter(delivery_id__in=[d.pk for d in sent])
    assert sorted(recorded.values_list("channel", "address")) == [
        ("email", "u-test@example.com"),
        ("inapp", "u-test"),
        ("webhook", f"{webhook_receiver.url}/hooks"),
    ]
    assert aws_stub.ses_sends() == []
    assert webhook_receiver.requests == []
    # The rest of the pipeline ran as for any key: rendering, the status history, the inbox.
    detail = staging.get(f"/api/v1/notifications/{accepted['id']}").json()
    assert detail["mode"] == "test"
    assert {d["provider"] for d in detail["deliveries"]} == {"sandbox"}
    assert all("sent" in [e["status"] for e in d["events"]] for d in detail["deliveries"])
    inbox = staging.get("/api/v1/recipients/u-test/inbox").json()
    assert [item["title"] for item in inbox["items"]] == ["Shipped"]
    listed = staging.get("/api/v1/notifications").json()["results"]
    assert [n["mode"] for n in listed] == ["test"]

    live = _send(production, "u-live", ["email", "webhook"])
    assert live["mode"] == "live"
    delivered = _settled(live, 2)
    assert sorted(d.provider for d in delivered) == ["ses", "webhook"]
    assert len(aws_stub.ses_sends()) == 1
    assert len(webhook_receiver.requests) == 1
    assert not SandboxMessage.objects.filter(delivery_id__in=[d.pk for d in delivered]).exists()
    assert (test_client.mode, live_client.mode) == ("test", "live")


@pytest.mark.django_db(transaction=True)
def test_a_test_delivery_pinned_to_a_real_provider_still_goes_to_the_sandbox(
    settings: Any,
    request: pytest.FixtureRequest,
    aws_stub: Any,
    aws_env: dict[str, str],
    webhook_env: dict[str, str],
) -> None:
    """In-process pipeline: the send counters carry the mode, and a pin (an ambiguous earlier try) is ignored."""
    configure_settings(settings, {**aws_env, **webhook_env})
    settings.CHANNEL_PROVIDERS = {**settings.CHANNEL_PROVIDERS, "email": ["ses"]}
    registry.get_provider.cache_clear()  # adapters are built once per process, from the settings of then
    request.addfinalizer(registry.get_provider.cache_clear)
    client, _ = api_client_create(name="staging", mode="test")
    with owner_scope(client.environment_id):
        template_put(key="shipped", category="transactional", default_locale="en", content=CONTENT)
        recipient_upsert(user_id="u-1", email="u1@example.com")
    result = notification_accept(
        client=client,
        data={"recipient": {"user_id": "u-1"}, "template": "shipped", "channels": ["email"], "payload": {"order": "A"}},
    )
    [delivery] = result.deliveries
    Delivery.objects.filter(pk=delivery.pk).update(pinned_provider="ses")
    before = metrics.DELIVERIES.labels("email", "sandbox", "sent", "test")._value.get()
    report = pipeline.deliver([delivery.pk])
    assert report.claimed == 1
    sent = Delivery.objects.get(pk=delivery.pk)
    assert (sent.status, sent.provider) == ("sent", "sandbox")
    assert aws_stub.ses_sends() == []
    assert metrics.DELIVERIES.labels("email", "sandbox", "sent", "test")._value.get() == before + 1


@pytest.mark.django_db
def test_create_api_client_test_flag_and_the_default() -> None:
    call_command("create_api_client", "staging", "--test", stdout=StringIO())
    call_command("create_api_client", "billing", stdout=StringIO())
    assert ApiClient.objects.get(name="staging").mode == "test"
    assert ApiClient.objects.get(name="billing").mode == "live"
    with pytest.raises(ValueError, match="unknown mode"):
        api_client_create(name="odd", mode="demo")


@pytest.mark.django_db
def test_admin_marks_test_clients_and_their_notifications(staff: Any) -> None:
    _in_both_environments(
        lambda: template_put(key="shipped", category="transactional", default_locale="en", content=CONTENT)
    )
    test_client, _ = api_client_create(name="staging", mode="test")
    live_client, _ = api_client_create(name="production")
    for client in (test_client, live_client):
        notification_accept(
            client=client, data={"recipient": {"user_id": "u-1"}, "template": "shipped", "channels": ["inapp"]}
        )
    admin = staff
    clients = admin.get("/admin/clients/apiclient/").content.decode()
    assert clients.count("mode-test") == 1 and "mode-live" in clients
    only_test = admin.get("/admin/clients/apiclient/?mode__exact=test").content.decode()
    assert "staging" in only_test and "production" not in only_test
    notifications = admin.get("/admin/deliveries/notification/?client__mode__exact=test").content.decode()
    assert notifications.count("mode-test") == 1 and "mode-live" not in notifications
    # The mode is chosen once: the change form shows it, read-only.
    change = admin.get(f"/admin/clients/apiclient/{test_client.pk}/change/").content.decode()
    assert 'name="mode"' not in change and "Test" in change
    add = admin.get("/admin/clients/apiclient/add/").content.decode()
    assert 'name="mode"' in add
    base = {"scopes": ["send"], "is_active": "on"}
    assert admin.post("/admin/clients/apiclient/add/", {**base, "name": "qa", "mode": "test"}).status_code == 200
    assert admin.post("/admin/clients/apiclient/add/", {**base, "name": "plain"}).status_code == 200
    assert ApiClient.objects.get(name="qa").mode == "test"
    assert ApiClient.objects.get(name="plain").mode == "live"
    # The mode picks the project's environment the key belongs to.
    assert ApiClient.objects.get(name="qa").environment_id == DEFAULT_TEST_ENVIRONMENT_ID
    assert ApiClient.objects.get(name="plain").environment_id == DEFAULT_LIVE_ENVIRONMENT_ID


@pytest.mark.django_db
def test_every_answer_about_a_test_keys_notifications_says_test() -> None:
    _in_both_environments(
        lambda: template_put(key="shipped", category="transactional", default_locale="en", content=CONTENT)
    )
    _, test_key = api_client_create(name="staging", mode="test")
    _, live_key = api_client_create(name="production")
    item = {"recipient": {"user_id": "u-1"}, "template": "shipped", "channels": ["inapp"], "payload": {"order": "A"}}
    for key, mode, name in ((test_key, "test", "staging"), (live_key, "live", "production")):
        counted = metrics.NOTIFICATIONS_ACCEPTED.labels("transactional", name, mode)._value.get()
        http = bearer_client(key)
        batch = http.post(
            "/api/v1/notifications/batch",
            {"notifications": [{**item, "dedup_key": "a"}, {**item, "dedup_key": "b"}]},
            format="json",
        )
        assert [r["mode"] for r in batch.json()["results"]] == [mode, mode]
        # A duplicate answers with the original, in the same mode.
        again = http.post("/api/v1/notifications", {**item, "dedup_key": "a"}, format="json")
        assert again.status_code == 200 and again.json()["mode"] == mode
        # The accept counter keeps test traffic apart (duplicates are not counted).
        assert metrics.NOTIFICATIONS_ACCEPTED.labels("transactional", name, mode)._value.get() == counted + 2
