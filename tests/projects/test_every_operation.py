"""Project isolation over every operation of the OpenAPI schema: another project's key, or the same project's test
key, reaches nothing of what a project's live key made (docs/projects.md, "How isolation is proven").

Project A's live key makes one of everything: a layout, a template, a workflow, a topic with subscribers, recipients
with a device and preferences, a suppression, notifications to a user, to the topic and of the workflow (with its
run), a scheduled one, an event endpoint with attempts, a campaign, an inbox token and a preference link; what no
API makes (inbox items, a dead letter, sandbox messages) is made with tests/factories.py in A's scope.

Then, for each other key (project B's live key, project A's test key), the walk calls every operation of the
schema, in three phases:
- `before`: the other key has nothing named like A's objects. Every operation that names an object (in its path
  or, for a send or a campaign, in its body) with A's identifiers answers 404 (a send, 400 naming the field);
  a list shows none of A's items.
- `create`: the other key makes its own object under each of A's names (a PUT that creates what it names, an
  inbox token, an event endpoint, a suppression of the same address): created, not A's updated.
- `after`: with those twins in place, A's ids still answer 404, a read by name answers the twin, a change by name
  changes the twin, lists show none of A's items, and a link or token minted for a twin opens the twin only.
Every answer the other key gets is checked against the schema, and none may carry `A_MARK`, which A wrote into
every free-text field its objects show. At the end, A's rows (every owned model, read through its owner) and A's
own answers are what they were before the walk.

`CASES` names, per operationId, how the walk calls it; an operation of the schema missing from it fails the
test, so a new endpoint cannot go unchecked. Bodies and the schema checks come from the schema answers' test.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.apps import apps
from django.db.models import QuerySet
from django.test import Client
from django.utils import timezone

from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, Notification
from notifier.statusevents.models import EventEndpoint
from preferences.models import Recipient
from preferences.services import unsubscribe_url
from projects.models import Environment
from projects.scoping import OwnedManager, owner_id, owner_scope
from projects.services import project_create
from tests import factories
from tests.conftest import bearer_client
from tests.project.test_schema_answers import (
    CONTENT,
    PAYLOAD,
    STEPS,
    Schema,
    World,
    schema,  # noqa: F401 - the fixture
)

A_MARK = "a-only"  # in every free-text field of A's objects: no answer to another key may carry it

TEMPLATE, LAYOUT, WORKFLOW, TOPIC = "shipped", "brand", "shipped_flow", "fans"
USER, USER_2, DEVICE, DEDUP = "u-1", "u-2", "tok-a", "k-1"
OWN_TEMPLATE = "own-only"  # a template only the other key has: its sends name A's topic, not A's template
GONE_ADDRESS = "gone@example.com"  # suppressed by A, and then by the other key: two rows, not one

A_CONTENT: dict[str, Any] = {
    "en": {
        **CONTENT["en"],
        "email": {"subject": f"Order {{{{ order_id }}}} ({A_MARK})", "text": f"Shipped ({A_MARK})"},
        "inapp": {"title": f"Shipped ({A_MARK})", "body": "Order {{ order_id }}"},
    }
}
OTHER_CONTENT: dict[str, Any] = {"en": {**CONTENT["en"], "email": {"subject": "Theirs", "text": "Theirs"}}}
A_QUIET = {"start": "22:00", "end": "07:00"}
OTHER_QUIET = {"start": "21:00", "end": "06:00"}
HOOK = {"url": f"https://{A_MARK}.example.com/hook"}


@dataclass
class Key:
    """An API key of one project environment, its test client, and what the walk minted for it."""

    label: str
    client: ApiClient
    http: Any
    inbox_token: str = ""


@dataclass
class Made:
    """Project A's objects: the ids the API answered and the factories made."""

    notifications: dict[str, str]
    deliveries: list[int]
    inbox_items: list[int]
    dead_letter: int
    suppression: int
    campaign: int
    preference_path: str


@dataclass
class Walk:
    """The world of the walk: A's live key, A's objects, and the failures found so far."""

    world: World
    a: Key
    made: Made
    failures: list[str] = field(default_factory=list)

    def call(self, who: Key, operation_id: str, status: int, **kwargs: Any) -> Any:
        """Call an operation as `who` (checked against the schema); no answer to another key may carry A's mark."""
        kwargs.setdefault("http", who.http)  # an inbox token's client, for /inbox/v1
        answer = self.world.call(operation_id, status, **kwargs)
        if who is not self.a:
            assert A_MARK not in json.dumps(answer), f"{operation_id} answered {who.label} with A's: {answer}"
        return answer

    def gone(self, who: Key, operation_id: str, *, body: Any = None, **path: Any) -> None:
        """Call an operation naming A's object as `who`: it must answer 404, as for what does not exist."""
        if body is None and self.world.schema.operations[operation_id][0] in ("post", "put", "patch"):
            body = {}
        answer = self.call(who, operation_id, 404, body=body, **path)
        assert answer["error"]["code"].endswith("not_found"), answer

    def none_of_a(self, who: Key, operation_id: str, *, a_http: Any = None, **kwargs: Any) -> Any:
        """List as A and as `who`: A's list has items, and `who`'s has none of them; return `who`'s answer."""
        http = kwargs.pop("http", who.http)
        mine = _identities(self.world.call(operation_id, 200, http=a_http or self.a.http, **kwargs))
        assert mine, f"{operation_id}: A's own list is empty, the check would prove nothing"
        theirs = self.call(who, operation_id, 200, http=http, **kwargs)
        leaked = mine & _identities(theirs)
        assert not leaked, f"{operation_id} lists A's {sorted(map(str, leaked))} to {who.label}"
        return theirs

    def send(self, who: Key, status: int, **body: Any) -> Any:
        """Send as `who`; a field given as None is left out."""
        fields = {"recipient": {"user_id": USER}, "template": TEMPLATE, "payload": PAYLOAD, **body}
        return self.call(who, "notifications_send", status, body={k: v for k, v in fields.items() if v is not None})


