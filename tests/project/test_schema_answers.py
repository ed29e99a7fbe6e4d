"""Every answer of every operation matches the OpenAPI schema that `/api/schema/` serves (docs/api.md, "The schema").

A client generated from the schema (openapi-python-client, openapi-generator) parses an answer by the schema
alone: a property listed as `required` that an answer leaves out, or a null where the schema says no null, fails
the parse. Here real requests go through DRF's test client against the real database, in every shape an answer
can take (a send to a user, to a topic, a duplicate, a workflow, with fallback, from a test key; lists empty and
not; the error answers the schema documents), and each answer is validated against the schema of its operation
and status code: `required` and `nullable` strictly, `$ref`s resolved, no property the schema does not name,
and date-time, date and uuid formats parsed as a generated client parses them.

`CALLS` names, per operationId, how to call it; an operation of the schema missing from it fails the test, so a new
endpoint cannot go unchecked.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.test import Client
from django.utils import timezone
from openapi_schema_validator import OAS30ReadValidator, oas30_format_checker
from rest_framework.test import APIClient
from twilio.request_validator import RequestValidator

from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, Notification
from notifier.inbox.services import inbox_token_create
from notifier.statusevents.models import EventEndpoint
from preferences.services import recipient_upsert, topic_subscribe, topic_upsert
from projects.models import Environment, Project
from projects.scoping import owner_id
from templates_app.services import template_put
from tests import factories
from tests.callbacks.test_callbacks_ses import _stub_server, ses_event, signing, stub  # noqa: F401 - fixtures
from tests.callbacks.test_callbacks_ses import notification as sns_notification
from tests.conftest import bearer_client, purge_all_queues

METHODS = ("get", "put", "post", "patch", "delete")

# Every channel, and one without an SMS part: a preview answers `sms` for the SMS channel only.
CONTENT: dict[str, Any] = {
    "en": {
        "email": {"subject": "Order {{ order_id }}", "text": "Shipped {{ order_id }}", "html": "<p>{{ order_id }}</p>"},
        "sms": {"text": "Order {{ order_id }} shipped"},
        "push": {"title": "Shipped", "body": "Order {{ order_id }}", "data": {"order": "{{ order_id }}"}},
        "inapp": {"title": "Shipped", "body": "Order {{ order_id }}", "url": "https://shop.example.com/o"},
        "webhook": {"body": {"event": "order.shipped", "order": "{{ order_id }}"}},
    }
}
EMAIL_ONLY: dict[str, Any] = {"en": {"email": {"subject": "News", "text": "Read {{ what }}"}}}
CHAT_ONLY: dict[str, Any] = {
    "en": {
        "chat": {
            "text": "Order {{ order_id }}",
            "blocks": [{"type": "section", "text": {"type": "plain_text", "text": "{{ order_id }}"}}],
        }
    }
}
PAYLOAD = {"order_id": "A-1", "what": "this"}
STEPS: list[dict[str, Any]] = [
    {"id": "inapp", "type": "send", "channel": "inapp", "template": "shipped"},
    {"id": "wait", "type": "delay", "seconds": 60},
    {"id": "mail", "type": "send", "channel": "email", "template": "shipped",
     "if": {"step": "inapp", "status_not_in": ["opened"]}},
]  # fmt: skip
TWILIO_TOKEN = "twilio-test-auth-token"
PUBLIC = "https://notifier.example.com"


# --- The schema and the validation of one answer ----------------------------------------------------------------


def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).tzinfo is not None


def _date(value: object) -> bool:
    return not isinstance(value, str) or bool(dt.date.fromisoformat(value))


def _uuid(value: object) -> bool:
    return not isinstance(value, str) or bool(uuid.UUID(value))


def _format_checker() -> Any:
    """OpenAPI 3.0's formats, and those a generated client parses into a type (it fails where they do not parse)."""
    checker = copy.deepcopy(oas30_format_checker)  # its own table of checks: the package's stays as it is
    checker.checks("date-time", raises=ValueError)(_date_time)
    checker.checks("date", raises=ValueError)(_date)
    checker.checks("uuid", raises=ValueError)(_uuid)
    return checker


def _strict(node: Any) -> Any:
    """Return a copy of a schema as a generated client reads it, closed to properties it does not name.

    - An object with named properties allows no other property: drf-spectacular leaves `additionalProperties`
      out for a serializer (any extra property is then valid), but a property the schema does not name is one
      no client knows of.
    - `nullable: true` beside `allOf`/`oneOf`/`anyOf` (drf-spectacular's nullable reference) allows null, as
      openapi-python-client reads it (null or the reference); everywhere else null needs `nullable: true` beside
      the `type`, as OpenAPI 3.0.3 says.
    """
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    strict = {key: _strict(value) for key, value in node.items()}
    if "properties" in node and "additionalProperties" not in node:
        strict["additionalProperties"] = False
    if node.get("nullable") is True and "type" not in node and {"allOf", "oneOf", "anyOf"} & set(node):
        del strict["nullable"]
        strict = {"anyOf": [{"enum": [None]}, strict]}
    return strict


@dataclass
class Schema:
    """The served OpenAPI document: each operation by id, and a validator of answers."""

    document: dict[str, Any]
    operations: dict[str, tuple[str, str, dict[str, Any]]] = field(init=False)

    def __post_init__(self) -> None:
        self.operations = {
            op["operationId"]: (method, path, op)
            for path, item in self.document["paths"].items()
            for method, op in item.items()
            if method in METHODS
        }
        self._components = _strict(self.document["components"])
        self._checker = _format_checker()

    def response(self, operation_id: str, status: int) -> dict[str, Any]:
        """Return what the schema documents for this operation's answer with `status` (fails if it documents none)."""
        _, _, op = self.operations[operation_id]
        documented = op["responses"]
        assert str(status) in documented, f"{operation_id} answered {status}; the schema documents {sorted(documented)}"
        return dict(documented[str(status)])

    def errors(self, operation_id: str, status: int, body: Any) -> list[str]:
        """Return why `body` does not match the schema of this answer (empty when it matches)."""
        content = self.response(operation_id, status).get("content", {}).get("application/json")
        assert content is not None, f"{operation_id} {status}: the schema documents no JSON body"
        # The answer's schema at the root of a document holding the components: its `#/components/...` resolve.
        schema = {**_strict(content["schema"]), "components": self._components}
        validator = OAS30ReadValidator(schema, format_checker=self._checker)
        found = sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
        return [f"{'/'.join(map(str, e.absolute_path)) or '<body>'}: {e.message}" for e in found]


@pytest.fixture(scope="module")
def schema(django_db_blocker: Any) -> Schema:
    """The OpenAPI document as `/api/schema/` serves it."""
    with django_db_blocker.unblock():
        response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return Schema(json.loads(response.content))


