"""Daily quotas per channel of a project environment, and the project's rate limit over all of its keys.

Against the real Redis and PostgreSQL, through the API: the quota's edge (the last allowed send passes, the next is
429 `quota_exceeded` naming the channel, with Retry-After until midnight UTC), a batch item over the quota failing
alone, a topic send counting its subscribers, the next day's reset with a clock the test sets, GET /api/v1/project,
concurrent takes never overshooting, the per-process share while Redis is down, and the admin.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from notifier.deliveries.models import Notification
from notifier.workflows.models import WorkflowRun, WorkflowStep
from notifier.workflows.services import runs_advance
from preferences.services import topic_subscribe, topic_upsert
from projects import quotas
from projects.models import Environment, Project
from projects.quotas import DailyQuotas
from projects.scoping import owner_scope
from projects.services import project_create
from templates_app.services import template_put
from tests.factories import make_staff_user

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}, "sms": {"text": "Hi {{ name }}"}}}
SEND = "/api/v1/notifications"
BATCH = "/api/v1/notifications/batch"
# 23:00 UTC: an hour before the reset.
EVENING = datetime(2031, 3, 4, 23, 0, tzinfo=UTC)


class SetClock:
    """The quotas' clock, set by the test (`clock.now = ...`)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SetClock:
    found = SetClock(EVENING)
    monkeypatch.setattr(quotas.daily, "clock", found)
    return found


@pytest.fixture
def shop(db: None) -> Project:
    """A project with the template `hello` in both environments (sends here publish nothing: their transaction
    is the test's, rolled back, so no after-commit publish runs)."""
    project = project_create(slug="shop", name="Shop")
    for environment in project.environments.all():
        with owner_scope(environment.pk):
            template_put(key="hello", category="transactional", default_locale="en", content=CONTENT)
    return project


def set_quotas(project: Project, quotas_: dict[str, int], name: str = "live") -> Environment:
    environment = project.environments.get(name=name)
    environment.quotas = quotas_
    environment.save()  # as the admin does: every process's cached settings are dropped
    return environment


def send(user_id: str, channels: list[str], **extra: Any) -> dict[str, Any]:
    return {"recipient": {"user_id": user_id}, "template": "hello", "channels": channels, "payload": {}, **extra}


