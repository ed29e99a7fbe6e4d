"""Projects and environments: what one project environment's key made is invisible to every other's, over the API.

Keys of two projects, and the test and live keys of one: each makes its own templates, layouts, workflows,
topics, recipients and notifications under the same names, and reads, changes or sends only its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command

from channels_app import services as pipeline
from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.selectors import delivery_rendered
from notifier.inbox import fanout as inbox_fanout
from preferences.models import Recipient, Suppression, Topic
from projects.models import Environment
from projects.scoping import owner_id
from projects.services import project_create
from templates_app.models import Template
from tests.conftest import purge_all_queues

CONTENT = {
    "en": {
        "email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"},
        "inapp": {"title": "Hi", "body": "Hello {{ name }}"},
    }
}


@pytest.fixture
def keys(api_client_factory: Callable[..., tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """Keys of project A (live and test) and of project B (live), every scope."""
    project_create(slug="proj-a")
    project_create(slug="proj-b")
    return {
        "a": api_client_factory(project="proj-a"),
        "a_test": api_client_factory(project="proj-a", mode="test"),
        "b": api_client_factory(project="proj-b"),
    }


def _make_everything(api: Any, email: str) -> dict[str, Any]:
    """Make a template, layout, workflow, topic, recipient, suppression and notification; return what was made."""
    assert api.put("/api/v1/layouts/brand", {"html": "<main>{{ content }}</main>"}, format="json").status_code == 201
    body = {"category": "transactional", "content": CONTENT, "layout": "brand"}
    assert api.put("/api/v1/templates/welcome", body, format="json").status_code == 201
    flow = {
        "category": "transactional",
        "steps": [{"id": "s", "type": "send", "channel": "inapp", "template": "welcome"}],
    }
    assert api.put("/api/v1/workflows/onboard", flow, format="json").status_code == 201
    assert api.put("/api/v1/topics/news", {"name": "News"}, format="json").status_code in (200, 201)
    assert api.put("/api/v1/recipients/u-1", {"email": email}, format="json").status_code in (200, 201)
    added = api.post("/api/v1/topics/news/subscribers", {"user_ids": ["u-1"]}, format="json")
    assert added.status_code == 200, added.content
    suppressed = api.post("/api/v1/suppressions", {"channel": "email", "address": "gone@example.com"}, format="json")
    assert suppressed.status_code == 201, suppressed.content
    sent = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-1"}, "template": "welcome", "payload": {"name": "Ann"}, "dedup_key": "k-1"},
        format="json",
    )
    assert sent.status_code == 202, sent.content
    return {"notification": sent.json()["id"], "suppression": suppressed.json()["id"]}


@pytest.mark.django_db(transaction=True)
def test_each_project_environment_sees_only_its_own(keys: dict[str, tuple[Any, Any]]) -> None:
    (a, a_api), (_, a_test_api), (_, b_api) = keys["a"], keys["a_test"], keys["b"]
    made = _make_everything(a_api, "ann@a.example")

    for other in (a_test_api, b_api):
        for path in (
            "/api/v1/templates/welcome",
            "/api/v1/layouts/brand",
            "/api/v1/workflows/onboard",
            "/api/v1/topics/news",
            "/api/v1/recipients/u-1",
            "/api/v1/recipients/u-1/preferences",
            f"/api/v1/notifications/{made['notification']}",
        ):
            assert other.get(path).status_code == 404, path
        assert other.post(f"/api/v1/notifications/{made['notification']}/cancel").status_code == 404
        assert other.delete(f"/api/v1/suppressions/{made['suppression']}").status_code == 404
        assert other.delete("/api/v1/recipients/u-1").status_code == 404
        assert other.get("/api/v1/notifications").json()["results"] == []
        assert other.get("/api/v1/suppressions").json()["results"] == []
        # Sending A's template or to A's topic: unknown here.
        sent = other.post(
            "/api/v1/notifications", {"recipient": {"user_id": "u-1"}, "template": "welcome"}, format="json"
        )
        assert sent.status_code == 400 and "template" in sent.json()["error"]["fields"]

    # The same names made by B and by A's test key are their own rows; A's are unchanged.
    made_b = _make_everything(b_api, "bob@b.example")
    made_t = _make_everything(a_test_api, "tess@a.example")
    assert len({made["notification"], made_b["notification"], made_t["notification"]}) == 3  # dedup_key k-1 thrice
    assert a_api.get("/api/v1/recipients/u-1").json()["email"] == "ann@a.example"
    assert b_api.get("/api/v1/recipients/u-1").json()["email"] == "bob@b.example"
    assert Recipient.objects.filter(user_id="u-1").count() == 3
    assert Template.objects.filter(key="welcome").count() == 3
    assert Topic.objects.filter(key="news").count() == 3
    environments = {a.environment_id, keys["a_test"][0].environment_id, keys["b"][0].environment_id}
    assert set(Template.objects.filter(key="welcome").values_list("environment_id", flat=True)) == environments
    assert Suppression.objects.filter(address="gone@example.com").count() == 3


@pytest.mark.django_db
def test_the_suppression_list_of_one_project_does_not_suppress_another(keys: dict[str, tuple[Any, Any]]) -> None:
    (_, a_api), (_, b_api) = keys["a"], keys["b"]
    for api in (a_api, b_api):
        assert (
            api.put(
                "/api/v1/templates/welcome", {"category": "transactional", "content": CONTENT}, format="json"
            ).status_code
            == 201
        )
        assert api.put("/api/v1/recipients/u-1", {"email": "same@example.com"}, format="json").status_code in (200, 201)
    assert (
        a_api.post(
            "/api/v1/suppressions", {"channel": "email", "address": "same@example.com"}, format="json"
        ).status_code
        == 201
    )
    # Installation-wide (a bounce): every project's sends check it, no project's key removes it.
    Suppression.objects.create(environment=None, channel="email", address="bounced@example.com", source="bounce")

    def email_of(api: Any) -> dict[str, Any]:
        sent = api.post(
            "/api/v1/notifications",
            {"recipient": {"user_id": "u-1"}, "template": "welcome", "channels": ["email"], "payload": {"name": "x"}},
            format="json",
        )
        assert sent.status_code == 202, sent.content
        return sent.json()["deliveries"][0]

    assert email_of(a_api)["status"] == "suppressed"
    assert email_of(b_api)["status"] == "queued"
    for api in (a_api, b_api):
        assert api.put("/api/v1/recipients/u-1", {"email": "bounced@example.com"}, format="json").status_code == 200
        assert email_of(api)["status"] == "suppressed"
    wide = Suppression.objects.get(address="bounced@example.com")
    assert b_api.delete(f"/api/v1/suppressions/{wide.pk}").status_code == 404


@pytest.mark.django_db
def test_each_environment_sends_its_own_template_and_layout_of_the_same_key_and_version(
    keys: dict[str, tuple[Any, Any]],
) -> None:
    """The send workers, the fan-out's in-app rendering and the admin's re-rendering run outside any scope."""
    purge_all_queues()  # the sends publish to this namespace's queues
    (_, live), (_, test) = keys["a"], keys["a_test"]
    sent: dict[str, Any] = {}
    for api, word in ((test, "staging"), (live, "production")):
        # Test's layout has the higher version number: the newest of any environment would be test's.
        for _ in range(2 if api is test else 1):
            layout = {"html": f"<div>{word} {{{{ content }}}}</div>"}
            assert api.put("/api/v1/layouts/brand", layout, format="json").status_code == 201
        email = {"subject": word, "html": "<p>{{ name }}</p>"}
        content = {"en": {"email": email, "inapp": {"title": word, "body": "Hi"}}}
        body = {"category": "transactional", "content": content, "layout": "brand"}
        assert api.put("/api/v1/templates/welcome", body, format="json").status_code == 201
        assert api.put("/api/v1/recipients/u-1", {"email": "u1@example.com"}, format="json").status_code == 201
        answer = api.post(
            "/api/v1/notifications",
            {"recipient": {"user_id": "u-1"}, "template": "welcome", "channels": ["email"], "payload": {"name": "Ann"}},
            format="json",
        )
        assert answer.status_code == 202, answer.content
        sent[word] = answer.json()
    for word, answer in sent.items():
        [delivery_id] = [d["id"] for d in answer["deliveries"]]
        pipeline.deliver([delivery_id])
        delivery = Delivery.objects.get(pk=delivery_id)
        assert delivery.status == "sent", delivery.last_error
        email = SandboxMessage.objects.get(delivery_id=delivery_id).content
        assert (email["subject"], email["text"]) == (word, f"{word}\n\nAnn")
        Delivery.objects.filter(pk=delivery_id).update(template_version=None)  # re-rendered from the notification
        assert delivery_rendered(delivery=Delivery.objects.get(pk=delivery_id))["parts"]["subject"] == word
        notification = Notification.objects.get(pk=answer["id"])
        inapp = inbox_fanout.contents(notification, ["en"]).by_locale["en"]
        assert inapp is not None and inapp["title"] == word


@pytest.mark.django_db
def test_create_project_and_keys_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("create_project", "shop", "--name", "Shop")
    assert set(Environment.objects.filter(project__slug="shop").values_list("name", flat=True)) == {"test", "live"}
    call_command("create_api_client", "shop-staging", "--project", "shop", "--test")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    from notifier.clients.models import ApiClient

    client = ApiClient.objects.get(name="shop-staging")
    assert key.startswith("ntf_") and client.mode == "test"
    environment = Environment.objects.select_related("project").get(pk=owner_id(client))
    assert environment.project.slug == "shop" and environment.name == "test"
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown project"):
        call_command("create_api_client", "nowhere", "--project", "nope")
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_project", "shop")


@pytest.mark.django_db
def test_a_bounce_suppresses_for_every_project_even_where_one_had_suppressed_it_itself(
    keys: dict[str, tuple[Any, Any]],
) -> None:
    from preferences.services import suppression_add

    (a, a_api), (b, _) = keys["a"], keys["b"]
    made = a_api.post("/api/v1/suppressions", {"channel": "email", "address": "x@example.com"}, format="json")
    assert made.status_code == 201
    # What a callback or a send worker does, outside any scope: the installation-wide list gets it too.
    wide = suppression_add(channel="email", address="x@example.com", source="bounce")
    assert wide.environment_id is None and wide.pk != made.json()["id"]
    assert suppression_add(channel="email", address="x@example.com", source="bounce").pk == wide.pk  # idempotent
    from preferences.compliance import suppressed_addresses

    assert suppressed_addresses([("email", "x@example.com")], environment_id=b.environment_id)
    # A project's own entry, given its environment, stays its own.
    own = suppression_add(channel="email", address="y@example.com", source="manual", environment_id=a.environment_id)
    assert own.environment_id == a.environment_id
    assert not suppressed_addresses([("email", "y@example.com")], environment_id=b.environment_id)


def test_a_lookup_by_user_id_needs_a_scope(keys: dict[str, tuple[Any, Any]]) -> None:
    """Outside any scope a user id names a recipient in every environment: the lookup fails instead of picking one."""
    from notifier.inbox.selectors import inbox_recipient_get
    from preferences.selectors import recipient_get
    from projects.scoping import owner_scope

    (a, a_api), (b, b_api) = keys["a"], keys["b"]
    for api, email in ((a_api, "ann@a.example"), (b_api, "bob@b.example")):
        assert api.put("/api/v1/recipients/u-1", {"email": email}, format="json").status_code == 201
    for lookup in (recipient_get, inbox_recipient_get):
        with pytest.raises(LookupError):
            lookup(user_id="u-1")
        for client, email in ((a, "ann@a.example"), (b, "bob@b.example")):
            with owner_scope(client.environment_id):
                found = lookup(user_id="u-1")
            assert found is not None and found.email == email
