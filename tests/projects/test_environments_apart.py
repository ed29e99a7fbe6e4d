"""Nothing folds, counts or deduplicates across project environments.

One person is known by the same user id (and the same address) to project A's live key, A's test key and project
B's live key. Each environment has its own templates and workflows under the same keys. Its digests (preference
digests and workflow digests), its throttles, frequency caps, dedup keys and statistics hold only its own
traffic: what the user reads (the digest emails in each key's sandbox, each key's answers) is checked, end to end
where workers decide it.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from django.utils import timezone

from notifier.deliveries.models import Delivery
from notifier.dispatch.digest import digest_flush
from notifier.workflows.models import WorkflowRun
from tests.campaigns.test_campaigns import BEAT
from tests.conftest import wait_for
from tests.deliveries.test_frequency_cap import _categories, redis_down  # noqa: F401 - the fixture
from tests.projects.test_isolation import keys  # noqa: F401 - the fixture
from tests.workflows.test_workflows import CONTENT as COMMENT
from tests.workflows.test_workflows_e2e import ENV as WORKFLOW_ENV
from tests.workflows.test_workflows_e2e import QUEUES as WORKFLOW_QUEUES

ITEM = {"en": {"email": {"subject": "{{ title }}", "text": "{{ title }}"}}}


def _digest_content(name: str) -> dict[str, Any]:
    """Return a digest template that says which environment's it is, then its count and items."""
    return {
        "en": {
            "email": {
                "subject": f"{name}: {{{{ count }}}} updates",
                "text": "{% for item in items %}{{ item.payload.title }};{% endfor %}",
            }
        }
    }


def _put_template(api: Any, key: str, category: str, content: dict[str, Any], **extra: Any) -> None:
    body = {"category": category, "default_locale": "en", "content": content, **extra}
    answer = api.put(f"/api/v1/templates/{key}", body, format="json")
    assert answer.status_code in (200, 201), answer.content


def _emails(api: Any) -> list[dict[str, Any]]:
    answer = api.get("/api/v1/sandbox/messages", {"channel": "email"})
    assert answer.status_code == 200, answer.content
    return list(answer.json()["results"])