@pytest.mark.pure
def test_the_check_refuses_what_a_generated_client_cannot_parse(schema: Schema) -> None:
    """A required field left out (a read-only one too), a null where none is allowed, an unknown field, a bad date."""
    prefs = {"opted_out": False, "channels": {"sms": False}, "categories": {}, "quiet_hours": None}
    assert schema.errors("preferences_get", 200, prefs) == []
    assert schema.errors("preferences_get", 200, {**prefs, "quiet_hours": {"start": "22:00", "end": "07:00"}}) == []
    assert schema.errors("preferences_get", 200, {k: v for k, v in prefs.items() if k != "opted_out"})
    assert schema.errors("preferences_get", 200, {**prefs, "opted_out": None})
    assert schema.errors("preferences_get", 200, {**prefs, "quiet_hours": {"start": "22:00"}})
    assert schema.errors("preferences_get", 200, {**prefs, "unknown": 1})
    link = {"url": "https://notifier.example.com/preferences/t", "expires_at": "2026-12-01T09:00:00Z"}
    assert schema.errors("preference_link_create", 200, link) == []
    assert schema.errors("preference_link_create", 200, {**link, "expires_at": "tomorrow"})
    assert schema.errors("preference_link_create", 200, {**link, "expires_at": "2026-12-01T09:00:00"})  # no offset
    accepted = {"id": str(uuid.uuid4()), "status": "accepted", "duplicate": False, "deliveries": [], "mode": "live"}
    assert schema.errors("notifications_send", 202, accepted) == []
    assert schema.errors("notifications_send", 202, {k: v for k, v in accepted.items() if k != "mode"})  # read-only


# --- Calling operations ---------------------------------------------------------------------------------------


