"""Workflows against the real PostgreSQL and Redis, advanced in this process (the e2e file runs real workers).

Definitions and their validation, versioning, triggering, conditions, delays, digests, throttles, cancel and
the reasons every step records.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.status import transition
from notifier.workflows.models import WorkflowDigest, WorkflowRun, WorkflowStep
from notifier.workflows.services import runs_advance, runs_wake
from preferences.services import recipient_upsert
from templates_app.services import template_put
from tests.deliveries.test_frequency_cap import redis_down  # noqa: F401 - the fixture

CONTENT = {
    "en": {
        "inapp": {"title": "New comment", "body": "{{ author }} commented"},
        "email": {"subject": "New comment", "text": "{{ author }} commented"},
    }
}
# What a step after a digest renders: digest.count and each merged trigger's payload.
DIGEST_CONTENT = {
    "en": {
        "email": {
            "subject": "{{ digest.count }} new comments",
            "text": "{% for e in digest.events %}{{ e.author }};{% endfor %}",
        }
    }
}
EXAMPLE: list[Any] = [
    {"id": "inapp", "type": "send", "channel": "inapp", "template": "comment_added"},
    {"id": "wait", "type": "delay", "seconds": 1},
    {"id": "mail", "type": "send", "channel": "email", "template": "comment_added",
     "if": {"step": "inapp", "status_not_in": ["opened"]}},
]  # fmt: skip


@pytest.fixture
def setup(db: None) -> None:
    template_put(key="comment_added", category="transactional", default_locale="en", content=CONTENT)
    template_put(key="comment_digest", category="transactional", default_locale="en", content=DIGEST_CONTENT)
    template_put(
        key="promo", category="marketing", default_locale="en", content={"en": {"email": {"subject": "x", "text": "y"}}}
    )
    recipient_upsert(user_id="wf-1", email="wf-1@example.com")


def _put(api: Any, key: str, steps: list[Any], category: str = "transactional") -> Any:
    return api.put(f"/api/v1/workflows/{key}", {"category": category, "steps": steps}, format="json")


def _trigger(api: Any, workflow: str, user: str = "wf-1", **extra: Any) -> dict[str, Any]:
    response = api.post(
        "/api/v1/notifications", {"recipient": {"user_id": user}, "workflow": workflow, **extra}, format="json"
    )
    assert response.status_code == 202, response.content
    return response.json()


def _run(notification_id: str) -> WorkflowRun:
    return WorkflowRun.objects.get(notification_id=notification_id)


def _advance(notification_id: str) -> WorkflowRun:
    run = _run(notification_id)
    runs_advance(run_ids=[run.pk])
    return _run(notification_id)


def _steps(api: Any, notification_id: str) -> list[dict[str, Any]]:
    return api.get(f"/api/v1/notifications/{notification_id}").json()["steps"]


# --- definitions ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("setup")
@pytest.mark.parametrize(
    ("steps", "field", "words"),
    [
        ([{"id": "a", "type": "teleport"}], "steps[0].type", "step 'a': unknown step type 'teleport'"),
        ([{"id": "a", "type": "send", "channel": "email", "template": "nope"}], "steps[0].template",
         "step 'a': unknown template 'nope'"),
        ([{"id": "a", "type": "send", "channel": "pigeon", "template": "comment_added"}], "steps[0].channel",
         "step 'a': unknown channel 'pigeon'"),
        ([{"id": "a", "type": "send", "channel": "sms", "template": "comment_added"}], "steps[0].channel",
         "no content for channel(s) sms"),
        ([{"id": "a", "type": "send", "channel": "email", "template": "promo"}], "steps[0].template",
         "of category 'marketing'"),
        ([{"id": "a", "type": "delay", "seconds": 5, "if": {"step": "ghost", "status_in": ["sent"]}}],
         "steps[0].if.step", "step 'a': its condition refers to unknown step 'ghost'"),
        ([{"id": "a", "type": "delay", "seconds": 5, "if": {"step": "b", "status_in": ["sent"]}},
          {"id": "b", "type": "send", "channel": "email", "template": "comment_added"}], "steps[0].if.step",
         "step 'a': its condition refers to step 'b', which does not come before it (a cycle)"),
        ([{"id": "a", "type": "send", "channel": "email", "template": "comment_added",
           "if": {"step": "a", "status_in": ["sent"]}}], "steps[0].if.step", "(a cycle)"),
        ([{"id": "a", "type": "delay"}], "steps[0].seconds", "step 'a': give exactly one of"),
        ([{"id": "a", "type": "throttle", "max": 0, "per_seconds": 60}], "steps[0].max", "step 'a': 'max'"),
        ([{"id": "a", "type": "digest", "window_seconds": 60, "key": "{{ x | upper }}"}], "steps[0].key", "step 'a'"),
    ],
)  # fmt: skip
def test_invalid_definitions_are_400_naming_the_step(api: Any, steps: list[Any], field: str, words: str) -> None:
    response = _put(api, "bad", steps)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert words in error["message"]
    assert field in error["fields"]
    assert api.get("/api/v1/workflows/bad").status_code == 404


@pytest.mark.django_db
@pytest.mark.usefixtures("setup")
def test_a_workflow_key_past_128_characters_is_a_400_naming_it(api: Any) -> None:
    long_key = "k" * 129
    put = _put(api, long_key, EXAMPLE)
    assert put.status_code == 400, put.content
    assert put.json()["error"]["fields"] == {"key": ["must be 1-128 letters, digits, '-' or '_'"]}
    assert api.get(f"/api/v1/workflows/{long_key}").status_code == 404
    for workflow in (long_key, f"{long_key}@1"):
        body = {"recipient": {"user_id": "wf-1"}, "workflow": workflow}
        send = api.post("/api/v1/notifications", body, format="json")
        assert send.status_code == 400, send.content
        assert list(send.json()["error"]["fields"]) == ["workflow"]
        assert "Expected a workflow key" in send.json()["error"]["fields"]["workflow"][0]
    # At 128 it is a key like any other.
    assert _put(api, "k" * 128, EXAMPLE).status_code == 201


@pytest.mark.django_db
@pytest.mark.usefixtures("setup")
def test_versions_are_kept_and_a_run_keeps_its_version(api: Any) -> None:
    first = _put(api, "comment_added", EXAMPLE)
    assert first.status_code == 201 and first.json()["version"] == 1
    body = _trigger(api, "comment_added", payload={"author": "ann"})
    assert (body["workflow"], body["workflow_version"]) == ("comment_added", 1)
    assert [s["status"] for s in body["steps"]] == ["pending", "pending", "pending"]
    second = _put(api, "comment_added", EXAMPLE[:1])
    assert second.json()["version"] == 2
    read = api.get("/api/v1/workflows/comment_added").json()
    assert read["latest_version"] == 2 and read["versions"] == [2, 1] and len(read["steps"]) == 1
    assert [w["key"] for w in api.get("/api/v1/workflows").json()["results"]] == ["comment_added"]
    # The run started on version 1 goes on with its three steps.
    _advance(body["id"])
    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    assert detail["workflow_version"] == 1 and len(detail["steps"]) == 3
    assert _trigger(api, "comment_added@1")["workflow_version"] == 1
    assert _trigger(api, "comment_added")["workflow_version"] == 2


@pytest.mark.django_db
@pytest.mark.usefixtures("setup")
def test_trigger_refuses_what_the_workflow_decides_and_unknown_workflows(api: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    both = api.post("/api/v1/notifications", {"recipient": {"user_id": "wf-1"}, "workflow": "comment_added",
                                             "channels": ["email"]}, format="json")  # fmt: skip
    assert both.status_code == 400 and "channels" in both.json()["error"]["fields"]
    unknown = api.post("/api/v1/notifications", {"recipient": {"user_id": "wf-1"}, "workflow": "nope"}, format="json")
    assert unknown.status_code == 400 and "workflow" in unknown.json()["error"]["fields"]


# --- steps -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_read_in_time_skips_the_email_with_the_reason(api: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    body = _trigger(api, "comment_added", payload={"author": "ann"})
    run = _advance(body["id"])
    assert (run.status, run.step_index) == ("waiting", 1)
    steps = _steps(api, body["id"])
    assert steps[0]["status"] == "done" and steps[0]["reason"] == "sent: inapp queued"
    assert steps[0]["deliveries"][0]["channel"] == "inapp"
    assert steps[1]["status"] == "waiting" and steps[1]["reason"].startswith("delay 1s: waiting until")
    inapp = Delivery.objects.get(pk=steps[0]["deliveries"][0]["id"])
    transition([inapp.pk], to="opened", detail="read")
    assert runs_advance(run_ids=[run.pk]) == {"not_due": 1}  # the delay has not passed
    time.sleep(1.1)
    assert _advance(body["id"]).status == "done"
    steps = _steps(api, body["id"])
    assert steps[1]["status"] == "done"
    assert steps[2]["status"] == "skipped"
    assert "if inapp status_not_in ['opened']" in steps[2]["reason"] and steps[2]["reason"].endswith("-> false")
    assert not Delivery.objects.filter(channel="email").exists()
    # A duplicated message repeats nothing.
    assert runs_advance(run_ids=[run.pk, run.pk]) == {"skipped": 1}
    assert WorkflowStep.objects.filter(run=run).count() == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_not_read_sends_the_email_after_the_delay(api: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    body = _trigger(api, "comment_added", payload={"author": "ann"})
    _advance(body["id"])
    time.sleep(1.1)
    assert _advance(body["id"]).status == "done"
    steps = _steps(api, body["id"])
    assert steps[2]["status"] == "done" and steps[2]["reason"].endswith("-> true; sent: email queued")
    email = Delivery.objects.get(channel="email")
    assert email.address == "wf-1@example.com" and email.status == "queued"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_a_condition_on_a_payload_field(api: Any) -> None:
    _put(api, "vip", [
        {"id": "mail", "type": "send", "channel": "email", "template": "comment_added",
         "if": {"payload": "tier", "equals": "gold"}},
        {"id": "bell", "type": "send", "channel": "inapp", "template": "comment_added",
         "if": {"payload": "muted", "exists": False}},
    ])  # fmt: skip
    gold = _trigger(api, "vip", payload={"author": "a", "tier": "gold", "muted": True})
    plain = _trigger(api, "vip", payload={"author": "b", "tier": "tin"})
    _advance(gold["id"])
    _advance(plain["id"])
    g, p = _steps(api, gold["id"]), _steps(api, plain["id"])
    assert [s["status"] for s in g] == ["done", "skipped"]
    assert g[0]["reason"] == "if payload.tier equals 'gold': 'gold' -> true; sent: email queued"
    assert g[1]["reason"] == "if payload.muted exists is False: True -> false"
    assert [s["status"] for s in p] == ["skipped", "done"]
    assert p[0]["reason"] == "if payload.tier equals 'gold': 'tin' -> false"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_throttle_beyond_max_ends_the_run_throttled(api: Any) -> None:
    _put(api, "capped", [
        {"id": "cap", "type": "throttle", "max": 3, "per_seconds": 3600},
        {"id": "mail", "type": "send", "channel": "email", "template": "comment_added"},
    ])  # fmt: skip
    ids = [_trigger(api, "capped", payload={"author": str(i)})["id"] for i in range(5)]
    runs_advance(run_ids=[_run(i).pk for i in ids])
    statuses = [_run(i).status for i in ids]
    assert statuses == ["done", "done", "done", "throttled", "throttled"]
    assert Delivery.objects.filter(channel="email").count() == 3
    last = _steps(api, ids[-1])
    assert last[0] == {**last[0], "status": "throttled", "reason": "throttle: 3 runs already, at most 3 per 3600s"}
    assert last[1]["status"] == "skipped" and last[1]["reason"] == "run ended throttled"
    assert _steps(api, ids[1])[0]["reason"] == "throttle: run 2 of at most 3 per 3600s"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
@pytest.mark.usefixtures("redis_down")
def test_throttle_counts_in_the_database_without_redis(api: Any) -> None:
    _put(api, "capped", [{"id": "cap", "type": "throttle", "max": 2, "per_seconds": 3600}])
    ids = [_trigger(api, "capped")["id"] for _ in range(3)]
    runs_advance(run_ids=[_run(i).pk for i in ids])
    assert [_run(i).status for i in ids] == ["done", "done", "throttled"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_digest_merges_triggers_of_one_key_and_the_leader_sends_them_all(api: Any) -> None:
    _put(api, "thread", [
        {"id": "daily", "type": "digest", "window_seconds": 1, "key": "{{ thread_id }}"},
        {"id": "mail", "type": "send", "channel": "email", "template": "comment_digest"},
    ])  # fmt: skip
    ids = [_trigger(api, "thread", payload={"thread_id": "t1", "author": f"a{i}"})["id"] for i in range(4)]
    other = _trigger(api, "thread", payload={"thread_id": "t2", "author": "z"})["id"]
    runs_advance(run_ids=[_run(i).pk for i in [*ids, other]])
    assert [_run(i).status for i in ids] == ["waiting", "merged", "merged", "merged"]
    assert _run(other).status == "waiting"
    merged = _steps(api, ids[1])[0]
    assert merged["status"] == "merged" and f"joined the digest of run {_run(ids[0]).pk}" in merged["reason"]
    time.sleep(1.1)
    runs_advance(run_ids=[_run(ids[0]).pk, _run(other).pk])
    leader = _run(ids[0])
    digest: Any = leader.digest
    assert leader.status == "done" and digest["count"] == 4
    assert [e["author"] for e in digest["events"]] == ["a0", "a1", "a2", "a3"]
    assert _steps(api, ids[0])[0]["reason"] == "digest 't1': window closed with 4 events"
    assert Delivery.objects.filter(channel="email").count() == 2
    child = Notification.objects.get(pk=_steps(api, ids[0])[1]["notification_id"])
    assert child.payload["digest"]["count"] == 4
    # A trigger after the window opens a new digest.
    late = _trigger(api, "thread", payload={"thread_id": "t1", "author": "late"})["id"]
    runs_advance(run_ids=[_run(late).pk])
    assert _run(late).status == "waiting"
    assert WorkflowDigest.objects.filter(key="t1").count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_cancel_in_the_middle_of_a_delay(api: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    body = _trigger(api, "comment_added", payload={"author": "ann"})
    run = _advance(body["id"])
    assert run.status == "waiting"
    answer = api.post(f"/api/v1/notifications/{body['id']}/cancel")
    assert answer.status_code == 200 and answer.json()["cancelled"] == 1
    time.sleep(1.1)
    assert runs_wake() == 0  # nothing is due any more
    assert runs_advance(run_ids=[run.pk]) == {"skipped": 1}
    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    assert detail["run_status"] == "cancelled"
    assert [s["status"] for s in detail["steps"]] == ["done", "cancelled", "cancelled"]
    assert detail["steps"][1]["reason"] == "cancelled by client"
    assert not Delivery.objects.filter(channel="email").exists()
    # The in-app delivery it had queued and not yet sent is cancelled too.
    assert Delivery.objects.get(channel="inapp").status == "cancelled"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_the_wake_relay_publishes_due_runs_once_and_again_when_stale(api: Any, settings: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    body = _trigger(api, "comment_added", payload={"author": "ann"})
    run = _advance(body["id"])
    assert runs_wake() == 0  # waiting, not due
    time.sleep(1.1)
    assert runs_wake() == 1
    assert runs_wake() == 0  # its message is on the way
    settings.WORKFLOW_REPUBLISH_AFTER_SECONDS = 0
    time.sleep(0.05)
    assert runs_wake() == 1  # ... or lost: published again, harmlessly
    assert _run(body["id"]).pk == run.pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_compliance_applies_to_send_steps(api: Any) -> None:
    recipient_upsert(user_id="wf-noemail")
    _put(api, "mailonly", [{"id": "mail", "type": "send", "channel": "email", "template": "comment_added"}])
    body = _trigger(api, "mailonly", user="wf-noemail", payload={"author": "x"})
    _advance(body["id"])
    step = _steps(api, body["id"])[0]
    assert step["reason"] == "sent: email suppressed (no_address)"
    assert step["deliveries"][0]["status"] == "suppressed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
@pytest.mark.parametrize(
    ("fields", "suppressed", "reason"),
    [
        ({"email": "out@example.com", "opted_out": True}, False, "opted_out"),
        ({"email": "listed@example.com"}, True, "suppressed"),
        ({"email": "off@example.com", "channel_prefs": {"email": False}}, False, "channel_disabled"),
    ],
    ids=["opted-out", "suppression-list", "channel-disabled"],
)
def test_preferences_and_the_suppression_list_apply_to_send_steps(
    api: Any, fields: dict[str, Any], suppressed: bool, reason: str
) -> None:
    """A workflow's send step is held by what holds any send of its category (here an optional one)."""
    from preferences.services import suppression_add

    template_put(key="weekly_tips", category="marketing", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="wf-held", **fields)
    if suppressed:
        suppression_add(channel="email", address=fields["email"], source="complaint")
    _put(api, "mailonly", [{"id": "mail", "type": "send", "channel": "email", "template": "weekly_tips"}], "marketing")
    body = _trigger(api, "mailonly", user="wf-held", payload={"author": "x"})
    _advance(body["id"])
    step = _steps(api, body["id"])[0]
    assert step["reason"] == f"sent: email suppressed ({reason})"
    assert step["deliveries"][0]["status"] == "suppressed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_quiet_hours_defer_a_send_step(api: Any) -> None:
    """A send step inside the recipient's quiet hours waits for their end, as any optional send does."""
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    start, end = (now - timedelta(hours=1)).time().replace(microsecond=0), (now + timedelta(hours=1)).time()
    template_put(key="weekly_tips", category="marketing", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="wf-night", email="night@example.com", timezone="UTC", quiet_start=start, quiet_end=end)
    _put(api, "mailonly", [{"id": "mail", "type": "send", "channel": "email", "template": "weekly_tips"}], "marketing")
    body = _trigger(api, "mailonly", user="wf-night", payload={"author": "x"})
    _advance(body["id"])
    delivery = _steps(api, body["id"])[0]["deliveries"][0]
    assert (delivery["status"], delivery["reason"]) == ("deferred", "quiet_hours")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_the_admin_shows_a_runs_steps_with_their_reasons_and_the_versions(api: Any, staff: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    body = _trigger(api, "comment_added", payload={"author": "ann"})
    run = _advance(body["id"])
    page = staff.get(f"/admin/workflows/workflowrun/{run.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "sent: inapp queued" in html and "delay 1s: waiting until" in html
    assert "<td>mail</td><td>send</td><td>pending</td>" in html
    listing = staff.get("/admin/workflows/workflowrun/?q=wf-1")
    assert listing.status_code == 200 and f">{run.pk}<" in listing.content.decode()
    workflow = staff.get("/admin/workflows/workflow/")
    assert workflow.status_code == 200 and "comment_added" in workflow.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_delays_until_a_payload_time_and_until_a_local_time_of_the_recipient(api: Any) -> None:
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo

    recipient_upsert(user_id="wf-tokyo", timezone="Asia/Tokyo")
    _put(api, "timed", [
        {"id": "at", "type": "delay", "until": "remind_at"},
        {"id": "morning", "type": "delay", "until_local": "09:00"},
    ])  # fmt: skip
    soon = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    body = _trigger(api, "timed", user="wf-tokyo", payload={"remind_at": soon.isoformat()})
    run = _advance(body["id"])
    assert run.status == "waiting" and run.wake_at == soon
    WorkflowRun.objects.filter(pk=run.pk).update(wake_at=datetime.now(UTC) - timedelta(seconds=1))
    run = _advance(body["id"])
    assert run.step_index == 1 and run.status == "waiting"
    wake_at: Any = run.wake_at
    local = wake_at.astimezone(ZoneInfo("Asia/Tokyo"))
    assert (local.hour, local.minute) == (9, 0)
    assert timedelta(0) < wake_at - datetime.now(UTC) <= timedelta(days=1)
    assert _steps(api, body["id"])[1]["reason"].startswith("delay until 09:00 in Asia/Tokyo: waiting until")
    # A payload time that is absent or past does not wait, and says so.
    past = _trigger(api, "timed", user="wf-tokyo", payload={"remind_at": "2020-01-01T00:00:00Z"})
    _advance(past["id"])
    assert _steps(api, past["id"])[0]["reason"].endswith("already passed")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_a_repeated_trigger_is_the_same_notification_and_starts_no_second_run(api: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    first = _trigger(api, "comment_added", dedup_key="c-1", payload={"author": "ann"})
    again = api.post(
        "/api/v1/notifications",
        {
            "recipient": {"user_id": "wf-1"},
            "workflow": "comment_added",
            "dedup_key": "c-1",
            "payload": {"author": "ann"},
        },
        format="json",
    )
    assert again.status_code == 200 and again.json()["id"] == first["id"] and again.json()["duplicate"] is True
    other = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "wf-1"}, "workflow": "comment_added", "dedup_key": "c-1", "payload": {"author": "x"}},
        format="json",
    )
    assert other.status_code == 409
    assert WorkflowRun.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_a_batch_runs_workflow_items_alongside_template_items_each_failing_alone(api: Any) -> None:
    _put(api, "comment_added", EXAMPLE)
    items = [
        {"recipient": {"user_id": "wf-1"}, "workflow": "comment_added", "payload": {"author": "a"}},
        {"recipient": {"user_id": "wf-1"}, "template": "comment_added", "payload": {"author": "b"}},
        {"recipient": {"user_id": "wf-1"}, "workflow": "missing"},
    ]
    results = api.post("/api/v1/notifications/batch", {"notifications": items}, format="json").json()["results"]
    assert [r["status"] for r in results] == [202, 202, 400]
    assert WorkflowRun.objects.get().notification_id.hex == results[0]["id"].replace("-", "")
    assert "workflow" in results[2]["error"]["fields"]
