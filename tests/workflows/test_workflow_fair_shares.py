"""A workflow triggered for a topic feeds its sends into a throttled queue by fair shares, as a broadcast does.

Real workers (the advance on `fanout`, the senders on `email.low`) and a real beat (the wake relay), with the
sandbox limited to RATE a second: project A's workflow of one email step for a topic of TOTAL subscribers takes
TOTAL / RATE seconds at least, and project B's singles on the same queue meanwhile are sent within seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from channels_app.models import SandboxMessage
from channels_app.services import deliver
from notifier.accepting.services import notification_accept
from notifier.deliveries.models import Delivery
from notifier.dispatch import fanout, shares
from notifier.workflows.models import WorkflowRun, WorkflowStep
from notifier.workflows.services import runs_advance, runs_wake, workflow_put, workflow_trigger
from preferences.services import recipient_upsert
from projects.models import Project
from projects.scoping import owner_id, owner_scope
from templates_app.services import template_put
from tests import factories
from tests.campaigns.test_campaigns import BEAT
from tests.conftest import purge_all_queues, wait_for
from tests.dispatch.test_fair_shares import project_client, project_topic

RATE = 50  # the sandbox's emails a second
TOTAL = 1000  # A's subscribers: A's sends take TOTAL / RATE = 20 s at least
SINGLES = 8
UNSENT = ["queued", "deferred", "sending"]
ENV = {
    "PROVIDER_RATE_LIMITS": f'{{"sandbox": {{"rate": {RATE}, "burst": {RATE}}}}}',
    "FAIR_HORIZON_SECONDS": "1",
    "WORKFLOW_WAKE_INTERVAL_SECONDS": "1",
}


@pytest.fixture
def throttled(settings: Any) -> None:
    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": RATE, "burst": RATE}}
    settings.FAIR_HORIZON_SECONDS = 1.0
    purge_all_queues()
    shares.reset(["email.low"])


def a_unsent() -> int:
    """Return how many of A's emails are in the broker: written, not yet sent (a rate-limited one waits deferred)."""
    return Delivery.objects.filter(address__startswith="everyone-", status__in=UNSENT).count()


def blast(client: Any, topic: str) -> Any:
    """Trigger a one-email workflow for the client's `topic`; return the triggering notification."""
    with owner_scope(client.environment_id):
        workflow_put(
            key="blast", category="social",
            steps=[{"id": "mail", "type": "send", "channel": "email", "template": "news"}],
        )  # fmt: skip
    return workflow_trigger(
        client=client, data={"topic": topic, "workflow": "blast", "payload": {"pct": 1}}
    ).notification


@pytest.mark.django_db(transaction=True)
def test_runs_without_room_are_held_until_due_and_the_relay_brings_them_back(throttled: None, settings: Any) -> None:
    # A slower provider than the module's spreads the held runs' wake times over 9 s rather than 3, so some are
    # still ahead of the clock after advancing 200 runs on a loaded machine (which has taken over 2 s).
    rate = 20
    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": rate, "burst": rate}}
    a = project_client("proj-a")
    project_topic(a, "everyone", 300)
    trigger = blast(a, "everyone")
    fanout.fanout_run(notification_id=trigger.pk, enqueue_next=False)  # writes the runs (a topic's pages)
    runs = WorkflowRun.objects.filter(notification_id=trigger.pk)
    ids = sorted(runs.values_list("pk", flat=True))
    assert len(ids) == 300

    counts = runs_advance(run_ids=ids[:200])
    # One room (`rate` a second) went out; the others stay at their send step, waiting for the relay, one provider
    # slot apart (the last about 9 s later).
    assert 0 < counts["done"] <= rate and counts["held"] == 200 - counts["done"], counts
    held = runs.filter(status="running", wake_at__isnull=False)
    assert held.count() == counts["held"] and not held.filter(published_at__isnull=False).exists()
    assert not held.filter(step_index__gt=0).exists()
    step = WorkflowStep.objects.get(run=held.first(), index=0)
    assert step.status == "waiting" and step.reason.startswith("held for room in email.low"), step.reason
    # Not due yet: an advance leaves them and the relay does not publish them.
    later = list(held.filter(wake_at__gt=timezone.now() + timedelta(seconds=1)).values_list("pk", flat=True))
    assert later and runs_advance(run_ids=later) == {"not_due": len(later)}
    first_due = min(wake for wake in held.values_list("wake_at", flat=True) if wake is not None)
    held_ids = set(held.values_list("pk", flat=True))
    runs_wake()
    # The relay publishes a held run only once its wake_at has passed.
    assert not runs.filter(pk__in=held_ids, published_at__isnull=False, wake_at__gt=timezone.now()).exists()
    # Due: the relay publishes them, and the next advance sends them (as room appears).
    time.sleep(max(0.0, (first_due - timezone.now()).total_seconds()) + 0.1)
    assert runs_wake() >= 1
    assert runs.filter(pk__in=held_ids, published_at__isnull=False).exists()
    time.sleep(1)
    again = runs_advance(run_ids=sorted(held_ids))
    assert again.get("done", 0) > 0, again
    sent = WorkflowStep.objects.filter(run__notification_id=trigger.pk, status="done", reason__startswith="held for")
    assert sent.count() == again["done"]
    # The queue's hash keeps the trigger's runs held back as its backlog (/metrics).
    [state] = shares.state(["email.low"])
    assert state.backlog == held.count(), (state, held.count())