@pytest.mark.django_db(transaction=True)
def test_each_environments_hourly_digest_holds_only_its_own_items(
    keys: dict[str, tuple[Any, Any]],  # noqa: F811 - the fixture
    start_worker: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    items = {"a": ["a1", "a2"], "a_test": ["t1", "t2", "t3"], "b": ["b1"]}
    preferences = {"categories": {"marketing": {"enabled": True, "frequency": "hourly_digest"}}}
    for name, (_, api) in keys.items():
        _put_template(api, "promo", "marketing", ITEM)
        # Each environment's own digest template and layout, under the same keys.
        layout = {"html": "<main>{{ content }}</main>", "text": f"{name} | {{{{ content }}}}"}
        assert api.put("/api/v1/layouts/frame", layout, format="json").status_code == 201
        _put_template(api, "digest", "marketing", _digest_content(name), layout="frame")
        assert api.put("/api/v1/recipients/dig-1", {"email": "dig-1@example.com"}, format="json").status_code == 201
        assert api.put("/api/v1/recipients/dig-1/preferences", preferences, format="json").status_code == 200
    start_worker(queues=["email.high", "email.low"])
    for name, (_, api) in keys.items():
        for title in items[name]:
            sent = api.post(
                "/api/v1/notifications",
                {"recipient": {"user_id": "dig-1"}, "template": "promo", "payload": {"title": title}},
                format="json",
            )
            assert sent.status_code == 202, sent.content
            assert [d["reason"] for d in sent.json()["deliveries"]] == ["digest:hourly_digest"]

    # The hour ends: one flush, one digest per environment, each with that environment's digest template.
    with django_capture_on_commit_callbacks(execute=True):
        assert digest_flush(frequency="hourly_digest", now=timezone.now()) == 3
    digests = Delivery.objects.filter(notification__template_key="digest")
    wait_for(lambda: digests.filter(status__in=["sent", "failed"]).count() == 3, 60)
    assert sorted(digests.values_list("status", "last_error")) == [("sent", "")] * 3

    for name, (client, api) in keys.items():
        [email] = _emails(api)
        assert email["address"] == "dig-1@example.com" and email["provider"] == "sandbox"
        assert email["content"]["subject"] == f"{name}: {len(items[name])} updates"
        # The first line is the laid-out digest (the footer with the recipient's links follows).
        lines = email["content"]["text"].splitlines()
        assert lines[0] == f"{name} | " + "".join(f"{title};" for title in items[name])
        # The digest is its environment's client's: a test key's goes to the sandbox whatever the live ones use.
        digest = Delivery.objects.select_related("notification__client").get(pk=email["delivery_id"])
        assert (digest.notification.client_id, digest.provider) == (client.pk, "sandbox")
    assert keys["a_test"][0].mode == "test"


def _post(api: Any, body: dict[str, Any]) -> dict[str, Any]:
    answer = api.post("/api/v1/notifications", body, format="json")
    assert answer.status_code in (200, 202), answer.content
    return {"code": answer.status_code, **answer.json()}


@pytest.mark.django_db(transaction=True)
def test_each_environments_workflow_digest_and_throttle_count_only_its_own_triggers(
    keys: dict[str, tuple[Any, Any]],  # noqa: F811 - the fixture
    start_worker: Any,
    start_process: Any,
) -> None:
    authors = {"a": ["ann", "bob"], "a_test": ["cat", "dan", "eve"], "b": ["fay"]}
    # The throttle lets two runs per hour through; A's test key triggers three before A's live key triggers two.
    throttled = {"a_test": 3, "a": 2, "b": 1}
    for name, (_, api) in keys.items():
        _put_template(api, "comment_added", "transactional", COMMENT)
        digest_content = {
            "email": {
                "subject": f"{name}: {{{{ digest.count }}}} new comments",
                "text": "{% for e in digest.events %}{{ e.author }};{% endfor %}",
            }
        }
        _put_template(api, "comment_digest", "transactional", {"en": digest_content})
        assert api.put("/api/v1/recipients/e2e-1", {"email": "e2e-1@example.com"}, format="json").status_code == 201
        for key, steps in (
            # Wide enough that an environment's triggers all reach the step while it is open, on a loaded box too.
            ("thread", [{"id": "batch", "type": "digest", "window_seconds": 6, "key": "{{ thread_id }}"},
                        {"id": "mail", "type": "send", "channel": "email", "template": "comment_digest"}]),
            ("capped", [{"id": "cap", "type": "throttle", "max": 2, "per_seconds": 3600},
                        {"id": "bell", "type": "send", "channel": "inapp", "template": "comment_added"}]),
        ):  # fmt: skip
            made = api.put(f"/api/v1/workflows/{key}", {"category": "transactional", "steps": steps}, format="json")
            assert made.status_code == 201, made.content
    start_worker(queues=WORKFLOW_QUEUES, env=WORKFLOW_ENV)
    start_process("beat", BEAT, WORKFLOW_ENV)

    trigger = {"recipient": {"user_id": "e2e-1"}}
    for name, (_, api) in keys.items():
        for author in authors[name]:
            _post(api, {**trigger, "workflow": "thread", "payload": {"thread_id": "t-7", "author": author}})
    capped = {
        name: [_post(keys[name][1], {**trigger, "workflow": "capped"})["id"] for _ in range(count)]
        for name, count in throttled.items()
    }
    wait_for(lambda: not WorkflowRun.objects.filter(status__in=["running", "waiting"]).exists(), 90)

    for name, (_, api) in keys.items():
        # One digest email per environment, merging that environment's triggers only.
        [email] = wait_for(functools.partial(_emails, api), 30)
        assert email["content"]["subject"] == f"{name}: {len(authors[name])} new comments"
        assert sorted(email["content"]["text"].split(";")[:-1]) == authors[name]
        # The throttle's allowance is the environment's: A's test triggers used none of A's live ones.
        statuses = [api.get(f"/api/v1/notifications/{n}").json()["run_status"] for n in capped[name]]
        assert sorted(statuses) == ["done"] * min(2, throttled[name]) + ["throttled"] * (throttled[name] - 2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("redis", ["up", "down"])
def test_frequency_caps_dedup_keys_and_statistics_are_each_environments_own(
    keys: dict[str, tuple[Any, Any]],  # noqa: F811 - the fixture
    settings: Any,
    request: pytest.FixtureRequest,
    redis: str,
) -> None:
    if redis == "down":  # the caps' other counter: the recipient's notifications in PostgreSQL
        request.getfixturevalue("redis_down")
    _categories(settings, social={"max": 2, "per_seconds": 3600})
    for _, api in keys.values():
        _put_template(api, "news", "social", ITEM)
        assert api.put("/api/v1/recipients/fc-1", {"email": "fc-1@example.com"}, format="json").status_code == 201
    send = {"recipient": {"user_id": "fc-1"}, "template": "news", "payload": {"title": "News"}}
    (_, a), (_, a_test), (_, b) = keys["a"], keys["a_test"], keys["b"]

    def outcome(answer: dict[str, Any]) -> tuple[int, list[tuple[str, str]]]:
        return answer["code"], [(d["status"], d["reason"]) for d in answer["deliveries"]]

    # A's test key uses up its allowance first, with the dedup key A's live key and B's key also send.
    tested = [_post(a_test, {**send, "dedup_key": "k-1"}), _post(a_test, send)]
    assert [outcome(t) for t in tested] == [(202, [("queued", "")])] * 2
    first = _post(a, {**send, "dedup_key": "k-1"})
    assert outcome(first) == (202, [("queued", "")]) and first["id"] != tested[0]["id"]
    again = _post(a, {**send, "dedup_key": "k-1"})  # the dedup key works within an environment
    assert (again["code"], again["id"]) == (200, first["id"])
    assert outcome(_post(a, send)) == (202, [("queued", "")])
    assert outcome(_post(a, send)) == (202, [("suppressed", "frequency_cap")])
    other = _post(b, {**send, "dedup_key": "k-1"})
    assert outcome(other) == (202, [("queued", "")]) and other["id"] not in (first["id"], tested[0]["id"])

    # Statistics are the key's own: the test key's count no live traffic, the live keys' no test traffic.
    def stats(api: Any, **query: str) -> list[dict[str, Any]]:
        answer = api.get("/api/v1/stats", {"group_by": "status", **query})
        assert answer.status_code == 200, answer.content
        return list(answer.json()["results"])

    assert stats(a_test) == stats(a_test, mode="test") == [{"status": "queued", "count": 2}]
    assert stats(a) == stats(a, mode="live") == [{"status": "queued", "count": 2}, {"status": "suppressed", "count": 1}]
    assert stats(b) == [{"status": "queued", "count": 1}]
    assert stats(a_test, mode="live") == stats(a, mode="test") == []