def test_the_last_allowed_send_passes_and_the_next_is_429_until_midnight(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    set_quotas(shop, {"email": 3, "sms": 100})
    _, http = api_client_factory(project="shop")
    for n in range(3):
        answer = http.post(SEND, send(f"u-{n}", ["email", "sms"], dedup_key=f"k-{n}"), format="json")
        assert answer.status_code == 202, answer.content

    refused = http.post(SEND, send("u-9", ["email", "sms"]), format="json")

    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert refused.json()["error"]["fields"] == {"channel": ["email"]}
    assert refused["Retry-After"] == "3600"  # 23:00 to midnight UTC
    # Nothing of the refused send was written, and its SMS was not counted.
    assert Notification.objects.filter(user_id="u-9").count() == 0
    # Another channel still has room; a retry of an accepted send is its duplicate, not a new message.
    assert http.post(SEND, send("u-9", ["sms"]), format="json").status_code == 202
    again = http.post(SEND, send("u-0", ["email", "sms"], dedup_key="k-0"), format="json")
    assert again.status_code == 200 and again.json()["duplicate"] is True

    project = http.get("/api/v1/project").json()
    assert project == {
        "slug": "shop",
        "name": "Shop",
        "environment": "live",
        "quotas": {
            "email": {"limit": 3, "used": 3, "resets_at": "2031-03-05T00:00:00Z"},
            "sms": {"limit": 100, "used": 4, "resets_at": "2031-03-05T00:00:00Z"},
        },
        "promotion": "direct",
    }


def test_the_quota_resets_the_next_utc_day(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    set_quotas(shop, {"email": 1})
    _, http = api_client_factory(project="shop")
    assert http.post(SEND, send("u-1", ["email"]), format="json").status_code == 202
    assert http.post(SEND, send("u-2", ["email"]), format="json").status_code == 429

    clock.now = EVENING + timedelta(hours=1, seconds=1)  # 00:00:01 the next day

    assert http.post(SEND, send("u-2", ["email"]), format="json").status_code == 202
    refused = http.post(SEND, send("u-3", ["email"]), format="json")
    assert refused.status_code == 429 and refused["Retry-After"] == str(24 * 3600 - 1)
    assert http.get("/api/v1/project").json()["quotas"]["email"] == {
        "limit": 1,
        "used": 1,
        "resets_at": "2031-03-06T00:00:00Z",
    }


def test_a_batch_item_over_the_quota_fails_alone(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    set_quotas(shop, {"email": 2})
    _, http = api_client_factory(project="shop")
    items = [send("u-1", ["email"]), send("u-2", ["email"]), send("u-3", ["email"]), send("u-4", ["sms"])]

    answer = http.post(BATCH, {"notifications": items}, format="json")

    assert answer.status_code == 200, answer.content
    results = answer.json()["results"]
    assert [r["status"] for r in results] == [202, 202, 429, 202]
    assert results[2]["error"]["code"] == "quota_exceeded"
    assert results[2]["error"]["fields"] == {"channel": ["email"]}
    assert sorted(Notification.objects.values_list("user_id", flat=True)) == ["u-1", "u-2", "u-4"]
    assert http.get("/api/v1/project").json()["quotas"]["email"]["used"] == 2


def test_a_topic_send_counts_its_subscribers(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    live = set_quotas(shop, {"email": 5})
    with owner_scope(live.pk):
        topic, _ = topic_upsert(key="news", name="News")
        topic_subscribe(topic=topic, user_ids=["a", "b", "c"])
    _, http = api_client_factory(project="shop")
    to_topic = {"topic": "news", "template": "hello", "channels": ["email"], "payload": {}}

    assert http.post(SEND, to_topic, format="json").status_code == 202
    assert http.get("/api/v1/project").json()["quotas"]["email"]["used"] == 3
    refused = http.post(SEND, to_topic, format="json")  # 3 more would make 6 of 5
    assert refused.status_code == 429 and refused.json()["error"]["fields"] == {"channel": ["email"]}
    assert Notification.objects.filter(topic__key="news").count() == 1
    # The two messages left are still there for single sends.
    assert [http.post(SEND, send(u, ["email"]), format="json").status_code for u in ("x", "y", "z")] == [
        202,
        202,
        429,
    ]


def test_each_environment_counts_its_own(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    set_quotas(shop, {"email": 1})
    _, live = api_client_factory(project="shop")
    _, test = api_client_factory(project="shop", mode="test")
    assert live.post(SEND, send("u-1", ["email"]), format="json").status_code == 202
    assert live.post(SEND, send("u-2", ["email"]), format="json").status_code == 429
    # The test environment has no quota (and the live one's count is not its own).
    assert [test.post(SEND, send(u, ["email"]), format="json").status_code for u in ("a", "b")] == [202, 202]
    assert test.get("/api/v1/project").json()["quotas"] == {}
    assert test.get("/api/v1/project").json()["environment"] == "test"


def test_quotas_cost_the_accept_no_query(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    _, http = api_client_factory(project="shop")
    http.post(SEND, send("warm", ["email"]), format="json")  # caches the client, the template, the settings

    with CaptureQueriesContext(connection) as without:
        assert http.post(SEND, send("u-1", ["email"]), format="json").status_code == 202
    set_quotas(shop, {"email": 100})
    http.post(SEND, send("warm-again", ["email"]), format="json")  # the save dropped the caches
    with CaptureQueriesContext(connection) as with_quota:
        assert http.post(SEND, send("u-2", ["email"]), format="json").status_code == 202

    assert len(with_quota) == len(without), [q["sql"] for q in with_quota]


def test_concurrent_takes_never_overshoot(db: None, clock: SetClock) -> None:
    counter = DailyQuotas()
    counter.clock = clock
    granted: list[int] = []
    lock = threading.Lock()

    def taker() -> None:
        mine = 0
        for _ in range(10):
            (refused,), _taken = counter.take(991, {"email": 57}, [{"email": 1}])
            mine += refused is None
        with lock:
            granted.append(mine)

    threads = [threading.Thread(target=taker) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(granted) == 57  # of 120 asked
    assert counter.usage(991, {"email": 57})["email"].used == 57


def test_a_refund_gives_back_what_was_counted(db: None, clock: SetClock) -> None:
    counter = DailyQuotas()
    counter.clock = clock
    answers, taken = counter.take(992, {"email": 2, "sms": 9}, [{"email": 1, "sms": 1}, {"email": 2}])
    assert [a is None for a in answers] == [True, False]  # the second would make 3 of 2
    assert answers[1] is not None and answers[1].fields == {"channel": ["email"]}
    counter.refund(taken)
    assert {c: u.used for c, u in counter.usage(992, {"email": 2, "sms": 9}).items()} == {"email": 0, "sms": 0}


def test_redis_down_each_process_allows_its_share_of_what_was_left(db: None, clock: SetClock, settings: Any) -> None:
    settings.RESILIENCE_ASSUMED_WORKERS = 4
    dead = redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.2)
    target: dict[str, redis.Redis | None] = {"client": None}
    counter = DailyQuotas(lambda: target["client"] or redis.Redis.from_url(settings.REDIS_URL))
    counter.clock = clock
    limits = {"email": 12}
    answers, _ = counter.take(993, limits, [{"email": 1}] * 4)
    assert all(a is None for a in answers)  # 4 of 12 counted in Redis

    target["client"] = dead
    answers, _ = counter.take(993, limits, [{"email": 1}] * 3)

    # 8 were left; this process's share is 2 of them.
    assert [a is None for a in answers] == [True, True, False]
    assert counter.usage(993, limits)["email"].used == 6


def test_the_project_rate_limit_is_shared_by_all_of_its_keys(
    shop: Project, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    shop.rate_limit = "3/h"
    shop.save()
    _, live = api_client_factory(project="shop")
    _, test = api_client_factory(project="shop", mode="test")
    _, elsewhere = api_client_factory()

    codes = [live.get(SEND).status_code, test.get(SEND).status_code, live.get(SEND).status_code]
    refused = test.get(SEND)

    assert codes == [200, 200, 200]
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1000  # one token per 1,200 s
    assert live.get(SEND).status_code == 429
    assert elsewhere.get(SEND).status_code == 200  # another project has its own (none)


def test_the_project_endpoint_needs_a_key_and_the_send_scope(
    shop: Project, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    _, http = api_client_factory(project="shop", scopes=["templates"])
    assert http.get("/api/v1/project").status_code == 403
    assert Client().get("/api/v1/project").status_code == 401
    shop.promotion = Project.Promotion.REQUIRED
    shop.save()
    _, sender = api_client_factory(project="shop")
    assert sender.get("/api/v1/project").json()["promotion"] == "required"


def test_the_admin_edits_an_environments_quotas_and_checks_them(shop: Project) -> None:
    staff = Client()
    staff.force_login(make_staff_user("root", superuser=True))
    url = reverse("admin:projects_project_change", args=[shop.pk])
    form = staff.get(url).context["adminform"].form
    environments = list(shop.environments.order_by("pk"))
    data: dict[str, Any] = {
        **{name: value for name, value in form.initial.items() if name in form.fields and value is not None},
        "provider_accounts": "{}",
        "rate_limit": "",
        "environments-TOTAL_FORMS": "2",
        "environments-INITIAL_FORMS": "2",
        "environments-MIN_NUM_FORMS": "0",
        "environments-MAX_NUM_FORMS": "2",
        "memberships-TOTAL_FORMS": "0",
        "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
    }
    for n, environment in enumerate(environments):
        data[f"environments-{n}-id"] = str(environment.pk)
        data[f"environments-{n}-project"] = str(shop.pk)
        data[f"environments-{n}-quotas"] = "{}"
    live_index = next(n for n, e in enumerate(environments) if e.name == "live")

    bad = staff.post(url, {**data, f"environments-{live_index}-quotas": '{"email": -1, "fax": 3}'})
    assert bad.status_code == 200
    assert "Unknown channel(s): fax" in bad.content.decode()
    slow = staff.post(url, {**data, "rate_limit": "fast"})
    assert slow.status_code == 200 and "is not a rate" in slow.content.decode()

    saved = staff.post(url, {**data, "rate_limit": "50/s", f"environments-{live_index}-quotas": '{"sms": 500}'})

    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else saved
    assert Environment.objects.get(pk=environments[live_index].pk).quotas == {"sms": 500}
    assert Project.objects.get(pk=shop.pk).rate_limit == "50/s"


def test_a_workflows_send_step_counts_when_it_runs_and_fails_over_the_quota(
    shop: Project, clock: SetClock, api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    set_quotas(shop, {"email": 1})
    _, http = api_client_factory(project="shop")
    steps = [{"id": "mail", "type": "send", "channel": "email", "template": "hello"}]
    put = http.put("/api/v1/workflows/greet", {"category": "transactional", "steps": steps}, format="json")
    assert put.status_code == 201, put.content
    triggers = [
        http.post(SEND, {"recipient": {"user_id": u}, "workflow": "greet"}, format="json") for u in ("w-1", "w-2")
    ]
    assert [t.status_code for t in triggers] == [202, 202]  # a trigger itself sends nothing yet
    runs = [WorkflowRun.objects.get(notification_id=t.json()["id"]) for t in triggers]

    runs_advance(run_ids=[run.pk for run in runs])

    first, second = (WorkflowStep.objects.get(run=run, step_id="mail") for run in runs)
    assert first.status == WorkflowStep.Status.DONE
    assert second.status == WorkflowStep.Status.FAILED and "daily quota" in second.reason
    assert http.get("/api/v1/project").json()["quotas"]["email"]["used"] == 1
