"""Workflows end to end: the real API, PostgreSQL, RabbitMQ, Redis, Celery workers and a real beat (the relay).

The contract's example both ways, a delay across a worker SIGKILL and a broker restart, the digest race, two
triggers of one digest key read back from the sandbox API, a topic trigger. The broker restart is every
connection to this namespace's vhost closed and every message in it purged, which is what a broker losing its
state looks like to us, without touching the machine's RabbitMQ that other runs share (nor deleting the vhost:
RabbitMQ 3.10 has wedged when vhosts were deleted and created again).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery
from notifier.workflows.models import WorkflowRun, WorkflowStep
from preferences.services import recipient_upsert, topic_subscribe, topic_upsert
from templates_app.services import template_put
from tests.campaigns.test_campaigns import BEAT
from tests.conftest import VHOST, bearer_client, purge_all_queues, rabbitmqctl, wait_for
from tests.workflows.test_workflows import CONTENT, DIGEST_CONTENT
from tests.workflows.test_workflows import EXAMPLE as SHORT_EXAMPLE

# The contract's example with a 2 s delay.
EXAMPLE: list[Any] = [{**step, "seconds": 2} if step["type"] == "delay" else step for step in SHORT_EXAMPLE]
QUEUES = ["inapp.high", "inapp.low", "email.high", "email.low", "maintenance", "fanout"]
# Beat wakes workflows every second and re-publishes a run whose message is 3 s old and unanswered.
ENV = {"WORKFLOW_WAKE_INTERVAL_SECONDS": "1", "WORKFLOW_REPUBLISH_AFTER_SECONDS": "3",
       "OUTBOX_RELAY_INTERVAL_SECONDS": "2", "OUTBOX_REPUBLISH_AFTER_SECONDS": "3"}  # fmt: skip


@pytest.fixture
def setup(db: None, api: Any) -> None:
    template_put(key="comment_added", category="transactional", default_locale="en", content=CONTENT)
    template_put(key="comment_digest", category="transactional", default_locale="en", content=DIGEST_CONTENT)
    recipient_upsert(user_id="e2e-1", email="e2e-1@example.com")
    response = api.put(
        "/api/v1/workflows/comment_added", {"category": "transactional", "steps": EXAMPLE}, format="json"
    )
    assert response.status_code == 201


@pytest.fixture
def machinery(start_worker: Any, start_process: Any) -> dict[str, Any]:
    worker = start_worker(queues=QUEUES, env=ENV, concurrency=2)
    beat = start_process("beat", BEAT, ENV)
    return {"worker": worker, "beat": beat}


def _trigger(api: Any, user: str = "e2e-1", workflow: str = "comment_added", **extra: Any) -> dict[str, Any]:
    response = api.post(
        "/api/v1/notifications", {"recipient": {"user_id": user}, "workflow": workflow, **extra}, format="json"
    )
    assert response.status_code == 202, response.content
    return response.json()


def _steps(api: Any, notification_id: str) -> list[dict[str, Any]]:
    return api.get(f"/api/v1/notifications/{notification_id}").json()["steps"]


def _run_status(notification_id: str) -> str:
    return WorkflowRun.objects.get(notification_id=notification_id).status


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup", "machinery")
def test_read_in_time_skips_the_email_and_not_read_sends_it_after_the_delay(api: Any) -> None:
    read = _trigger(api, payload={"author": "ann"})
    unread = _trigger(api, payload={"author": "bob"})
    # The in-app message arrives; one of the two is read within the delay (the inbox API moves it to opened).
    inapp = wait_for(
        lambda: Delivery.objects.filter(
            channel="inapp", status="sent", notification_id=_child(api, read["id"])
        ).first(),
        30,
    )
    answer = api.post(f"/api/v1/recipients/e2e-1/inbox/{inapp.pk}/read")
    assert answer.status_code in (200, 204), answer.content
    wait_for(lambda: _run_status(read["id"]) == "done" and _run_status(unread["id"]) == "done", 60)
    read_steps, unread_steps = _steps(api, read["id"]), _steps(api, unread["id"])
    assert [s["status"] for s in read_steps] == ["done", "done", "skipped"]
    assert "reached [" in read_steps[2]["reason"] and "opened" in read_steps[2]["reason"]
    assert [s["status"] for s in unread_steps] == ["done", "done", "done"]
    assert unread_steps[2]["reason"].endswith("-> true; sent: email queued")
    email = wait_for(lambda: Delivery.objects.filter(channel="email", status="sent").first(), 30)
    assert SandboxMessage.objects.filter(channel="email").count() == 1
    assert str(email.notification_id) == unread_steps[2]["notification_id"]
    started = WorkflowStep.objects.get(run__notification_id=unread["id"], step_id="inapp").at
    woke = WorkflowStep.objects.get(run__notification_id=unread["id"], step_id="wait").at
    assert (woke - started).total_seconds() >= 2


def _child(api: Any, notification_id: str) -> Any:
    """Return the notification the run's first (send) step created, or None before it ran."""
    return _steps(api, notification_id)[0].get("notification_id")