def _identities(answer: Any) -> set[Any]:
    """Return what identifies each item of a list answer: its id, else its name and when it was made."""
    items = answer.get("results", answer.get("items", []))
    return {
        item["id"] if "id" in item else (item.get("key", item.get("user_id")), item["created_at"]) for item in items
    }


def _path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


# --- Project A makes one of everything -------------------------------------------------------------------------


def _inbox_item(client: ApiClient, recipient: Recipient, title: str, **fields: Any) -> Delivery:
    """Return a delivered in-app delivery of `client` to `recipient`, made in the client's environment."""
    content = {"title": title, "body": "Order A-1", "url": "https://shop.example.com/o"}
    with owner_scope(owner_id(client)):
        return factories.make_delivery(
            channel="inapp", status="delivered", recipient=recipient, client=client, content=content, **fields
        )


def make_everything(w: World, a: Key) -> Made:
    """Make one of everything as A's live key (through the API where there is one); return A's ids."""
    http = a.http
    for html in ("<main>{{ content }}</main>", f'<main class="{A_MARK}">{{{{ content }}}}</main>'):  # two versions
        w.call("layout_put", 201, http=http, key=LAYOUT, body={"html": html})
    for _ in range(2):
        body = {"category": "transactional", "content": A_CONTENT, "layout": LAYOUT}
        w.call("template_put", 201, http=http, key=TEMPLATE, body=body)
    w.call("workflow_put", 201, http=http, key=WORKFLOW, body={"category": "transactional", "steps": STEPS})
    w.call("topic_put", 201, http=http, key=TOPIC, body={"name": f"Fans ({A_MARK})"})
    recipient = {"email": f"ann@{A_MARK}.example", "phone": "+4915112345678", "locale": "de"}
    w.call("recipient_put", 201, http=http, user_id=USER, body=recipient)
    w.call("recipient_put", 201, http=http, user_id=USER_2, body={"email": f"bob@{A_MARK}.example"})
    w.call("topic_subscribe", 200, http=http, key=TOPIC, body={"user_ids": [USER, USER_2]})
    w.call("recipient_device_add", 201, http=http, user_id=USER, body={"token": DEVICE, "platform": "fcm"})
    prefs = {"channels": {"sms": False}, "quiet_hours": A_QUIET}
    w.call("preferences_put", 200, http=http, user_id=USER, body=prefs)
    suppression = w.call("suppression_add", 201, http=http, body={"channel": "email", "address": GONE_ADDRESS,
                                                                  "reason": A_MARK})  # fmt: skip
    later = (timezone.now() + dt.timedelta(hours=2)).isoformat()
    sends: dict[str, dict[str, Any]] = {
        "user": {"channels": ["email", "sms"], "dedup_key": DEDUP},
        "topic": {"recipient": None, "topic": TOPIC},
        "flow": {"template": None, "workflow": WORKFLOW},
        "later": {"send_at": later},
    }
    notifications = {name: w.send(http=http, **body)["id"] for name, body in sends.items()}
    campaign = w.call("campaign_create", 201, http=http, body={
        "name": f"Spring ({A_MARK})", "template": TEMPLATE, "topic": TOPIC, "payload": PAYLOAD, "send_at": later,
    })  # fmt: skip
    w.call("event_endpoint_put", 200, http=http, body=HOOK)
    link = w.call("preference_link_create", 200, http=http, user_id=USER, body={})
    a.inbox_token = w.call("inbox_token_create", 200, http=http, user_id=USER, body={})["token"]

    # What no API makes: inbox items (one archived), a dead letter, sandbox messages, event attempts.
    env = owner_id(a.client)
    ann = Recipient.objects.get(environment_id=env, user_id=USER)
    title = f"Shipped ({A_MARK})"
    items = [_inbox_item(a.client, ann, title), _inbox_item(a.client, ann, title, archived_at=timezone.now())]
    with owner_scope(env):
        failed = factories.make_delivery(client=a.client, recipient=ann, status="failed", last_error=A_MARK)
        dead = factories.make_dead_letter(delivery=failed, attempts=5, last_error=A_MARK)
    for delivery in (failed, items[0]):
        factories.make_sandbox_message(delivery_id=delivery.pk, client_id=a.client.pk, channel="email",
                                       address=f"ann@{A_MARK}.example", content={"subject": A_MARK})  # fmt: skip
    endpoint = EventEndpoint.objects.get(client=a.client)
    factories.make_event_attempt(endpoint=endpoint, first_event_id=1, last_event_id=1, events=1, ok=True,
                                 status_code=204, at=timezone.now(), duration_ms=12)  # fmt: skip
    deliveries = sorted(Delivery.objects.filter(environment_id=env).values_list("pk", flat=True))
    return Made(notifications=notifications, deliveries=deliveries, inbox_items=[d.pk for d in items],
                dead_letter=dead.pk, suppression=suppression["id"], campaign=campaign["id"],
                preference_path=_path(link["url"]))  # fmt: skip