@pytest.mark.django_db(transaction=True)
def test_a_topic_workflow_holds_another_projects_singles_a_room_at_most(
    throttled: None, start_worker: Any, start_process: Any
) -> None:
    a, b = project_client("proj-a"), project_client("proj-b")
    project_topic(a, "everyone", TOTAL)
    with owner_scope(b.environment_id):
        for i in range(SINGLES):
            factories.make_recipient(user_id=f"b-{i}", email=f"b-{i}@example.com")
    start_worker(queues=["fanout", "maintenance"], env=ENV, concurrency=2)  # the relay runs on maintenance
    start_worker(queues=["email.low"], env=ENV, concurrency=2)
    start_process("beat", BEAT, ENV)

    started = time.monotonic()
    trigger = blast(a, "everyone")
    runs = WorkflowRun.objects.filter(notification_id=trigger.pk)
    wait_for(lambda: runs.count() == TOTAL, timeout=30, interval=0.1)

    # B's singles, one a second while A's runs go out; A never has more than a few rooms in the broker.
    latencies: list[float] = []
    most_unsent = 0
    for i in range(SINGLES):
        accepted = timezone.now()
        data = {"recipient": {"user_id": f"b-{i}"}, "template": "news", "channels": ["email"], "payload": {"pct": 1}}
        notification_accept(client=b, data=data)
        most_unsent = max(most_unsent, a_unsent())
        mine = SandboxMessage.objects.filter(address=f"b-{i}@example.com")
        sent = wait_for(mine.first, timeout=30, interval=0.05)
        latencies.append((sent.created_at - accepted).total_seconds())
        most_unsent = max(most_unsent, a_unsent())
        time.sleep(max(0.0, 1 - (timezone.now() - accepted).total_seconds()))
    # Each of B's singles waited behind about a room of A's sends (a second's worth), not behind A's thousands.
    assert max(latencies) < 5, latencies
    assert most_unsent <= 3 * RATE, most_unsent
    assert runs.exclude(status="done").exists(), "A's workflow must still be going when B's singles are done"

    # Every run of A ends done, each subscriber emailed once, and the runs held back were held, not lost.

    def all_done() -> bool:
        nonlocal most_unsent
        most_unsent = max(most_unsent, a_unsent())
        return runs.filter(status="done").count() == TOTAL

    wait_for(all_done, timeout=120, interval=0.5)
    assert most_unsent <= 3 * RATE, most_unsent  # the queue never held more than a few rooms of A's emails
    took = time.monotonic() - started
    assert took >= TOTAL / RATE * 0.8, took
    emails = SandboxMessage.objects.filter(address__startswith="everyone-")
    wait_for(lambda: emails.count() >= TOTAL, timeout=30)
    time.sleep(2)  # a second send of one would arrive by now
    sent_to = Counter(emails.values_list("address", flat=True))
    assert len(sent_to) == TOTAL and set(sent_to.values()) == {1}
    steps = WorkflowStep.objects.filter(run__notification_id=trigger.pk)
    assert Counter(steps.values_list("status", flat=True)) == {"done": TOTAL}
    held = steps.filter(reason__startswith="held for room in its queue until").count()
    assert held >= TOTAL / 2, held


def waiter(client: Any, topic: str | None = None, user_id: str | None = None) -> Any:
    """Trigger a workflow whose first step is a long delay (its run's advance stops there); return the trigger."""
    with owner_scope(client.environment_id):
        workflow_put(key="later", category="social", steps=[{"id": "wait", "type": "delay", "seconds": 3600}])
    target: dict[str, Any] = {"topic": topic} if topic else {"recipient": {"user_id": user_id}}
    return workflow_trigger(client=client, data={**target, "workflow": "later", "payload": {}}).notification