def _restart_broker() -> None:
    """Drop every connection to this namespace's vhost, then every message in its queues."""
    rabbitmqctl("close_all_connections", "--vhost", VHOST, "--limit", "10000", "the test restarts the broker")
    time.sleep(1)  # the closed consumers' unacknowledged messages return to their queues, to be purged below
    # Over one AMQP connection (work, dead-letter and delayed queues): a rabbitmqctl call per queue boots an
    # Erlang VM each, a third of a second apiece.
    purge_all_queues()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup")
def test_a_delay_survives_a_worker_sigkill_and_a_broker_restart(
    api: Any, start_worker: Any, start_process: Any
) -> None:
    worker = start_worker(queues=QUEUES, env=ENV)
    beat = start_process("beat", BEAT, ENV)
    api.put("/api/v1/workflows/slow", {"category": "transactional", "steps": [
        {"id": "wait", "type": "delay", "seconds": 6},
        {"id": "mail", "type": "send", "channel": "email", "template": "comment_added"},
    ]}, format="json")  # fmt: skip
    bodies = [_trigger(api, workflow="slow", payload={"author": f"a{i}"}) for i in range(5)]
    wait_for(lambda: all(_run_status(b["id"]) == "waiting" for b in bodies), 30)
    worker.kill(signal.SIGKILL)
    worker.proc.wait(timeout=10)
    beat.stop()
    _restart_broker()  # every message in the broker is gone, every connection dropped
    time.sleep(7)  # past the delay, with nothing running
    start_worker(queues=QUEUES, env=ENV)
    start_process("beat", BEAT, ENV)
    wait_for(lambda: all(_run_status(b["id"]) == "done" for b in bodies), 90)
    wait_for(lambda: Delivery.objects.filter(channel="email", status="sent").count() == 5, 60)
    time.sleep(4)  # a re-published message (stale) changes nothing
    assert Delivery.objects.filter(channel="email").count() == 5
    assert SandboxMessage.objects.filter(channel="email").count() == 5
    for body in bodies:
        assert [s["status"] for s in _steps(api, body["id"])] == ["done", "done"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup", "machinery")
def test_fifty_racing_triggers_of_one_digest_key_send_one_email_listing_fifty(
    service: Any, two_api_processes: list[str]
) -> None:
    """Fifty triggers at once, spread over two real API processes, end in one run that sends one email of fifty."""
    from notifier.clients.services import api_client_assign_key

    raw = api_client_assign_key(client=service)
    service.save(update_fields=["key_prefix", "key_hash"])
    http = bearer_client(raw)
    response = http.put("/api/v1/workflows/thread", {"category": "transactional", "steps": [
        # Wide enough that all fifty reach the step before it closes on a loaded box (the race is the point).
        {"id": "batch", "type": "digest", "window_seconds": 6, "key": "{{ thread_id }}"},
        {"id": "mail", "type": "send", "channel": "email", "template": "comment_digest"},
    ]}, format="json")  # fmt: skip
    assert response.status_code == 201
    barrier = threading.Barrier(50)
    codes: list[int] = []

    def trigger(i: int) -> None:
        body = {
            "recipient": {"user_id": "e2e-1"},
            "workflow": "thread",
            "payload": {"thread_id": "t", "author": f"a{i}"},
        }
        request = urllib.request.Request(
            f"{two_api_processes[i % 2]}/api/v1/notifications",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
            method="POST",
        )
        barrier.wait()
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                codes.append(answer.status)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)

    threads = [threading.Thread(target=trigger, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [202] * 50
    wait_for(lambda: WorkflowRun.objects.filter(status__in=["running", "waiting"]).count() == 0, 90)
    statuses = sorted(WorkflowRun.objects.values_list("status", flat=True))
    assert statuses.count("done") == 1 and statuses.count("merged") == 49
    email = wait_for(lambda: SandboxMessage.objects.filter(channel="email").first(), 30)
    time.sleep(2)
    assert SandboxMessage.objects.filter(channel="email").count() == 1
    text = str(email.content)
    assert "50 new comments" in text
    assert all(f"a{i};" in text for i in range(50))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup", "machinery")
def test_a_topic_trigger_runs_once_per_subscriber(api: Any) -> None:
    topic, _ = topic_upsert(key="thread-watchers", name="Watchers")
    users = [f"w-{i}" for i in range(20)]
    for user in users:
        recipient_upsert(user_id=user, email=f"{user}@example.com")
    topic_subscribe(topic=topic, user_ids=users)
    api.put("/api/v1/workflows/watch", {"category": "transactional", "steps": [
        {"id": "wait", "type": "delay", "seconds": 1},
        {"id": "bell", "type": "send", "channel": "inapp", "template": "comment_added"},
    ]}, format="json")  # fmt: skip
    response = api.post("/api/v1/notifications", {"topic": "thread-watchers", "workflow": "watch",
                                                 "payload": {"author": "z"}}, format="json")  # fmt: skip
    assert response.status_code == 202, response.content
    body = response.json()
    wait_for(lambda: WorkflowRun.objects.filter(notification_id=body["id"], status="done").count() == 20, 90)
    detail = api.get(f"/api/v1/notifications/{body['id']}").json()
    assert detail["workflow"] == "watch" and detail["runs"] == {"done": 20}
    wait_for(lambda: Delivery.objects.filter(channel="inapp", status="sent").count() == 20, 60)
    assert sorted(Delivery.objects.values_list("address", flat=True)) == sorted(users)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("setup", "machinery")
def test_two_triggers_of_one_digest_key_arrive_as_one_email_listing_both(api: Any) -> None:
    """The leader's send after the window renders digest.count and both triggers' payloads; the other run merges."""
    response = api.put("/api/v1/workflows/pair", {"category": "transactional", "steps": [
        # The window opens when the first run reaches the step: wide enough that the second reaches it in time
        # on a loaded box (both wait for a worker that is still starting), which is what this test is not about.
        {"id": "batch", "type": "digest", "window_seconds": 6, "key": "{{ thread_id }}"},
        {"id": "mail", "type": "send", "channel": "email", "template": "comment_digest"},
    ]}, format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    first = _trigger(api, workflow="pair", payload={"thread_id": "t-7", "author": "ann"})
    second = _trigger(api, workflow="pair", payload={"thread_id": "t-7", "author": "bob"})
    try:
        wait_for(lambda: _run_status(first["id"]) in ("done", "failed") and _run_status(second["id"]) == "merged", 60)
    except AssertionError:
        raise AssertionError(f"first {_steps(api, first['id'])}, second {_steps(api, second['id'])}") from None
    assert [s["status"] for s in _steps(api, first["id"])] == ["done", "done"]
    assert [s["status"] for s in _steps(api, second["id"])] == ["merged", "skipped"]

    def emails() -> list[dict[str, Any]]:
        answer = api.get("/api/v1/sandbox/messages", {"channel": "email"})
        assert answer.status_code == 200, answer.content
        return list(answer.json()["results"])

    [email] = wait_for(emails, 30)
    assert email["address"] == "e2e-1@example.com"
    assert email["content"]["subject"] == "2 new comments"
    assert email["content"]["text"] == "ann;bob;"
    sent_by = _steps(api, first["id"])[1]["notification_id"]
    assert str(Delivery.objects.get(pk=email["delivery_id"]).notification_id) == sent_by