# --- What A has, before and after the walk ---------------------------------------------------------------------

VOLATILE = {"last_used_at"}  # A's own calls of the snapshot touch its key


def a_rows(env: int) -> dict[str, list[dict[str, Any]]]:
    """Return every row A's live environment owns, model by model (read through the owner, outside any scope)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for model in apps.get_models():
        manager = model._default_manager
        found: QuerySet[Any]
        if isinstance(manager, OwnedManager):
            found = manager.get_queryset().of(env)
        elif model is ApiClient:
            found = ApiClient.objects.filter(environment_id=env)
        else:
            continue
        values = found.order_by("pk").values()
        rows[model._meta.label] = [{k: v for k, v in row.items() if k not in VOLATILE} for row in values]
    return rows


def a_answers(walk: Walk) -> dict[str, Any]:
    """Return A's own answers about its objects (the browser's links, fresh on every call, left out)."""
    w, http, made = walk.world, walk.a.http, walk.made
    reads: dict[str, Any] = {}
    for name, notification_id in made.notifications.items():
        reads[f"notification {name}"] = w.call("notification_get", 200, http=http, notification_id=notification_id)
    for operation_id, path in (
        ("template_get", {"key": TEMPLATE}), ("template_version_get", {"key": TEMPLATE, "version": 2}),
        ("layout_get", {"key": LAYOUT}), ("workflow_get", {"key": WORKFLOW}), ("topic_get", {"key": TOPIC}),
        ("recipient_get", {"user_id": USER}), ("recipient_get", {"user_id": USER_2}),
        ("preferences_get", {"user_id": USER}), ("campaign_get", {"campaign_id": made.campaign}),
        ("event_endpoint_get", {}), ("event_endpoint_attempts", {}), ("stats_get", {}),
        ("notifications_list", {}), ("templates_list", {}), ("workflows_list", {}), ("topics_list", {}),
        ("recipients_list", {}), ("suppressions_list", {}), ("campaigns_list", {}), ("dead_letters_list", {}),
        ("sandbox_messages_list", {}),
    ):  # fmt: skip
        reads[f"{operation_id} {path}"] = w.call(operation_id, 200, http=http, **path)
    for archived in ("false", "true"):
        reads[f"inbox {archived}"] = w.call("inbox_list", 200, http=http, user_id=USER, query={"archived": archived})
    browser = bearer_client(walk.a.inbox_token)
    reads["browser inbox"] = w.call("browser_inbox_list", 200, http=browser)
    me = w.call("browser_inbox_me", 200, http=browser)
    reads["browser me"] = {k: v for k, v in me.items() if not k.startswith("preferences_")}
    page = Client().get(made.preference_path)
    assert page.status_code == 200
    reads["preference center"] = re.findall(r'name="quiet_(?:start|end)" value="([^"]*)"', page.content.decode())
    return reads


# --- The cases: how the other key calls each operation ----------------------------------------------------------

Step = Callable[[Walk, Key], None]


@dataclass(frozen=True)
class Case:
    """How the walk calls one operation as the other key, per phase (see the module's docstring)."""

    before: Step | None = None
    create: Step | None = None
    after: Step | None = None
    outside: str = ""  # why no project's key calls it (then no phase)


def gone(operation_id: str, body: Any = None, **path: Callable[[Made], Any] | Any) -> Case:
    """A case naming A's object, before and after the twins exist: 404 both times."""

    def step(walk: Walk, other: Key) -> None:
        values = {name: value(walk.made) if callable(value) else value for name, value in path.items()}
        walk.gone(other, operation_id, body=body, **values)

    return Case(before=step, after=step)


def gone_then(operation_id: str, after: Step, body: Any = None, **path: Any) -> Case:
    """A case naming A's object by name: 404 before the twin exists, then `after`."""
    return Case(before=gone(operation_id, body, **path).before, after=after)


def listed(operation_id: str, query: dict[str, Any] | None = None) -> Case:
    """A list: none of A's items, before and after the other key made its own."""

    def step(walk: Walk, other: Key) -> None:
        walk.none_of_a(other, operation_id, query=query)

    return Case(before=step, after=step)


def each(operation_id: str, ids: Callable[[Made], list[Any]], name: str, **path: Any) -> Case:
    """A case naming each of several of A's objects by id: 404 for every one, before and after."""

    def step(walk: Walk, other: Key) -> None:
        for value in ids(walk.made):
            walk.gone(other, operation_id, **{name: value}, **path)

    return Case(before=step, after=step)


def twin(operation_id: str, **path: Any) -> Step:
    """Read the other key's twin by A's name: its own (made after A's), not A's."""

    def step(walk: Walk, other: Key) -> None:
        theirs = walk.call(other, operation_id, 200, **path)
        mine = walk.world.call(operation_id, 200, http=walk.a.http, **path)
        assert theirs["created_at"] != mine["created_at"], f"{operation_id} {path} answered {other.label} with A's"

    return step


# Notifications


def _send_before(walk: Walk, other: Key) -> None:
    for body, name in (({}, "template"), ({"template": None, "workflow": WORKFLOW}, "workflow"),
                       ({"recipient": None, "topic": TOPIC, "template": OWN_TEMPLATE}, "topic")):  # fmt: skip
        answer = walk.send(other, 400, **body)
        assert name in answer["error"]["fields"], (body, answer)
    # A's dedup key is not the other key's: a new notification, not A's answered as a duplicate.
    sent = walk.send(other, 202, recipient={"user_id": "own-user"}, template=OWN_TEMPLATE, dedup_key=DEDUP)
    assert not sent["duplicate"] and sent["id"] not in walk.made.notifications.values()


def _send_after(walk: Walk, other: Key) -> None:
    """With the twins: a send by A's names reaches the other key's template, topic and workflow, never A's."""
    for body in ({"channels": ["email"]}, {"recipient": None, "topic": TOPIC},
                 {"template": None, "workflow": WORKFLOW}):  # fmt: skip
        sent = walk.send(other, 202, **body)
        notification = Notification.objects.get(pk=sent["id"])
        assert notification.environment_id == owner_id(other.client)
        if notification.topic_id:
            assert notification.topic.environment_id == owner_id(other.client)
        for delivery in Delivery.objects.filter(notification_id=sent["id"]).select_related("recipient"):
            assert delivery.recipient.environment_id == owner_id(other.client), delivery.address


def _batch_before(walk: Walk, other: Key) -> None:
    items = [
        {"recipient": {"user_id": USER}, "template": TEMPLATE},
        {"recipient": {"user_id": USER}, "workflow": WORKFLOW},
        {"topic": TOPIC, "template": OWN_TEMPLATE},
        {"recipient": {"user_id": "own-user"}, "template": OWN_TEMPLATE, "payload": PAYLOAD, "dedup_key": DEDUP},
    ]
    results = walk.call(other, "notifications_send_batch", 200, body={"notifications": items})["results"]
    assert [r["status"] for r in results[:3]] == [400, 400, 400], results
    # A's dedup key: the other key's own notification (a duplicate of its send's, when that ran first), not A's.
    assert results[3]["status"] in (200, 202) and results[3]["id"] not in walk.made.notifications.values(), results


def _stats(walk: Walk, other: Key) -> None:
    """The other key's counts are of its own deliveries only (A's stats count A's)."""
    assert walk.world.call("stats_get", 200, http=walk.a.http)["results"]
    theirs = walk.call(other, "stats_get", 200)["results"]
    own = Delivery.objects.filter(notification__client=other.client).count()
    assert sum(row["count"] for row in theirs) == own, theirs


def _project(walk: Walk, other: Key) -> None:
    """The other key reads its own project and environment, never A's, nor A's quotas or their use."""
    mine = Environment.objects.select_related("project").get(pk=owner_id(walk.a.client))
    mine.quotas = {"inapp": 1_000_000}
    mine.save()
    ours = walk.world.call("project_get", 200, http=walk.a.http)
    assert (ours["slug"], ours["environment"], list(ours["quotas"])) == (mine.project.slug, mine.name, ["inapp"])
    theirs = walk.call(other, "project_get", 200)
    own = Environment.objects.select_related("project").get(pk=owner_id(other.client))
    assert (theirs["slug"], theirs["environment"], theirs["quotas"]) == (own.project.slug, own.name, {}), theirs
    mine.quotas = {}
    mine.save()


# Templates, layouts, workflows


def _template_put(walk: Walk, other: Key) -> None:
    body = {"category": "transactional", "content": OTHER_CONTENT}
    assert walk.call(other, "template_put", 201, key=TEMPLATE, body=body)["version"] == 1  # A's is at 2


def _own_template(walk: Walk, other: Key) -> None:
    """The one template the other key has from the start (its sends in `before` name A's topic, not A's template)."""
    walk.call(other, "template_put", 201, key=OWN_TEMPLATE, body={"category": "transactional", "content": CONTENT})


def _template_preview_after(walk: Walk, other: Key) -> None:
    walk.call(other, "template_preview", 200, key=TEMPLATE, body={"payload": PAYLOAD})
    walk.gone(other, "template_preview", key=TEMPLATE, body={"payload": PAYLOAD, "version": 2})


def _template_version_after(walk: Walk, other: Key) -> None:
    walk.call(other, "template_version_get", 200, key=TEMPLATE, version=1)
    walk.gone(other, "template_version_get", key=TEMPLATE, version=2)


def _layout_put(walk: Walk, other: Key) -> None:
    assert walk.call(other, "layout_put", 201, key=LAYOUT, body={"html": "<div>{{ content }}</div>"})["version"] == 1


def _workflow_put(walk: Walk, other: Key) -> None:
    walk.call(other, "workflow_put", 201, key=WORKFLOW, body={"category": "transactional", "steps": STEPS})


# Recipients, devices, preferences


def _recipient_put(walk: Walk, other: Key) -> None:
    for user_id in (USER, USER_2):
        walk.call(other, "recipient_put", 201, user_id=user_id, body={"email": f"{user_id}@theirs.example"})
    # An inbox item of the twin: the inbox answers below list it, and never A's.
    twin_recipient = Recipient.objects.get(environment_id=owner_id(other.client), user_id=USER)
    _inbox_item(other.client, twin_recipient, "Theirs")


def _recipients_batch_before(walk: Walk, other: Key) -> None:
    """A's topic is not the other key's to join: that item is refused, nothing written."""
    body = {"recipients": [{"user_id": "own-batch-user", "topics": [TOPIC]}]}
    (result,) = walk.call(other, "recipients_batch", 200, body=body)["results"]
    assert result["status"] == 400 and "topics" in result["error"]["fields"], result


def _recipients_batch_after(walk: Walk, other: Key) -> None:
    """A's user id names the other key's twin: the batch updates the twin, never A's recipient."""
    body = {"recipients": [{"user_id": USER, "email": f"{USER}@theirs.example"}]}
    assert walk.call(other, "recipients_batch", 200, body=body)["results"] == [{"user_id": USER, "status": 200}]


def _recipient_erase_after(walk: Walk, other: Key) -> None:
    """Erasing the other key's USER_2 erases its own (A's USER_2 is unchanged: the snapshot)."""
    walk.call(other, "recipient_erase", 204, user_id=USER_2)
    walk.gone(other, "recipient_get", user_id=USER_2)


def _device_add(walk: Walk, other: Key) -> None:
    """The same phone token in another environment is that environment's own device."""
    walk.call(other, "recipient_device_add", 201, user_id=USER, body={"token": DEVICE, "platform": "fcm"})


def _device_remove_after(walk: Walk, other: Key) -> None:
    walk.call(other, "recipient_device_remove", 204, user_id=USER, token=DEVICE)
    walk.gone(other, "recipient_device_remove", user_id=USER, token=DEVICE)


def _preferences_get_after(walk: Walk, other: Key) -> None:
    assert walk.call(other, "preferences_get", 200, user_id=USER)["quiet_hours"] != A_QUIET


def _preferences_put_after(walk: Walk, other: Key) -> None:
    walk.call(other, "preferences_put", 200, user_id=USER, body={"quiet_hours": OTHER_QUIET})


def _quiet_hours(page: Any) -> list[str]:
    assert page.status_code == 200, page.status_code
    return [value[:5] for value in re.findall(r'name="quiet_(?:start|end)" value="([^"]*)"', page.content.decode())]


def _preference_link_after(walk: Walk, other: Key) -> None:
    """A link minted for the twin opens the twin's preferences, and saving it saves the twin's."""
    browser = Client()
    # The one-click unsubscribe link of an email to the twin unsubscribes the twin.
    twin_recipient = Recipient.objects.get(environment_id=owner_id(other.client), user_id=USER)
    unsubscribed = browser.post(_path(unsubscribe_url(recipient=twin_recipient, category="marketing")))
    assert unsubscribed.status_code == 200, unsubscribed.content[:500]
    prefs = walk.call(other, "preferences_get", 200, user_id=USER)
    assert prefs["categories"].get("marketing", {}).get("enabled") is False, prefs
    link = _path(walk.call(other, "preference_link_create", 200, user_id=USER, body={})["url"])
    assert _quiet_hours(browser.get(link)) == [OTHER_QUIET["start"], OTHER_QUIET["end"]]
    saved = browser.post(link, {"quiet_start": "20:00", "quiet_end": "05:00", "channel-email": "on"})
    assert saved.status_code == 302, saved.content[:500]
    assert walk.call(other, "preferences_get", 200, user_id=USER)["quiet_hours"] == {"start": "20:00", "end": "05:00"}
    # A's own link still opens A's preferences.
    assert _quiet_hours(browser.get(walk.made.preference_path)) == [A_QUIET["start"], A_QUIET["end"]]


# Inboxes


def _inbox_items(made: Made) -> list[int]:
    return made.inbox_items


def _inbox_list_after(walk: Walk, other: Key) -> None:
    assert _identities(walk.none_of_a(other, "inbox_list", user_id=USER))  # the twin's own item
    walk.none_of_a(other, "inbox_list", user_id=USER, query={"archived": "true"})


def _inbox_read_all_after(walk: Walk, other: Key) -> None:
    assert walk.call(other, "inbox_read_all", 200, user_id=USER)["marked_read"] == 1  # the twin's one item


def _inbox_token_create(walk: Walk, other: Key) -> None:
    other.inbox_token = walk.call(other, "inbox_token_create", 200, user_id=USER, body={})["token"]


def _browser(other: Key) -> Any:
    return bearer_client(other.inbox_token)


def _browser_me_after(walk: Walk, other: Key) -> None:
    """The token the other key minted speaks for its twin: its locale, and a preference link to the twin."""
    me = walk.call(other, "browser_inbox_me", 200, http=_browser(other))
    assert me["user_id"] == USER and me["locale"] != "de", me  # A's USER is German
    assert _quiet_hours(Client().get(_path(me["preferences_url"]))) != [A_QUIET["start"], A_QUIET["end"]]


def _browser_list_after(walk: Walk, other: Key) -> None:
    """The two tokens of one user id list two inboxes with no item in common (A's token: not the twin's either)."""
    theirs = walk.none_of_a(other, "browser_inbox_list", a_http=bearer_client(walk.a.inbox_token), http=_browser(other))
    assert _identities(theirs), "the twin's inbox is empty: A's token could not be seen reading it"


def _browser_item(operation_id: str) -> Case:
    def step(walk: Walk, other: Key) -> None:
        for item in walk.made.inbox_items:
            walk.gone(other, operation_id, http=_browser(other), delivery_id=item)

    return Case(after=step)


def _browser_read_all_after(walk: Walk, other: Key) -> None:
    """The twin's inbox is read already (inbox_read_all): nothing to mark, and A's unread items stay unread."""
    assert walk.call(other, "browser_inbox_read_all", 200, http=_browser(other)) == {
        "marked_read": 0,
        "unread_count": 0,
    }


# Topics, suppressions


def _topic_put(walk: Walk, other: Key) -> None:
    walk.call(other, "topic_put", 201, key=TOPIC, body={"name": "Fans of theirs"})


def _topic_get_after(walk: Walk, other: Key) -> None:
    twin("topic_get", key=TOPIC)(walk, other)
    assert walk.call(other, "topic_get", 200, key=TOPIC)["subscribers"] == 0  # A's has two


def _topic_subscribe_after(walk: Walk, other: Key) -> None:
    assert walk.call(other, "topic_subscribe", 200, key=TOPIC, body={"user_ids": [USER]})["total"] == 1


def _topic_unsubscribe_after(walk: Walk, other: Key) -> None:
    walk.call(other, "topic_unsubscribe", 204, key=TOPIC, user_id=USER)
    assert walk.call(other, "topic_get", 200, key=TOPIC)["subscribers"] == 0


def _suppression_add(walk: Walk, other: Key) -> None:
    """The address A suppressed is not suppressed for the other key: 201 (made), not 200 (already there)."""
    walk.call(other, "suppression_add", 201, body={"channel": "email", "address": GONE_ADDRESS})


# Campaigns, dead letters, sandbox, the event endpoint


def _campaign_create_before(walk: Walk, other: Key) -> None:
    body = {"name": "Theirs", "template": TEMPLATE, "topic": TOPIC, "payload": PAYLOAD, "draft": True}
    answer = walk.call(other, "campaign_create", 400, body=body)
    assert {"template", "topic"} & set(answer["error"]["fields"]), answer


def _dead_letters_replay(walk: Walk, other: Key) -> None:
    assert walk.call(other, "dead_letters_replay", 200, body={"ids": [walk.made.dead_letter]})["replayed"] == 0
    assert walk.call(other, "dead_letters_replay", 200, body={"all": True})["replayed"] == 0


def _sandbox(walk: Walk, other: Key) -> None:
    walk.none_of_a(other, "sandbox_messages_list")
    for delivery_id in walk.made.deliveries:
        query = {"delivery_id": delivery_id}
        assert walk.call(other, "sandbox_messages_list", 200, query=query)["results"] == [], delivery_id


def _endpoint_put(walk: Walk, other: Key) -> None:
    walk.call(other, "event_endpoint_put", 200, body={"url": "https://theirs.example.com/hook"})


def _endpoint_missing(operation_id: str) -> Step:
    def step(walk: Walk, other: Key) -> None:
        walk.gone(other, operation_id)

    return step


def _endpoint_get_after(walk: Walk, other: Key) -> None:
    assert walk.call(other, "event_endpoint_get", 200)["url"] == "https://theirs.example.com/hook"


def _endpoint_rotate_after(walk: Walk, other: Key) -> None:
    walk.call(other, "event_endpoint_rotate_secret", 200)


def _endpoint_attempts_after(walk: Walk, other: Key) -> None:
    walk.none_of_a(other, "event_endpoint_attempts")


def _endpoint_delete_after(walk: Walk, other: Key) -> None:
    walk.call(other, "event_endpoint_delete", 204)
    walk.gone(other, "event_endpoint_delete")


UNKEYED = (
    "a provider's callback carries no key but the provider's signature; it finds a delivery by the provider's own "
    "message id, which the provider made unique, whatever project sent it"
)


def _promotion_list(walk: Walk, other: Key) -> None:
    # Both environments' keys of a project read its promotions (A's test key sees what live has that test lacks,
    # by design); another project's key sees nothing of A's.
    answer = walk.call(other, "promotion_list", 200)
    projects = dict(Environment.objects.values_list("pk", "project_id"))
    if projects[owner_id(other.client)] != projects[owner_id(walk.a.client)]:
        assert answer["results"] == [], answer


def _promotion_apply(walk: Walk, other: Key) -> None:
    kinds = (("layout", LAYOUT), ("template", TEMPLATE), ("workflow", WORKFLOW))
    answer = walk.call(other, "promotion_apply", 200, body={"items": [{"kind": k, "key": key} for k, key in kinds]})
    assert [item["status"] for item in answer["results"]] == [404, 404, 404], answer


# The table: how the walk calls every operation of the schema. Each phase runs the cases in this order: a twin's
# parent is made before its children (a recipient before its device), a read before the case that deletes it.
CASES: dict[str, Case] = {
    "templates_list": listed("templates_list"),
    "template_get": gone_then("template_get", twin("template_get", key=TEMPLATE), key=TEMPLATE),
    "template_put": Case(create=_template_put),
    "template_preview": gone_then("template_preview", _template_preview_after, {"payload": PAYLOAD}, key=TEMPLATE),
    "template_version_get": gone_then("template_version_get", _template_version_after, key=TEMPLATE, version=1),
    "layout_put": Case(create=_layout_put),
    "layout_get": gone_then("layout_get", twin("layout_get", key=LAYOUT), key=LAYOUT),
    "workflows_list": listed("workflows_list"),
    "workflow_put": Case(create=_workflow_put),
    "workflow_get": gone_then("workflow_get", twin("workflow_get", key=WORKFLOW), key=WORKFLOW),
    "recipients_list": listed("recipients_list"),
    "recipient_put": Case(create=_recipient_put),
    "recipients_batch": Case(before=_recipients_batch_before, after=_recipients_batch_after),
    "recipient_get": gone_then("recipient_get", twin("recipient_get", user_id=USER), user_id=USER),
    "recipient_erase": gone_then("recipient_erase", _recipient_erase_after, user_id=USER),
    "recipient_device_add": Case(
        before=gone("recipient_device_add", {"token": "x"}, user_id=USER).before, create=_device_add
    ),
    "recipient_device_remove": gone_then("recipient_device_remove", _device_remove_after, user_id=USER, token=DEVICE),
    "preferences_get": gone_then("preferences_get", _preferences_get_after, user_id=USER),
    "preferences_put": gone_then("preferences_put", _preferences_put_after, {"quiet_hours": None}, user_id=USER),
    "preference_link_create": gone_then("preference_link_create", _preference_link_after, {}, user_id=USER),
    "topics_list": listed("topics_list"),
    "topic_put": Case(create=_topic_put),
    "topic_get": gone_then("topic_get", _topic_get_after, key=TOPIC),
    "topic_subscribe": gone_then("topic_subscribe", _topic_subscribe_after, {"user_ids": [USER]}, key=TOPIC),
    "topic_unsubscribe": gone_then("topic_unsubscribe", _topic_unsubscribe_after, key=TOPIC, user_id=USER),
    "inbox_list": gone_then("inbox_list", _inbox_list_after, user_id=USER),
    "inbox_item_read": each("inbox_item_read", _inbox_items, "delivery_id", user_id=USER),
    "inbox_item_archive": each("inbox_item_archive", _inbox_items, "delivery_id", user_id=USER),
    "inbox_item_unarchive": each("inbox_item_unarchive", _inbox_items, "delivery_id", user_id=USER),
    "inbox_item_click": each("inbox_item_click", _inbox_items, "delivery_id", user_id=USER),
    "inbox_read_all": gone_then("inbox_read_all", _inbox_read_all_after, user_id=USER),
    "inbox_token_create": Case(create=_inbox_token_create),
    "browser_inbox_me": Case(after=_browser_me_after),
    "browser_inbox_list": Case(after=_browser_list_after),
    "browser_inbox_item_read": _browser_item("browser_inbox_item_read"),
    "browser_inbox_item_archive": _browser_item("browser_inbox_item_archive"),
    "browser_inbox_item_unarchive": _browser_item("browser_inbox_item_unarchive"),
    "browser_inbox_item_click": _browser_item("browser_inbox_item_click"),
    "browser_inbox_read_all": Case(after=_browser_read_all_after),
    "notifications_send": Case(before=_send_before, after=_send_after),
    "notifications_send_batch": Case(before=_batch_before),
    "notifications_list": listed("notifications_list"),
    "notification_get": each("notification_get", lambda m: list(m.notifications.values()), "notification_id"),
    "notification_cancel": each(
        "notification_cancel", lambda m: [m.notifications["later"], m.notifications["flow"]], "notification_id"
    ),
    "stats_get": Case(before=_stats, after=_stats),
    "project_get": Case(before=_project, after=_project),
    "suppressions_list": listed("suppressions_list"),
    "suppression_add": Case(create=_suppression_add),
    "suppression_remove": gone("suppression_remove", suppression_id=lambda m: m.suppression),
    "campaigns_list": listed("campaigns_list"),
    "campaign_create": Case(before=_campaign_create_before),
    "campaign_get": gone("campaign_get", campaign_id=lambda m: m.campaign),
    "campaign_update": gone("campaign_update", {"name": "Theirs"}, campaign_id=lambda m: m.campaign),
    "campaign_action": gone("campaign_action", campaign_id=lambda m: m.campaign, action="pause"),
    "dead_letters_list": listed("dead_letters_list"),
    "dead_letter_replay": gone("dead_letter_replay", dead_letter_id=lambda m: m.dead_letter),
    "dead_letter_discard": gone("dead_letter_discard", dead_letter_id=lambda m: m.dead_letter),
    "dead_letters_replay": Case(before=_dead_letters_replay, after=_dead_letters_replay),
    "sandbox_messages_list": Case(before=_sandbox, after=_sandbox),
    "event_endpoint_get": Case(before=_endpoint_missing("event_endpoint_get"), after=_endpoint_get_after),
    "event_endpoint_put": Case(create=_endpoint_put),
    "event_endpoint_rotate_secret": Case(
        before=_endpoint_missing("event_endpoint_rotate_secret"), after=_endpoint_rotate_after
    ),
    "event_endpoint_attempts": Case(
        before=_endpoint_missing("event_endpoint_attempts"), after=_endpoint_attempts_after
    ),
    "event_endpoint_delete": Case(before=_endpoint_missing("event_endpoint_delete"), after=_endpoint_delete_after),
    "template_rollback": Case(before=gone("template_rollback", {"version": 1}, key=TEMPLATE).before),
    "layout_rollback": Case(before=gone("layout_rollback", {"version": 1}, key=LAYOUT).before),
    "workflow_rollback": Case(before=gone("workflow_rollback", {"version": 1}, key=WORKFLOW).before),
    "promotion_list": Case(before=_promotion_list),
    "promotion_apply": Case(before=_promotion_apply),
    "callback_ses": Case(outside=UNKEYED),
    "callback_twilio": Case(outside=UNKEYED),
}
PHASES = ("before", "create", "after")


@pytest.mark.pure
def test_every_operation_of_the_schema_has_a_case(schema: Schema) -> None:  # noqa: F811 - the fixture
    assert len(schema.operations) > 40  # the schema was generated, not an empty document
    missing = sorted(set(schema.operations) - set(CASES))
    assert not missing, f"operations the isolation walk does not call (add them to CASES in {__name__}): {missing}"
    assert sorted(set(CASES) - set(schema.operations)) == []
    for operation_id, case in CASES.items():
        assert bool(case.outside) != any(getattr(case, phase) for phase in PHASES), operation_id


@pytest.fixture
def walk(
    schema: Schema,  # noqa: F811 - the fixture
    api_client_factory: Callable[..., tuple[Any, Any]],
    settings: Any,
    request: pytest.FixtureRequest,
) -> Walk:
    settings.PUBLIC_BASE_URL = "https://notifier.example.com"
    project_create(slug="proj-a")
    project_create(slug="proj-b")
    a = Key("A live", *api_client_factory(project="proj-a"))
    world = World(schema=schema, api=a.http, service=a.client, factory=api_client_factory,
                  fixture=request.getfixturevalue)  # fmt: skip
    # The test's transaction never commits: the sends publish nothing (they publish on commit).
    return Walk(world=world, a=a, made=make_everything(world, a))


@pytest.mark.django_db
@pytest.mark.parametrize("other", ["B live", "A test"])
def test_no_operation_reaches_another_project_environments_objects(
    walk: Walk, other: str, api_client_factory: Callable[..., Any]
) -> None:
    """Every operation as project B's live key (or A's test key) with A's identifiers; A stays as it was."""
    project, mode = ("proj-b", "live") if other == "B live" else ("proj-a", "test")
    key = Key(other, *api_client_factory(project=project, mode=mode))
    env = owner_id(walk.a.client)
    rows, answers = a_rows(env), a_answers(walk)
    _own_template(walk, key)
    for phase in PHASES:
        for operation_id, case in CASES.items():
            step = getattr(case, phase)
            if step is None:
                continue
            try:
                step(walk, key)
            except Exception as exc:  # every leak of the walk in one report (a crash is one too)
                first = (str(exc).splitlines() or [""])[0][:400]
                walk.failures.append(f"{phase} {operation_id}: {type(exc).__name__}: {first}")
    assert not walk.failures, f"{len(walk.failures)} leaks to {other}:\n" + "\n".join(walk.failures)
    assert a_answers(walk) == answers
    after = a_rows(env)
    changed = {
        label: {
            "gone": [r for r in rows[label] if r not in after[label]],
            "now": [r for r in after[label] if r not in rows[label]],
        }
        for label in rows
        if rows[label] != after[label]
    }
    assert not changed, f"A's rows changed: {changed}"