@pytest.mark.django_db(transaction=True)
def test_a_topic_workflows_runs_hold_another_projects_steps_a_page_at_most(start_worker: Any) -> None:
    """A's 3,000 runs are written a page at a time behind their own advance messages on the shared fan-out queue.

    B's run, triggered once A's first runs exist, advances after about one page of A's runs, not after all of them:
    the lane re-enqueues itself behind each page's advance messages. Written all at once (the whole topic in one
    task run), A's 3,000 advances were all ahead of B's.
    """
    page, total = 500, 3000
    env = {"FANOUT_RUNS_PAGE_SIZE": str(page), "WORKFLOW_ADVANCE_BATCH": "100"}
    a, b = project_client("proj-a"), project_client("proj-b")
    project_topic(a, "everyone", total)
    with owner_scope(b.environment_id):
        factories.make_recipient(user_id="b-1", email="b-1@example.com")
    start_worker(queues=["fanout"], env=env, concurrency=1)
    trigger = waiter(a, topic="everyone")
    a_runs = WorkflowRun.objects.filter(notification_id=trigger.pk)
    wait_for(lambda: a_runs.exists(), timeout=60)
    b_run = WorkflowRun.objects.filter(notification_id=waiter(b, user_id="b-1").pk)
    wait_for(lambda: b_run.filter(status="waiting").exists(), timeout=120)
    # Every run of A is written and advanced in the end: nothing is lost by writing a page at a time.
    wait_for(lambda: a_runs.filter(status="waiting").count() == total, timeout=180)
    assert a_runs.count() == total
    # Counted by when each run advanced (its move's transaction time), not when the test looked: A's next page
    # may advance between B's advance and the test's poll.
    b_advanced = b_run.get().updated_at
    a_ahead = a_runs.filter(updated_at__lt=b_advanced).count()
    # B waited behind A's first page (and what the worker had prefetched of the second), not the topic.
    assert a_ahead <= 2 * page, (a_ahead, total)


# A template whose rendering takes the send workers milliseconds: three thousand loop turns of arithmetic.
SLOW = {
    "en": {"email": {"subject": "News {{ pct }}", "text": "{% for i in range(3000) %}{{ (i * pct) % 7 }}{% endfor %}"}}
}


@pytest.mark.django_db(transaction=True)
def test_a_send_rendered_per_run_takes_as_many_slots_as_its_rendering_takes_the_workers(
    throttled: None, settings: Any
) -> None:
    rate = 1000  # a provider slot of a millisecond: a rendering of several takes several
    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": rate, "burst": rate}}
    a = project_client("proj-a")
    with owner_scope(a.environment_id):
        template_put(key="news", category="social", default_locale="en", content=SLOW)
    with owner_scope(a.environment_id):
        recipient_upsert(user_id="reader", email="reader@example.com")

    def send(payloads: list[dict[str, Any]]) -> None:
        ids = []
        for payload in payloads:
            data = {
                "recipient": {"user_id": "reader"},
                "template": "news",
                "channels": ["email"],
                "payload": payload,
            }
            ids += [d.pk for d in notification_accept(client=a, data=data).deliveries]
        assert deliver(ids).sent == len(ids)

    # Ten renderings for ten deliveries (a digest's way): each delivery cost its whole rendering.
    send([{"pct": i} for i in range(1, 11)])
    per_run = shares.render_cost(owner_id(a), "news")
    units = shares.units_per_delivery(per_run, rate)
    assert units > 1, per_run
    # One rendering shared by forty deliveries (a broadcast's way) costs each of them a fortieth.
    send([{"pct": 99}] * 40)
    shared = shares.render_cost(owner_id(a), "news")
    assert shared < per_run / 5, (shared, per_run)

    # Runs that carry the trigger's payload share one rendering: one slot each, whatever the template costs.
    project_topic(a, "everyone", 1000)
    trigger = blast(a, "everyone")
    fanout.fanout_run(notification_id=trigger.pk, enqueue_next=False)
    runs = WorkflowRun.objects.filter(notification_id=trigger.pk)
    ids = sorted(runs.values_list("pk", flat=True))
    counts = runs_advance(run_ids=ids[:300])
    assert counts == {"done": 300}, counts
    project = Project.objects.get(slug="proj-a").pk
    [state] = [s for s in shares.state(["email.low"]) if s.project == project]
    assert state.fed == 300, state

    # Runs with a digest (each its own payload, as the digest step leaves them) are charged what the workers last
    # measured: with the per-run cost again, a room of `rate` slots lets `rate / units` of them send, not `rate`.
    shares.reset(["email.low"])
    send([{"pct": i} for i in range(11, 21)])
    units = shares.units_per_delivery(shares.render_cost(owner_id(a), "news"), rate)
    assert units > 1
    digests = ids[300:]
    runs.filter(pk__in=digests).update(digest={"key": "", "count": 1, "events": [{"pct": 5}]})
    counts = runs_advance(run_ids=digests)
    assert 0 < counts["done"] <= rate // units + 1 and counts["held"] == len(digests) - counts["done"], (counts, units)
    # The queue's level holds the runs sent at their cost in slots.
    [state] = [s for s in shares.state(["email.low"]) if s.project == project]
    assert state.fed == counts["done"] * units, (state, counts, units)
    purge_all_queues()