@dataclass
class World:
    """Calls operations by id with real requests and checks every answer against the schema.

    `api` has every scope (the key of `service`); `client()` makes more keys. Each answer is recorded in `seen`
    (operation id -> statuses), so a test can require every documented success status to have been answered.
    """

    schema: Schema
    api: Any
    service: ApiClient
    factory: Callable[..., tuple[Any, Any]]
    fixture: Callable[[str], Any]
    seen: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    checked: int = 0

    def url(self, operation_id: str, **path: Any) -> str:
        """Return the operation's path with its parameters filled in (quoted)."""
        _, template, _ = self.schema.operations[operation_id]
        return template.format(**{k: quote(str(v), safe="") for k, v in path.items()})

    def call(
        self,
        operation_id: str,
        status: int,
        *,
        http: Any = None,
        body: Any = None,
        query: dict[str, Any] | None = None,
        raw: tuple[bytes | str, str] | None = None,
        headers: dict[str, str] | None = None,
        **path: Any,
    ) -> Any:
        """Call an operation, assert its status, validate its body against the schema; return the parsed body."""
        method, _, _ = self.schema.operations[operation_id]
        url = self.url(operation_id, **path)
        if query:
            url += "?" + urlencode(query)
        send = getattr(http or self.api, method)
        if raw is not None:
            response = send(url, data=raw[0], content_type=raw[1], headers=headers or {})
        elif body is not None:
            response = send(url, body, format="json", headers=headers or {})
        else:
            response = send(url, headers=headers or {})
        assert response.status_code == status, f"{operation_id}: {response.status_code} {response.content[:500]!r}"
        self.seen[operation_id].add(status)
        self.checked += 1
        if status == 204:
            assert not response.content
            assert "content" not in self.schema.response(operation_id, 204)
            return None
        assert response["Content-Type"].split(";")[0] == "application/json", response["Content-Type"]
        parsed = json.loads(response.content)
        problems = self.schema.errors(operation_id, status, parsed)
        assert not problems, (
            f"{operation_id} {status}: the answer does not match the schema:\n"
            + "\n".join(problems)
            + f"\nanswer: {json.dumps(parsed, indent=1)[:4000]}"
        )
        return parsed

    def client(self, **kwargs: Any) -> tuple[ApiClient, Any]:
        """Return another API client and a DRF test client authenticated as it (every scope unless told)."""
        return self.factory(**kwargs)

    # Objects the calls need ---------------------------------------------------------------------------------

    def template(self, key: str = "shipped", content: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Create (or add a version to) a staff-owned template, every channel unless told."""
        template_put(key=key, category="transactional", default_locale="en", content=content or CONTENT, **kwargs)

    def recipient(self, user_id: str = "u-1") -> Any:
        """Return the recipient `user_id`, with an email address and a phone number."""
        recipient, _ = recipient_upsert(user_id=user_id, email=f"{user_id}@example.com", phone="+4915112345678")
        return recipient

    def topic(self, key: str = "fans", users: tuple[str, ...] = ("u-1", "u-2")) -> Any:
        """Return the topic `key` with `users` subscribed."""
        topic, _ = topic_upsert(key=key, name="Fans")
        topic_subscribe(topic=topic, user_ids=list(users))
        return topic

    def workflow(self, key: str = "shipped_flow") -> None:
        """Create the workflow `key`: in-app, a delay, then email unless the in-app message was opened."""
        self.template()
        body = {"category": "transactional", "steps": STEPS}
        assert self.api.put(f"/api/v1/workflows/{key}", body, format="json").status_code == 201

    def send(self, status: int = 202, *, http: Any = None, **body: Any) -> dict[str, Any]:
        """Send through the API (checked like any call) and return the answer; a field given as None is left out."""
        fields = {"recipient": {"user_id": "u-1"}, "template": "shipped", "payload": PAYLOAD, **body}
        for name, value in body.items():
            if value is None:
                del fields[name]
        return dict(self.call("notifications_send", status, http=http, body=fields))

    def inapp(self, user_id: str = "u-1", **fields: Any) -> Delivery:
        """Return a delivered in-app delivery of `service` to `user_id`: an inbox item."""
        content = {"title": "Shipped", "body": "Order A-1", "url": "https://shop.example.com/o"}
        return factories.make_delivery(
            channel="inapp", status="delivered", recipient=self.recipient(user_id), client=self.service,
            content=content, **fields,
        )  # fmt: skip


@pytest.fixture
def world(
    schema: Schema,
    api: Any,
    service: ApiClient,
    api_client_factory: Callable[..., tuple[Any, Any]],
    settings: Any,
    request: pytest.FixtureRequest,
) -> Iterator[World]:
    settings.PUBLIC_BASE_URL = PUBLIC
    settings.TWILIO_AUTH_TOKEN = TWILIO_TOKEN
    purge_all_queues()  # the sends publish to this namespace's queues
    yield World(schema=schema, api=api, service=service, factory=api_client_factory, fixture=request.getfixturevalue)
    purge_all_queues()


# --- Notifications ---------------------------------------------------------------------------------------------


def _notifications_send(w: World) -> None:
    w.template()
    w.template("news", EMAIL_ONLY)
    w.recipient("u-1")
    w.topic()
    w.workflow()
    # To a user, with every field; again (a duplicate); again with another body (a conflict).
    first = w.send(channels=["email", "sms"], dedup_key="k-1", priority="high", locale="en")
    assert first["deliveries"] and "topic" not in first
    assert w.send(200, channels=["email", "sms"], dedup_key="k-1", priority="high", locale="en")["duplicate"]
    w.send(409, dedup_key="k-1", payload={"order_id": "B"})
    # Scheduled, in the recipient's own time, with fallback.
    w.send(send_at=(timezone.now() + dt.timedelta(hours=1)).isoformat())
    w.send(template="news", send_at_local="2099-01-01T09:00:00")
    w.send(channels=["push", "email"], strategy="fallback", fallback_until="delivered", fallback_after_seconds=60)
    # To a topic; a workflow to a user and to a topic.
    assert w.send(recipient=None, topic="fans")["topic"] == "fans"
    flow = w.send(template=None, workflow="shipped_flow")
    assert flow["workflow"] == "shipped_flow" and flow["steps"]
    w.send(template=None, workflow="shipped_flow", recipient=None, topic="fans")
    # To a team's chat channels, without a user; an address the network would refuse.
    w.template("ops", CHAT_ONLY)
    ops = w.send(recipient={"chat": {"slack": "#ops", "telegram": "-1001234567890"}}, template="ops")
    assert [d["channel"] for d in ops["deliveries"]] == ["slack", "telegram"]
    assert w.call("notification_get", 200, notification_id=ops["id"])["user_id"] is None
    w.send(400, recipient={"chat": {"slack": "ops"}}, template="ops")
    # From a test key (mode "test").
    test_client, test_http = w.client()
    ApiClient.objects.filter(pk=test_client.pk).update(mode=ApiClient.Mode.TEST)
    assert w.send(http=test_http)["mode"] == "test"
    # Refused: invalid, a category the key may not send, a body past the limit.
    w.send(400, template="no_such_template")
    _, marketing_only = w.client(categories=["marketing"])
    w.send(403, http=marketing_only)
    w.call("notifications_send", 413, raw=(b"{" + b" " * (6 * 1024 * 1024) + b"}", "application/json"))


def _notifications_send_batch(w: World) -> None:
    w.template()
    w.topic()
    w.workflow()
    user = {"recipient": {"user_id": "u-1"}, "template": "shipped", "payload": PAYLOAD, "dedup_key": "b-1"}
    items = [
        user,
        user,  # a duplicate of the first
        {**user, "payload": {"order_id": "B"}},  # the same key with another body
        {"topic": "fans", "template": "shipped", "payload": PAYLOAD},
        {"recipient": {"user_id": "u-2"}, "workflow": "shipped_flow"},
        {"topic": "fans", "workflow": "shipped_flow"},
        {"recipient": {"user_id": "u-3"}, "template": "shipped", "channels": ["email", "push"],
         "strategy": "fallback"},
        {"recipient": {"user_id": "u-4"}, "template": "no_such_template"},
    ]  # fmt: skip
    results = w.call("notifications_send_batch", 200, body={"notifications": items})["results"]
    assert [r["status"] for r in results] == [202, 200, 409, 202, 202, 202, 202, 400]
    w.call("notifications_send_batch", 400, body={"notifications": "not a list"})


def _notifications_list(w: World) -> None:
    assert w.call("notifications_list", 200)["results"] == []
    _sends_of_every_kind(w)
    page = w.call("notifications_list", 200, query={"limit": 2})
    assert page["next_cursor"]
    rest = w.call("notifications_list", 200, query={"cursor": page["next_cursor"], "limit": 200})
    assert rest["next_cursor"] is None and len(rest["results"]) >= 4
    w.call("notifications_list", 200, query={"user_id": "u-1", "status": "accepted", "category": "transactional"})
    w.call("notifications_list", 400, query={"cursor": "not-a-cursor"})
    w.call("notifications_list", 400, query={"status": "nonsense"})


def _sends_of_every_kind(w: World) -> dict[str, str]:
    """Send to a user, a topic, a workflow (user and topic), with fallback and scheduled; return their ids."""
    w.template()
    w.recipient("u-1")
    w.topic()
    w.workflow()
    return {
        "user": w.send(channels=["email", "sms", "inapp"])["id"],
        "topic": w.send(recipient=None, topic="fans")["id"],
        "flow": w.send(template=None, workflow="shipped_flow")["id"],
        "flow_topic": w.send(template=None, workflow="shipped_flow", recipient=None, topic="fans")["id"],
        "fallback": w.send(channels=["push", "email"], strategy="fallback", fallback_after_seconds=30)["id"],
        "later": w.send(send_at_local="2099-01-01T09:00:00")["id"],
    }


def _notification_get(w: World) -> None:
    ids = _sends_of_every_kind(w)
    # A delivery with its history; the SMS one with its encoding.
    for delivery in Delivery.objects.filter(notification_id=ids["user"]):
        factories.make_delivery_event(delivery=delivery, status="sent", detail="sandbox")
    Delivery.objects.filter(notification_id=ids["user"], channel="sms").update(sms_encoding="gsm7", sms_segments=1)
    for name, notification_id in ids.items():
        answer = w.call("notification_get", 200, notification_id=notification_id)
        assert ("workflow" in answer) == name.startswith("flow"), (name, answer)
    # A topic notification fanned out, with its total.
    Notification.objects.filter(pk=ids["topic"]).update(recipients_total=2, fanout_processed=2, status="done")
    assert w.call("notification_get", 200, notification_id=ids["topic"])["recipients_total"] == 2
    w.call("notification_get", 404, notification_id=uuid.uuid4())


def _notification_cancel(w: World) -> None:
    ids = _sends_of_every_kind(w)
    w.call("notification_cancel", 200, notification_id=ids["later"])
    w.call("notification_cancel", 200, notification_id=ids["flow"])
    w.call("notification_cancel", 404, notification_id=uuid.uuid4())


def _stats_get(w: World) -> None:
    assert w.call("stats_get", 200)["results"] == []
    _sends_of_every_kind(w)
    assert w.call("stats_get", 200)["results"]
    w.call("stats_get", 200, query={"group_by": "channel", "mode": "live"})
    w.call("stats_get", 200, query={"group_by": "day,template", "mode": "test"})
    w.call("stats_get", 400, query={"group_by": "planet"})


def _project_get(w: World) -> None:
    answer = w.call("project_get", 200)
    assert (answer["slug"], answer["environment"], answer["quotas"]) == ("default", "live", {})
    environment = Environment.objects.get(pk=owner_id(w.service))
    environment.quotas = {"email": 1, "sms": 10}
    environment.save()
    w.template()
    w.send(channels=["email", "sms"])
    refused = w.send(429, channels=["email"])  # the send's documented 429, over the quota
    assert refused["error"]["code"] == "quota_exceeded"
    quotas = w.call("project_get", 200)["quotas"]
    assert {channel: quota["used"] for channel, quota in quotas.items()} == {"email": 1, "sms": 1}
    _, test = w.client(mode="test", scopes=["send"])
    assert w.call("project_get", 200, http=test)["environment"] == "test"
    _, templates_only = w.client(scopes=["templates"])
    w.call("project_get", 403, http=templates_only)


# --- Templates, layouts, workflows ---------------------------------------------------------------------------


def _templates_list(w: World) -> None:
    assert w.call("templates_list", 200)["results"] == []
    w.template()
    w.template("draft_only", EMAIL_ONLY, publish=False)
    page = w.call("templates_list", 200, query={"limit": 1})
    assert page["next_cursor"]
    w.call("templates_list", 200, query={"cursor": page["next_cursor"]})


def _template_get(w: World) -> None:
    w.call("template_put", 201, key="mine", body={"category": "transactional", "content": CONTENT})
    w.template()  # made by staff
    w.template("draft_only", EMAIL_ONLY, publish=False)
    for key in ("mine", "shipped", "draft_only"):
        w.call("template_get", 200, key=key)
    w.call("template_get", 404, key="nope")


def _template_put(w: World) -> None:
    body = {"category": "transactional", "default_locale": "en", "content": CONTENT}
    w.call("template_put", 201, key="shipped", body=body)
    w.call("template_put", 201, key="shipped", body={**body, "publish": False, "layout": None})
    w.call("template_put", 400, key="shipped", body={**body, "category": "nonsense"})
    _, marketing_only = w.client(scopes=["templates"], categories=["marketing"])
    w.call("template_put", 403, http=marketing_only, key="shipped", body=body)  # a category the key may not use
    _promotion_required()
    w.call("template_put", 409, key="shipped", body=body)


def _promotion_required() -> None:
    """Make the project of the world's key (`default`, live) change its live environment only by promotion."""
    Project.objects.filter(slug="default").update(promotion=Project.Promotion.REQUIRED)


def _template_rollback(w: World) -> None:
    w.template()
    w.template("shipped", EMAIL_ONLY)
    w.call("template_rollback", 201, key="shipped", body={"version": 1})
    w.call("template_rollback", 400, key="shipped", body={"version": 3})  # the published one already
    w.call("template_rollback", 404, key="shipped", body={"version": 9})


def _template_preview(w: World) -> None:
    w.template()
    w.template("news", EMAIL_ONLY)
    with_sms = w.call("template_preview", 200, key="shipped", body={"payload": PAYLOAD})
    assert "sms" in with_sms["channels"]["sms"] and "sms" not in with_sms["channels"]["email"]
    without_sms = w.call("template_preview", 200, key="news", body={"payload": PAYLOAD, "locale": "de"})
    assert "sms" not in without_sms["channels"]
    w.template("shipped", EMAIL_ONLY, publish=False)
    w.call("template_preview", 200, key="shipped", body={"payload": PAYLOAD, "version": 2})
    w.call("template_preview", 400, key="news", body={"payload": "not an object"})
    w.call("template_preview", 404, key="shipped", body={"version": 9})


def _template_version_get(w: World) -> None:
    w.template()
    w.template("shipped", EMAIL_ONLY, publish=False)
    w.call("template_version_get", 200, key="shipped", version=1)
    w.call("template_version_get", 200, key="shipped", version=2)
    w.call("template_version_get", 404, key="shipped", version=3)


def _layout_put(w: World) -> None:
    w.call("layout_put", 201, key="brand", body={"html": "<div>{{ content }}</div>"})
    w.call("layout_put", 201, key="brand", body={"html": "<div>{{ content }}</div>", "text": "{{ content }}"})
    w.call("layout_put", 400, key="brand", body={"html": "{% if %}"})
    _promotion_required()
    w.call("layout_put", 409, key="brand", body={"html": "<div>{{ content }}</div>"})


def _layout_rollback(w: World) -> None:
    w.call("layout_put", 201, key="brand", body={"html": "<div>{{ content }}</div>"})
    w.call("layout_put", 201, key="brand", body={"html": "<p>{{ content }}</p>"})
    w.call("layout_rollback", 201, key="brand", body={"version": 1})
    w.call("layout_rollback", 400, key="brand", body={"version": 3})  # the one in use already
    w.call("layout_rollback", 404, key="brand", body={"version": 9})


def _layout_get(w: World) -> None:
    w.call("layout_put", 201, key="brand", body={"html": "<div>{{ content }}</div>"})
    w.call("layout_get", 200, key="brand")
    w.call("layout_get", 404, key="nope")


def _workflows_list(w: World) -> None:
    assert w.call("workflows_list", 200)["results"] == []
    w.workflow("a")
    w.workflow("b")
    page = w.call("workflows_list", 200, query={"limit": 1})
    w.call("workflows_list", 200, query={"cursor": page["next_cursor"]})


def _workflow_put(w: World) -> None:
    w.template()
    w.call("workflow_put", 201, key="flow", body={"category": "transactional", "steps": STEPS})
    w.call("workflow_put", 400, key="flow", body={"category": "transactional", "steps": [{"id": "a", "type": "x"}]})
    _promotion_required()
    w.call("workflow_put", 409, key="flow", body={"category": "transactional", "steps": STEPS})


def _workflow_rollback(w: World) -> None:
    w.workflow("flow")
    w.call("workflow_put", 201, key="flow", body={"category": "transactional", "steps": STEPS[:1]})
    w.call("workflow_rollback", 201, key="flow", body={"version": 1})
    w.call("workflow_rollback", 400, key="flow", body={"version": 3})  # the latest already
    w.call("workflow_rollback", 404, key="flow", body={"version": 9})


def _promotion_list(w: World) -> None:
    assert w.call("promotion_list", 200)["results"] == []
    _, test = w.client(mode="test")
    w.call("template_put", 201, http=test, key="shipped", body={"category": "transactional", "content": CONTENT})
    w.call("layout_put", 201, http=test, key="brand", body={"html": "<div>{{ content }}</div>"})
    w.call("promotion_apply", 200, http=test, body={"items": [{"kind": "layout", "key": "brand"}]})
    w.call("layout_put", 201, http=test, key="brand", body={"html": "<p>{{ content }}</p>"})
    listed = w.call("promotion_list", 200)["results"]
    assert [(c["kind"], c["live_version"]) for c in listed] == [("layout", 1), ("template", None)]


def _promotion_apply(w: World) -> None:
    _, test = w.client(mode="test")
    w.call("template_put", 201, http=test, key="shipped", body={"category": "transactional", "content": CONTENT})
    items = [{"kind": "template", "key": "shipped"}, {"kind": "layout", "key": "nope"}, {"kind": "widget"}]
    results = w.call("promotion_apply", 200, body={"items": items})["results"]
    assert [r["status"] for r in results] == [200, 404, 400]
    w.call("promotion_apply", 400, body={"items": []})


def _workflow_get(w: World) -> None:
    w.workflow("flow")
    w.call("workflow_get", 200, key="flow")
    w.call("workflow_get", 404, key="nope")


# --- Recipients, devices, preferences ---------------------------------------------------------------------------


def _recipients_list(w: World) -> None:
    assert w.call("recipients_list", 200)["results"] == []
    w.recipient("u-1")
    w.recipient("u-2")
    page = w.call("recipients_list", 200, query={"limit": 1})
    w.call("recipients_list", 200, query={"cursor": page["next_cursor"]})
    w.call("recipients_list", 200, query={"email": "u-1@example.com"})
    w.call("recipients_list", 400, query={"phone": "not a phone"})


def _recipient_get(w: World) -> None:
    w.recipient("u-1")
    recipient_upsert(user_id="bare")
    w.call("recipient_device_add", 201, user_id="u-1", body={"token": "tok-1"})
    prefs = {"channels": {"sms": False}, "categories": {"marketing": {"enabled": False}},
             "quiet_hours": {"start": "22:00", "end": "07:00"}}  # fmt: skip
    w.call("preferences_put", 200, user_id="u-1", body=prefs)
    w.call("recipient_get", 200, user_id="u-1")
    w.call("recipient_get", 200, user_id="bare")
    w.call("recipient_get", 404, user_id="nobody")


def _recipient_put(w: World) -> None:
    body = {"email": "a@example.com", "phone": "+4915112345678", "locale": "de", "timezone": "Europe/Berlin",
            "webhook_url": "https://hooks.example.com/a", "tracking_opt_out": True,
            "chat": {"slack": "U024BE7LH", "whatsapp": "+4915112345678", "teams": "https://example.com/h"}}  # fmt: skip
    assert w.call("recipient_put", 201, user_id="u r+1@x", body=body)["chat"]["slack"] == "U024BE7LH"
    w.call("recipient_put", 400, user_id="u r+1@x", body={"chat": {"telegram": "not a chat"}})
    w.call("recipient_put", 200, user_id="u r+1@x", body={"email": None, "phone": ""})
    w.call("recipient_put", 400, user_id="u r+1@x", body={"timezone": "Mars/Olympus"})


def _recipients_batch(w: World) -> None:
    w.topic()
    items = [
        {"user_id": "u-b1", "email": "b1@example.com", "phone": "+4915112345678", "locale": "de",
         "timezone": "Europe/Berlin", "topics": ["fans"]},
        {"user_id": "u-b1", "tracking_opt_out": True},
        {"user_id": "u-b2", "email": "not an email", "topics": ["no-such-topic"]},
        {"user_id": "u-b3", "topics": ["no-such-topic"]},
        [],
    ]  # fmt: skip
    results = w.call("recipients_batch", 200, body={"recipients": items})["results"]
    assert [r["status"] for r in results] == [201, 200, 400, 400, 400]
    w.call("recipients_batch", 400, body={"recipients": []})
    w.call("recipients_batch", 400, body={"recipients": [{}] * 1001})


def _recipient_erase(w: World) -> None:
    w.recipient("u-1")
    w.call("recipient_erase", 204, user_id="u-1")
    w.call("recipient_erase", 404, user_id="nobody")


def _recipient_device_add(w: World) -> None:
    w.recipient("u-1")
    w.call("recipient_device_add", 201, user_id="u-1", body={"token": "tok-1", "platform": "fcm"})
    w.call("recipient_device_add", 400, user_id="u-1", body={"token": "tok-1", "platform": "carrier-pigeon"})


def _recipient_device_remove(w: World) -> None:
    w.recipient("u-1")
    w.call("recipient_device_add", 201, user_id="u-1", body={"token": "tok-1"})
    w.call("recipient_device_remove", 204, user_id="u-1", token="tok-1")
    w.call("recipient_device_remove", 404, user_id="u-1", token="tok-1")


def _preferences_get(w: World) -> None:
    w.recipient("u-1")
    w.call("preferences_get", 200, user_id="u-1")  # the defaults: no quiet hours
    w.call("preferences_put", 200, user_id="u-1", body={"quiet_hours": {"start": "22:00", "end": "07:00"}})
    w.call("preferences_get", 200, user_id="u-1")


def _preferences_put(w: World) -> None:
    w.recipient("u-1")
    body = {"opted_out": False, "channels": {"sms": False},
            "categories": {"marketing": {"enabled": True, "channels": ["email"], "frequency": "daily_digest"}},
            "quiet_hours": {"start": "22:00", "end": "07:00"}}  # fmt: skip
    w.call("preferences_put", 200, user_id="u-1", body=body)
    w.call("preferences_put", 200, user_id="u-1", body={"quiet_hours": None})
    w.call("preferences_put", 400, user_id="u-1", body={"channels": {"fax": True}})


def _preference_link_create(w: World) -> None:
    w.recipient("u-1")
    w.call("preference_link_create", 200, user_id="u-1", body={})
    w.call("preference_link_create", 200, user_id="u-1", body={"ttl_seconds": 600})
    w.call("preference_link_create", 400, user_id="u-1", body={"ttl_seconds": 1})


# --- Inboxes --------------------------------------------------------------------------------------------------


def _inbox_list(w: World) -> None:
    w.recipient("u-1")
    assert w.call("inbox_list", 200, user_id="u-1")["results"] == []
    first, second = w.inapp(), w.inapp()
    w.inapp(read_at=timezone.now(), archived_at=timezone.now())
    factories.make_delivery_event(delivery=first, status="delivered")
    page = w.call("inbox_list", 200, user_id="u-1", query={"limit": 1})
    assert page["next_cursor"] and page["items"] == page["results"]
    w.call("inbox_list", 200, user_id="u-1", query={"cursor": page["next_cursor"], "unread": "true"})
    w.call("inbox_list", 200, user_id="u-1", query={"archived": "true"})
    w.call("inbox_item_read", 200, user_id="u-1", delivery_id=second.pk)
    w.call("inbox_list", 400, user_id="u-1", query={"limit": 0})
    w.call("inbox_list", 404, user_id="nobody")


def _inbox_item(operation_id: str) -> Callable[[World], None]:
    """Return the calls of one of an inbox item's actions (read, archive, unarchive, click)."""

    def calls(w: World) -> None:
        item = w.inapp(archived_at=timezone.now() if operation_id.endswith("unarchive") else None)
        w.call(operation_id, 200, user_id="u-1", delivery_id=item.pk)
        w.call(operation_id, 200, user_id="u-1", delivery_id=item.pk)  # again: the same answer
        w.call(operation_id, 404, user_id="u-1", delivery_id=item.pk + 1000)

    return calls


def _inbox_read_all(w: World) -> None:
    w.recipient("u-1")
    w.call("inbox_read_all", 200, user_id="u-1")
    w.inapp()
    w.call("inbox_read_all", 200, user_id="u-1")


def _inbox_token_create(w: World) -> None:
    w.call("inbox_token_create", 200, user_id="never-seen", body={})
    w.call("inbox_token_create", 200, user_id="never-seen", body={"ttl_seconds": 600})
    w.call("inbox_token_create", 400, user_id="never-seen", body={"ttl_seconds": 1})


def _browser(w: World, user_id: str = "u-1") -> Any:
    """Return a DRF test client carrying an inbox token of `user_id`."""
    token, _ = inbox_token_create(recipient=w.recipient(user_id), ttl_seconds=600)
    return bearer_client(token)


def _browser_inbox_me(w: World) -> None:
    w.call("browser_inbox_me", 200, http=_browser(w))
    recipient_upsert(user_id="u-1", locale="de")
    w.call("browser_inbox_me", 200, http=_browser(w))


def _browser_inbox_list(w: World) -> None:
    browser = _browser(w)
    assert w.call("browser_inbox_list", 200, http=browser)["items"] == []
    w.inapp()
    w.inapp(read_at=timezone.now())
    page = w.call("browser_inbox_list", 200, http=browser, query={"limit": 1})
    w.call("browser_inbox_list", 200, http=browser, query={"cursor": page["next_cursor"], "unread": "false"})
    w.call("browser_inbox_list", 400, http=browser, query={"cursor": "###"})


def _browser_inbox_item(operation_id: str) -> Callable[[World], None]:
    """Return the calls of one of an inbox item's actions in the browser (read, archive, unarchive, click)."""

    def calls(w: World) -> None:
        browser = _browser(w)
        item = w.inapp(archived_at=timezone.now() if operation_id.endswith("unarchive") else None)
        w.call(operation_id, 200, http=browser, delivery_id=item.pk)
        w.call(operation_id, 404, http=browser, delivery_id=item.pk + 1000)

    return calls


def _browser_inbox_read_all(w: World) -> None:
    browser = _browser(w)
    w.inapp()
    w.call("browser_inbox_read_all", 200, http=browser)


# --- Topics, suppressions ------------------------------------------------------------------------------------


def _topics_list(w: World) -> None:
    assert w.call("topics_list", 200)["results"] == []
    w.topic("a")
    w.topic("b")
    page = w.call("topics_list", 200, query={"limit": 1})
    w.call("topics_list", 200, query={"cursor": page["next_cursor"]})


def _topic_get(w: World) -> None:
    w.topic()
    topic_upsert(key="empty", name="")
    w.call("topic_get", 200, key="fans")
    w.call("topic_get", 200, key="empty")
    w.call("topic_get", 404, key="nope")


def _topic_put(w: World) -> None:
    w.call("topic_put", 201, key="fans", body={"name": "Fans"})
    w.call("topic_put", 200, key="fans", body={})
    w.call("topic_put", 400, key="fans", body={"name": None})


def _topic_subscribe(w: World) -> None:
    w.topic()
    assert w.call("topic_subscribe", 200, key="fans", body={"user_ids": ["u-3", "u-4"]})["added"] == 2
    w.call("topic_subscribe", 400, key="fans", body={"user_ids": []})


def _topic_unsubscribe(w: World) -> None:
    w.topic()
    w.call("topic_unsubscribe", 204, key="fans", user_id="u-1")
    w.call("topic_unsubscribe", 204, key="fans", user_id="never-subscribed")


def _suppressions_list(w: World) -> None:
    assert w.call("suppressions_list", 200)["results"] == []
    factories.make_suppression(address="a@example.com")
    factories.make_suppression(channel="sms", address="+4915112345678", reason="STOP", source="provider")
    page = w.call("suppressions_list", 200, query={"limit": 1})
    w.call("suppressions_list", 200, query={"cursor": page["next_cursor"], "channel": "sms"})
    w.call("suppressions_list", 400, query={"channel": "fax"})


def _suppression_add(w: World) -> None:
    w.call("suppression_add", 201, body={"channel": "email", "address": "a@example.com", "reason": "asked"})
    w.call("suppression_add", 200, body={"channel": "email", "address": "a@example.com"})
    w.call("suppression_add", 400, body={"channel": "fax", "address": "x"})


def _suppression_remove(w: World) -> None:
    added = w.call("suppression_add", 201, body={"channel": "email", "address": "a@example.com"})
    w.call("suppression_remove", 204, suppression_id=added["id"])
    w.call("suppression_remove", 404, suppression_id=added["id"])


# --- Campaigns ------------------------------------------------------------------------------------------------


def _campaign(w: World, **extra: Any) -> dict[str, Any]:
    w.template()
    w.topic()
    body = {"name": "Spring", "template": "shipped", "topic": "fans", "payload": PAYLOAD, **extra}
    return dict(w.call("campaign_create", 201, body=body))


def _campaigns_list(w: World) -> None:
    assert w.call("campaigns_list", 200)["results"] == []
    _campaign(w, draft=True)
    _campaign(w, send_at_local="2099-01-01T09:00:00", timezone="Europe/Berlin")
    w.call("campaigns_list", 200)


def _campaign_create(w: World) -> None:
    _campaign(w, draft=True)
    _campaign(w, send_at=(timezone.now() + dt.timedelta(hours=2)).isoformat(), channels=["email"])
    _campaign(w, crontab="0 9 * * 1", timezone="Europe/Berlin", rate_per_second=50)
    _campaign(w, send_at_local="2099-01-01T09:00:00")
    w.call("campaign_create", 400, body={"name": "No template", "topic": "fans"})


def _campaign_get(w: World) -> None:
    created = _campaign(w, send_at=(timezone.now() + dt.timedelta(hours=2)).isoformat())
    w.call("campaign_get", 200, campaign_id=created["id"])
    # With runs: the topic notifications it made, one fanned out and one not yet counted.
    campaign_id = created["id"]
    topic = w.topic()
    factories.make_notification(client=w.service, topic=topic, campaign_id=campaign_id, recipients_total=2,
                                fanout_processed=2, status="done")  # fmt: skip
    factories.make_notification(client=w.service, topic=topic, campaign_id=campaign_id, status="fanning_out")
    assert len(w.call("campaign_get", 200, campaign_id=campaign_id)["runs"]) == 2
    w.call("campaign_get", 404, campaign_id=999_999)


def _campaign_update(w: World) -> None:
    draft = _campaign(w, draft=True)
    w.call("campaign_update", 200, campaign_id=draft["id"], body={"name": "Summer", "rate_per_second": 10})
    w.call("campaign_update", 400, campaign_id=draft["id"], body={"rate_per_second": 0})
    cancelled = _campaign(w, draft=True)
    w.call("campaign_action", 200, campaign_id=cancelled["id"], action="cancel")
    w.call("campaign_update", 409, campaign_id=cancelled["id"], body={"name": "Too late"})


def _campaign_action(w: World) -> None:
    campaign = _campaign(w, send_at=(timezone.now() + dt.timedelta(hours=2)).isoformat())
    w.call("campaign_action", 200, campaign_id=campaign["id"], action="pause")
    w.call("campaign_action", 200, campaign_id=campaign["id"], action="resume")
    w.call("campaign_action", 409, campaign_id=campaign["id"], action="resume")
    w.call("campaign_action", 200, campaign_id=campaign["id"], action="cancel")
    w.call("campaign_action", 404, campaign_id=campaign["id"], action="explode")


# --- Dead letters, sandbox, status events ---------------------------------------------------------------------


def _dead_letter(w: World, **fields: Any) -> Any:
    delivery = factories.make_delivery(client=w.service, status="failed", last_error="timeout")
    return factories.make_dead_letter(delivery=delivery, attempts=5, last_error="timeout", **fields)


def _dead_letters_list(w: World) -> None:
    assert w.call("dead_letters_list", 200)["results"] == []
    _dead_letter(w)
    _dead_letter(w, status="discarded", resolved_by="ops", resolved_at=timezone.now())
    page = w.call("dead_letters_list", 200, query={"limit": 1})
    w.call("dead_letters_list", 200, query={"cursor": page["next_cursor"], "status": "discarded"})
    w.call("dead_letters_list", 400, query={"channel": "fax"})


def _dead_letter_replay(w: World) -> None:
    dead = _dead_letter(w)
    w.call("dead_letter_replay", 200, dead_letter_id=dead.pk)
    w.call("dead_letter_replay", 409, dead_letter_id=dead.pk)
    w.call("dead_letter_replay", 404, dead_letter_id=dead.pk + 1000)


def _dead_letter_discard(w: World) -> None:
    dead = _dead_letter(w)
    w.call("dead_letter_discard", 200, dead_letter_id=dead.pk)
    w.call("dead_letter_discard", 409, dead_letter_id=dead.pk)


def _dead_letters_replay(w: World) -> None:
    first, _ = _dead_letter(w), _dead_letter(w)
    assert w.call("dead_letters_replay", 200, body={"ids": [first.pk]})["replayed"] == 1
    w.call("dead_letters_replay", 200, body={"all": True, "channel": "email"})
    w.call("dead_letters_replay", 400, body={})


def _sandbox_messages_list(w: World) -> None:
    assert w.call("sandbox_messages_list", 200)["results"] == []
    for n in range(3):
        factories.make_sandbox_message(
            delivery_id=n + 1, client_id=w.service.pk, channel="email", address="a@example.com",
            content={"subject": "Hi", "text": "Hello"},
        )  # fmt: skip
    page = w.call("sandbox_messages_list", 200, query={"limit": 2})
    w.call("sandbox_messages_list", 200, query={"cursor": page["next_cursor"], "channel": "email"})
    w.call("sandbox_messages_list", 400, query={"delivery_id": "x"})


ENDPOINT = {"url": "https://events.example.com/hook"}


def _event_endpoint_put(w: World) -> None:
    assert "secret" in w.call("event_endpoint_put", 200, body=ENDPOINT)
    w.call("event_endpoint_put", 200, body={**ENDPOINT, "events": ["delivery.sent"], "max_batch": 10})
    w.call("event_endpoint_put", 400, body={"url": "ftp://events.example.com"})


def _event_endpoint_get(w: World) -> None:
    w.call("event_endpoint_get", 404)
    w.call("event_endpoint_put", 200, body=ENDPOINT)
    assert "secret" not in w.call("event_endpoint_get", 200)


def _event_endpoint_delete(w: World) -> None:
    w.call("event_endpoint_put", 200, body=ENDPOINT)
    w.call("event_endpoint_delete", 204)
    w.call("event_endpoint_delete", 404)


def _event_endpoint_rotate_secret(w: World) -> None:
    w.call("event_endpoint_rotate_secret", 404)
    w.call("event_endpoint_put", 200, body=ENDPOINT)
    w.call("event_endpoint_rotate_secret", 200)


def _event_endpoint_attempts(w: World) -> None:
    w.call("event_endpoint_attempts", 404)
    w.call("event_endpoint_put", 200, body=ENDPOINT)
    assert w.call("event_endpoint_attempts", 200)["results"] == []
    endpoint = EventEndpoint.objects.get(client=w.service)
    now = timezone.now()
    factories.make_event_attempt(endpoint=endpoint, first_event_id=1, last_event_id=1, events=1, ok=True,
                                 status_code=204, at=now, duration_ms=12)  # fmt: skip
    factories.make_event_attempt(endpoint=endpoint, first_event_id=2, last_event_id=3, events=2, ok=False,
                                 status_code=None, error="connection refused", at=now)  # fmt: skip
    page = w.call("event_endpoint_attempts", 200, query={"limit": 1})
    w.call("event_endpoint_attempts", 200, query={"cursor": page["next_cursor"]})


# --- Provider callbacks ----------------------------------------------------------------------------------------


def _callback_ses(w: World) -> None:
    sns, key = w.fixture("stub"), w.fixture("signing")[0]  # the SNS stand-in and its signing key
    raw = APIClient()
    delivery = factories.make_delivery(provider="ses", provider_message_id="0100-abc", address="r@example.com")
    signed = sns_notification(ses_event("Delivery", delivery.provider_message_id), sns, key)
    w.call("callback_ses", 200, http=raw, raw=(json.dumps(signed), "text/plain; charset=UTF-8"))
    w.call("callback_ses", 400, http=raw, raw=("not json", "text/plain"))
    forged = {**signed, "MessageId": str(uuid.uuid4()), "Signature": "AAAA"}
    w.call("callback_ses", 403, http=raw, raw=(json.dumps(forged), "text/plain"))


def _callback_twilio(w: World) -> None:
    raw = APIClient()
    delivery = factories.make_delivery(
        channel="sms", provider="twilio", provider_message_id="SM1", address="+15005550006"
    )
    params = {"MessageSid": delivery.provider_message_id, "MessageStatus": "delivered", "To": delivery.address}
    signature = RequestValidator(TWILIO_TOKEN).compute_signature(f"{PUBLIC}/callbacks/twilio", params)
    form = (urlencode(params), "application/x-www-form-urlencoded")
    w.call("callback_twilio", 200, http=raw, raw=form, headers={"X-Twilio-Signature": signature})
    w.call("callback_twilio", 403, http=raw, raw=form)
    w.call("callback_twilio", 400, http=raw, raw=("{}", "application/json"), headers={"X-Twilio-Signature": signature})


# --- The table: how to call every operation of the schema ------------------------------------------------------

CALLS: dict[str, Callable[[World], None]] = {
    "notifications_send": _notifications_send,
    "notifications_send_batch": _notifications_send_batch,
    "notifications_list": _notifications_list,
    "notification_get": _notification_get,
    "notification_cancel": _notification_cancel,
    "stats_get": _stats_get,
    "project_get": _project_get,
    "templates_list": _templates_list,
    "template_get": _template_get,
    "template_put": _template_put,
    "template_preview": _template_preview,
    "template_version_get": _template_version_get,
    "template_rollback": _template_rollback,
    "layout_put": _layout_put,
    "layout_get": _layout_get,
    "layout_rollback": _layout_rollback,
    "workflows_list": _workflows_list,
    "workflow_put": _workflow_put,
    "workflow_get": _workflow_get,
    "workflow_rollback": _workflow_rollback,
    "promotion_list": _promotion_list,
    "promotion_apply": _promotion_apply,
    "recipients_list": _recipients_list,
    "recipient_get": _recipient_get,
    "recipient_put": _recipient_put,
    "recipient_erase": _recipient_erase,
    "recipients_batch": _recipients_batch,
    "recipient_device_add": _recipient_device_add,
    "recipient_device_remove": _recipient_device_remove,
    "preferences_get": _preferences_get,
    "preferences_put": _preferences_put,
    "preference_link_create": _preference_link_create,
    "inbox_list": _inbox_list,
    "inbox_item_read": _inbox_item("inbox_item_read"),
    "inbox_item_archive": _inbox_item("inbox_item_archive"),
    "inbox_item_unarchive": _inbox_item("inbox_item_unarchive"),
    "inbox_item_click": _inbox_item("inbox_item_click"),
    "inbox_read_all": _inbox_read_all,
    "inbox_token_create": _inbox_token_create,
    "browser_inbox_me": _browser_inbox_me,
    "browser_inbox_list": _browser_inbox_list,
    "browser_inbox_item_read": _browser_inbox_item("browser_inbox_item_read"),
    "browser_inbox_item_archive": _browser_inbox_item("browser_inbox_item_archive"),
    "browser_inbox_item_unarchive": _browser_inbox_item("browser_inbox_item_unarchive"),
    "browser_inbox_item_click": _browser_inbox_item("browser_inbox_item_click"),
    "browser_inbox_read_all": _browser_inbox_read_all,
    "topics_list": _topics_list,
    "topic_get": _topic_get,
    "topic_put": _topic_put,
    "topic_subscribe": _topic_subscribe,
    "topic_unsubscribe": _topic_unsubscribe,
    "suppressions_list": _suppressions_list,
    "suppression_add": _suppression_add,
    "suppression_remove": _suppression_remove,
    "campaigns_list": _campaigns_list,
    "campaign_create": _campaign_create,
    "campaign_get": _campaign_get,
    "campaign_update": _campaign_update,
    "campaign_action": _campaign_action,
    "dead_letters_list": _dead_letters_list,
    "dead_letter_replay": _dead_letter_replay,
    "dead_letter_discard": _dead_letter_discard,
    "dead_letters_replay": _dead_letters_replay,
    "sandbox_messages_list": _sandbox_messages_list,
    "event_endpoint_put": _event_endpoint_put,
    "event_endpoint_get": _event_endpoint_get,
    "event_endpoint_delete": _event_endpoint_delete,
    "event_endpoint_rotate_secret": _event_endpoint_rotate_secret,
    "event_endpoint_attempts": _event_endpoint_attempts,
    "callback_ses": _callback_ses,
    "callback_twilio": _callback_twilio,
}


@pytest.mark.pure
def test_every_operation_of_the_schema_is_called(schema: Schema) -> None:
    assert len(schema.operations) > 40  # the schema was generated, not an empty document
    missing = sorted(set(schema.operations) - set(CALLS))
    assert not missing, f"operations no test calls (add them to CALLS in {__name__}): {missing}"
    assert sorted(set(CALLS) - set(schema.operations)) == []


@pytest.mark.django_db
@pytest.mark.parametrize("operation_id", sorted(CALLS))
def test_the_answers_of_an_operation_match_the_schema(world: World, operation_id: str) -> None:
    CALLS[operation_id](world)
    # Every success status the schema documents was answered (a 200 duplicate beside a 202, a 201 beside a 200).
    documented = {int(code) for code in world.schema.operations[operation_id][2]["responses"] if code.startswith("2")}
    never = documented - world.seen[operation_id]
    assert not never, f"{operation_id}: the schema documents {sorted(never)}, no call answered it"


# --- The error answers every operation can give ------------------------------------------------------------------

# A value for each path parameter that names nothing (the operation answers 404).
MISSING: dict[str, Any] = {"notification_id": uuid.uuid4(), "campaign_id": 999_999, "dead_letter_id": 999_999,
           "suppression_id": 999_999, "delivery_id": 999_999, "version": 99, "action": "pause",
           "key": "no-such-key", "user_id": "no-such-user", "token": "no-such-token"}  # fmt: skip
# Operations that create what their path names (a PUT, an inbox token for a user never seen): no 404 there.
CREATES = {"template_put", "layout_put", "workflow_put", "recipient_put", "topic_put", "inbox_token_create"}


def _path_parameters(template: str) -> list[str]:
    return [part.split("}")[0] for part in template.split("{")[1:]]


@pytest.mark.django_db
def test_error_answers_match_the_schema(world: World) -> None:
    """Without a key, without the scope, over the rate limit, with an unacceptable Accept, naming nothing."""
    bad_key = bearer_client("ntf_nope")
    _, no_scope = world.client(scopes=[])
    limited_client, limited = world.client()
    ApiClient.objects.filter(pk=limited_client.pk).update(rate_limit="1/h")
    limited.get("/api/v1/notifications")  # the one request of the hour
    recipient_upsert(user_id="u-1")
    browser = _browser(world)
    for operation_id, (method, template, op) in sorted(world.schema.operations.items()):
        names = _path_parameters(template)
        path: dict[str, Any] = {name: MISSING[name] for name in names}
        body: dict[str, Any] | None = {} if method in ("post", "put", "patch") else None
        if template.startswith("/callbacks/"):
            continue  # no key: a signature (their calls above answer 400 and 403)
        world.call(operation_id, 401, http=bad_key, body=body, **path)
        if template.startswith("/api/v1/"):
            world.call(operation_id, 403, http=no_scope, body=body, **path)
            world.call(operation_id, 429, http=limited, body=body, **path)
        http = browser if template.startswith("/inbox/") else world.api
        world.call(operation_id, 406, http=http, body=body, headers={"Accept": "text/html"}, **path)
        if names and operation_id not in CREATES:
            world.call(operation_id, 404, http=http, body=body, **path)
        if "requestBody" in op and not names:  # with an object in the path, the 404 may come first
            world.call(operation_id, 415, http=http, raw=("x", "text/plain"), **path)
    assert world.checked > 4 * len(world.schema.operations)
