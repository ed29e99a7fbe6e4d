"""Writes of workflows: saving versions, triggering runs, advancing them step by step, waking and cancelling them.

Durability: a run is a row. Its current step is `step_index`; a step that waits (a delay, a digest window)
leaves the run `waiting` with `wake_at`, and nothing else: no timer lives in a worker or in the broker. The
wake relay (`runs_wake`, on beat every WORKFLOW_WAKE_INTERVAL_SECONDS) publishes the runs that are due, in
pages of WORKFLOW_ADVANCE_BATCH ids per message on the `fanout` queue, so many workers share a large wake-up.
It also re-publishes a run whose message was lost (a broker restart, a worker killed before it committed):
claims are idempotent, so a second message is harmless.

Idempotency: `runs_advance` takes each run with FOR UPDATE SKIP LOCKED, decides its steps, writes every
step's outcome and creates what a send step sends in the same transaction, and moves the run with an update
guarded by the step index and status it started from. A duplicated or retried message finds the run locked,
finished or already past that step, and repeats nothing; a worker killed mid-step leaves nothing committed.

Every step records why (`WorkflowStep.reason`): the condition and the value it saw, the wait, the throttle's
count, the digest it led or joined, the deliveries a send created.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import current_app as celery_app
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from audit.services import audit_record
from core import task_names
from core.db import bound_cursor, insert_rows, json_rows
from core.errors import ApiError
from core.keys import require_key
from core.queues import broker_recently_down, mark_broker_down, queue_name
from notifier.accepting.decide import request_fingerprint
from notifier.accepting.policy import send_policy
from notifier.accepting.services import (
    AcceptResult,
    notification_accept,
    notification_accept_prepared,
    notification_cancel,
    topic_notification_write,
)
from notifier.clients.models import ApiClient
from notifier.deliveries import frequency
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.partitions import new_notification_id
from notifier.deliveries.selectors import notification_statuses_reached
from notifier.dispatch import localtime, shares
from notifier.workflows import definitions
from notifier.workflows.models import Workflow, WorkflowRun, WorkflowStep, WorkflowTrigger, WorkflowVersion
from notifier.workflows.selectors import (
    PROMOTION_READERS,
    WorkflowNotFound,
    workflow_exists,
    workflow_get,
    workflow_version_resolve,
    workflows_in_use,
)
from preferences.models import Recipient
from preferences.services import recipient_ensure
from projects.promotion import InUse, direct_change_check, promote
from projects.scoping import as_client_owner, owner_id
from projects.selectors import environment_project_weight
from templates_app.selectors import TemplateNotFound, template_version_resolve
from templates_app.services import layout_promote, template_promote

logger = logging.getLogger(__name__)

STRATEGY = "workflow"  # Notification.strategy of a trigger (the fan-out writes runs for it, not deliveries)
ADVANCE_QUEUE = "fanout"
R = WorkflowRun.Status
LIVE = (R.RUNNING, R.WAITING)


# --- definitions ---------------------------------------------------------------------------------------------


def _template_channels(spec: str) -> tuple[str, list[str]] | None:
    try:
        version = template_version_resolve(spec)
    except TemplateNotFound:
        return None
    return version.template.category, list(version.channels)


def workflow_put(
    *,
    key: str,
    category: str,
    steps: Any,
    actor: str = "",
    audit_actor: Any = None,
    audit_action: str = "workflow.version_create",
    audit_changes: Mapping[str, Any] | None = None,
    enforce_promotion: bool = False,
) -> WorkflowVersion:
    """Validate a definition and save it as the workflow's next version; raise ApiError 400 naming the bad step.

    With an `audit_actor` the new version is written to the audit log, as `audit_action` with `audit_changes`
    added. `enforce_promotion`: the call is a direct change (an API key's PUT), refused with a 409
    `promotion_required` in a live environment whose project changes live only by promotion from test. A key that
    breaks the key rule (core/keys.py) is the 400 naming `key`.
    """
    require_key(key)
    if enforce_promotion:
        direct_change_check(kind="workflow", key=key)
    try:
        checked = definitions.validate(category=category, steps=steps, template_channels=_template_channels)
    except definitions.DefinitionError as exc:
        raise ApiError(400, "invalid", exc.message, {exc.field: [exc.message]}) from None
    with transaction.atomic():
        workflow, created = Workflow.objects.get_or_create(key=key)
        # The row lock numbers concurrent PUTs one after the other.
        workflow = Workflow.objects.select_for_update().get(pk=workflow.pk)
        workflow.latest_version += 1
        workflow.save(update_fields=["latest_version", "updated_at"])
        version = WorkflowVersion.objects.create(
            workflow=workflow, version=workflow.latest_version, category=category, steps=checked, created_by=actor
        )
        if audit_actor is not None:
            changes = {
                "version": [None if created else version.version - 1, version.version],
                **(audit_changes or {}),
            }
            audit_record(actor=audit_actor, action=audit_action, target_type="workflow", target_id=key, changes=changes)
    version.workflow = workflow
    return version


def workflow_rollback(*, key: str, version: int, actor: str = "", audit_actor: Any = None) -> WorkflowVersion:
    """Make an earlier version of a workflow the one sends run again, as its next version (the scope's environment).

    The definition is checked again (the templates it names must still exist). Raises WorkflowNotFound for an
    unknown key or version, ApiError 400 `already_current` for the latest version.
    """
    workflow = workflow_get(key=key)
    if workflow is None:
        raise WorkflowNotFound(f"No workflow '{key}'.")
    earlier = next((v for v in workflow.all_versions if v.version == version), None)  # type: ignore[attr-defined]
    if earlier is None:
        raise WorkflowNotFound(f"Workflow '{key}' has no version {version}.")
    if earlier.version == workflow.latest_version:
        raise ApiError(
            400,
            "already_current",
            f"Version {version} of workflow '{key}' is its latest version, the one sends run.",
            {"version": ["is the version in use already"]},
        )
    return workflow_put(
        key=key,
        category=earlier.category,
        steps=earlier.steps,
        actor=actor,
        audit_actor=audit_actor,
        audit_action="workflow.rollback",
        audit_changes={"rolled_back_to": [None, version]},
    )


def workflow_promote(*, key: str, environment_id: int, actor: str = "", audit_actor: Any = None) -> WorkflowVersion:
    """Write the test environment's latest version of a workflow as live's next version; return it.

    The definition is checked in live: the templates its steps name must exist there (promote them first, or in
    the same promotion). Raises ApiError 404 (no such workflow in test) or 400 (`nothing_to_promote`, invalid).
    """

    def write(test: InUse) -> WorkflowVersion:
        return workflow_put(
            key=key,
            category=test.content["category"],
            steps=test.content["steps"],
            actor=actor,
            audit_actor=audit_actor,
            audit_action="workflow.promote",
            audit_changes={"test_version": [None, test.version]},
        )

    return promote(
        kind="workflow", key=key, environment_id=environment_id, read=workflows_in_use, exists=workflow_exists,
        write=write,
    )  # fmt: skip


@dataclass
class PromotionResult:
    """What became of one item of a promotion: live's new version, or the error it alone would have had."""

    kind: str
    key: str
    live_version: int | None = None
    error: Exception | None = None


def _promotion_item(item: Any, kinds: Sequence[str]) -> PromotionResult:
    """Read one item of a promotion ({"kind", "key"}); a malformed one carries its 400 already."""
    fields = item if isinstance(item, dict) else {}
    kind, key = fields.get("kind"), fields.get("key")
    result = PromotionResult(kind=kind if isinstance(kind, str) else "", key=key if isinstance(key, str) else "")
    reasons: dict[str, list[str]] = {}
    if not isinstance(item, dict):
        reasons["item"] = ["must be an object with kind and key"]
    else:
        if kind not in kinds:
            reasons["kind"] = [f"unknown kind; one of: {', '.join(kinds)}"]
        if not isinstance(key, str) or not key:
            reasons["key"] = ["is required (a string)"]
    if reasons:
        message = "; ".join(f"{name}: {why[0]}" for name, why in reasons.items())
        result.error = ApiError(400, "invalid", f"Invalid item: {message}", reasons)
    return result


def promotion_apply(
    *,
    environment_id: int,
    items: Sequence[Any],
    actor: str = "",
    audit_actor: Any = None,
    client_id: int | None = None,
    allowed_categories: list[str] | None = None,
) -> list[PromotionResult]:
    """Promote each item ({"kind", "key"}) from the project's test environment to its live one; results in order.

    `environment_id` is the caller's, either environment of the project. Items are written in dependency order
    (layouts, templates, workflows: PROMOTION_READERS), so one call carries a template with the layout it names,
    whatever their order in the request; each is its own transaction, and one that fails (malformed, unknown
    kind or key, nothing to promote, refused by validation in live) fails
    alone with the error a call for it alone would have had.
    """
    promoters: dict[str, Callable[[str], Any]] = {
        "layout": lambda key: layout_promote(
            key=key, environment_id=environment_id, actor=actor, audit_actor=audit_actor
        ),
        "template": lambda key: template_promote(
            key=key, environment_id=environment_id, actor=actor, audit_actor=audit_actor, client_id=client_id,
            allowed_categories=allowed_categories,
        ),
        "workflow": lambda key: workflow_promote(
            key=key, environment_id=environment_id, actor=actor, audit_actor=audit_actor
        ),
    }  # fmt: skip
    kinds = list(PROMOTION_READERS)
    results = [_promotion_item(item, kinds) for item in items]
    for result in sorted(results, key=lambda r: kinds.index(r.kind) if r.kind in kinds else -1):
        if result.error is not None:
            continue
        try:
            result.live_version = promoters[result.kind](result.key).version
        except (ApiError, ValidationError) as exc:
            result.error = exc
    return results


# --- triggering ----------------------------------------------------------------------------------------------


@as_client_owner
def workflow_trigger(*, client: ApiClient, data: dict[str, Any], trace_id: str = "") -> AcceptResult:
    """Accept a send with `workflow`: the notification, its trigger record and, for a user, the run.

    Deduplicated as any send (dedup_key, request_hash); category and priority decided by notifier.accepting.policy with
    the workflow's category in the template's place. A topic's runs are written by the fan-out, page by page.
    """
    try:
        version = workflow_version_resolve(data["workflow"])
    except WorkflowNotFound as exc:
        raise ApiError(400, "invalid", str(exc), {"workflow": [str(exc)]}) from None
    category, priority = send_policy(
        client=client, template_category=version.category, category=data.get("category"),
        priority=data.get("priority"),
    )  # fmt: skip
    notification = Notification(
        id=new_notification_id(),
        client=client,
        environment_id=client.environment_id,
        dedup_key=data.get("dedup_key") or None,
        request_hash=request_fingerprint(data),
        category=category,
        template_key="",
        template_version=None,
        channels=[],
        payload=data.get("payload") or {},
        priority=priority,
        locale=data.get("locale") or "",
        strategy=STRATEGY,
        trace_id=trace_id,
    )

    def prepare(n: Notification) -> list[Any]:
        if data.get("topic"):
            topic_notification_write(n, data["topic"])  # the fan-out starts after commit
            WorkflowTrigger.objects.create(notification_id=n.pk, version=version)
            return []
        recipient = recipient_ensure(user_id=data["recipient"]["user_id"])
        n.recipient, n.user_id = recipient, recipient.user_id
        insert_rows([n])
        WorkflowTrigger.objects.create(notification_id=n.pk, version=version)
        run = WorkflowRun.objects.create(
            notification_id=n.pk, version=version, client_id=client.pk, recipient_id=recipient.pk,
            user_id=recipient.user_id, priority=n.priority, published_at=timezone.now(),
        )  # fmt: skip
        transaction.on_commit(lambda: runs_publish([run.pk]))
        return []

    return notification_accept_prepared(client=client, notification=notification, prepare=prepare)


_RUNS_SQL = """
    INSERT INTO workflows_workflowrun (
        notification_id, version_id, client_id, recipient_id, user_id, priority, status, step_index,
        wake_at, published_at, digest, created_at, updated_at
    )
    SELECT %s, %s, %s, t.r, t.u, %s, 'running', 0, NULL, %s, NULL, %s, %s
    FROM unnest(%s::bigint[], %s::text[]) AS t(r, u)
    ON CONFLICT (notification_id, recipient_id) DO NOTHING
    RETURNING id
"""


def runs_create_for_page(notification: Notification, rows: list[tuple[int, str]], now: datetime) -> int:
    """Write one run per subscriber of a fan-out page (one statement); publish them after commit.

    Called by the fan-out inside the page's transaction (notifier.dispatch.fanout.register_page_writer). A page redone
    after a crash inserts nothing twice (the unique (notification, recipient) constraint).
    """
    version_id = (
        WorkflowTrigger.objects.filter(notification_id=notification.pk).values_list("version_id", flat=True).first()
    )
    if version_id is None or not rows:
        return 0
    with bound_cursor() as cursor:
        cursor.execute(
            _RUNS_SQL,
            [
                notification.pk, version_id, notification.client_id, notification.priority, now, now, now,
                [r for r, _ in rows], [u for _, u in rows],
            ],
        )  # fmt: skip
        ids = [row[0] for row in cursor.fetchall()]
    if ids:
        transaction.on_commit(lambda: runs_publish(ids))
    return len(ids)


def runs_publish(run_ids: Sequence[int]) -> int:
    """Publish advance messages for runs, WORKFLOW_ADVANCE_BATCH ids each; return how many runs went out.

    Never raises: a run whose message did not go is re-published by the wake relay once it is stale.
    """
    ids = list(run_ids)
    size = max(1, int(settings.WORKFLOW_ADVANCE_BATCH))
    sent = 0
    if broker_recently_down():
        logger.warning("broker recently down; %d workflow runs left to the relay", len(ids))
        return 0
    for start in range(0, len(ids), size):
        part = ids[start : start + size]
        try:
            celery_app.send_task(task_names.WORKFLOW_ADVANCE, args=[part], queue=ADVANCE_QUEUE, retry=False)
        except Exception as exc:  # the rows are the record; the relay publishes them again
            mark_broker_down()
            logger.warning("workflow advance not published (%d runs left to the relay): %s", len(ids) - sent, exc)
            break
        sent += len(part)
    return sent


# --- waking --------------------------------------------------------------------------------------------------

_WAKE_SQL = """
    WITH due AS (
        SELECT id FROM workflows_workflowrun
        WHERE status IN ('running', 'waiting')
          AND (wake_at IS NULL OR wake_at <= now())
          AND (published_at IS NULL OR published_at < now() - make_interval(secs => %s))
        ORDER BY wake_at, id
        LIMIT %s
        FOR UPDATE SKIP LOCKED
    )
    UPDATE workflows_workflowrun AS r SET published_at = now() FROM due WHERE r.id = due.id
    RETURNING r.id
"""


def runs_wake(*, limit: int | None = None, pages: int = 20) -> int:
    """Publish the runs that are due (their wait is over) or whose last message is stale; return how many.

    The relay of workflows: a waiting run's row carries its `wake_at`; this is what turns it into a message,
    page by page (FOR UPDATE SKIP LOCKED, so two relays never take the same run), each page spread over many
    messages. A run still `running` long after its message went out lost it (or its worker): published again.
    """
    limit = limit or int(settings.WORKFLOW_WAKE_BATCH)
    total = 0
    for _ in range(pages):
        with transaction.atomic(), bound_cursor() as cursor:
            cursor.execute(_WAKE_SQL, [settings.WORKFLOW_REPUBLISH_AFTER_SECONDS, limit])
            ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            break
        total += runs_publish(ids)
        if len(ids) < limit:
            break
    if total:
        logger.info("workflow relay: %d runs published", total)
    return total


# --- advancing -----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What deciding one step gave: the step's status and reason, and what it means for the run."""

    status: str
    reason: str
    wake_at: datetime | None = None
    notification_id: uuid.UUID | None = None
    run_status: str | None = None  # set when the run ends at this step (merged, throttled, failed)


# A run held back for room in a throttled queue comes back no sooner than this.
HOLD_FLOOR_SECONDS = 0.25


@dataclass
class _Grant:
    """What a throttled queue granted the runs of one topic trigger in this message, and what they fed."""

    queue: str
    rate: float
    project: int
    weight: int
    flow: str
    share: shares.Share
    left: int  # runs that may still send into the queue
    fed: int = 0  # deliveries the sends really queued
    held: int = 0  # runs held back again (they were held before)
    newly_held: int = 0  # runs held back for the first time: they join the flow's backlog
    released: int = 0  # runs held before that went on: they leave it
    units: int = 1  # provider slots a send takes in the queue's room (its rendering's time: shares.units_per_delivery)

    def settle(self, failed: bool = False) -> None:
        """Give back what the message did not feed (all of it when its transaction did not commit).

        The flow's backlog in the queue's hash counts its runs held back, for /metrics and for where a run newly
        held joins the line (see `_room`).
        """
        delta = -self.share.granted if failed else self.fed * self.units - self.share.granted
        backlog = 0 if failed else self.newly_held - self.released
        shares.settle(
            self.queue, rate=self.rate, project=self.project, weight=self.weight, flow=self.flow, delta=delta,
            backlog=backlog,
        )  # fmt: skip


@dataclass
class _Context:
    """What one advance shares between runs: the clients (one query each) and the database's now()."""

    clients: dict[int, ApiClient]
    triggers: dict[uuid.UUID, tuple[dict[str, Any], str]]  # notification id -> (payload, locale)
    now: datetime
    # Throttle admissions of this message's runs, not yet written (the database count adds them).
    admitted: Counter[tuple[int, str, int]] = field(default_factory=Counter)
    # Triggers with a topic whose runs are fed into throttled queues by fair shares, and how many of this
    # message's runs of each are still to be decided (what a first ask wants).
    topics: set[uuid.UUID] = field(default_factory=set)
    remaining: Counter[uuid.UUID] = field(default_factory=Counter)
    grants: dict[tuple[str, uuid.UUID], _Grant] = field(default_factory=dict)


def runs_advance(*, run_ids: Sequence[int]) -> dict[str, int]:
    """Advance each run as far as it can go now (to its next wait or its end); return counts of where they stopped.

    Safe for any ids, any number of times (see the module doc): finished, locked or not-yet-due runs are left.
    A message's runs are locked with one statement and written back with one statement per table, in one
    transaction (one commit, not a hundred); each run is decided in a savepoint of its own, so a run that
    breaks rolls back alone and is recorded failed. A database error retries the whole message.
    """
    ids = sorted({int(r) for r in run_ids})
    counts: Counter[str] = Counter()
    if not ids:
        return {}
    with transaction.atomic():
        runs = list(
            WorkflowRun.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("version__workflow")
            .filter(pk__in=ids, status__in=LIVE)
            .order_by("pk")
        )
        if len(runs) < len(ids):
            counts["skipped"] = len(ids) - len(runs)  # finished, cancelled, or another worker has them now
        now = _db_now()  # the transaction's: every run of the message is decided at the same instant
        triggers, topics = _triggers({r.notification_id for r in runs})
        context = _Context(clients={}, triggers=triggers, now=now, topics=topics if shares.enabled() else set())
        # A waiting run's wait, or a run held back for room in a throttled queue (running, with a wake_at).
        due = [run for run in runs if run.wake_at is None or run.wake_at <= now]
        context.remaining.update(run.notification_id for run in due if run.notification_id in context.topics)
        steps: list[tuple[Any, ...]] = []
        moves: list[tuple[Any, ...]] = []
        early: list[int] = []
        for run in runs:
            if run.wake_at is not None and run.wake_at > now:
                early.append(run.pk)
                counts["not_due"] += 1
                continue
            started = (run.pk, run.step_index, run.status)
            try:
                with transaction.atomic():
                    recorded = _advance_run(run, context)
            except (OperationalError, InterfaceError):
                raise
            except Exception as exc:
                logger.exception("workflow run %s failed", run.pk)
                run.status, run.wake_at = R.FAILED, None
                reason = f"internal error: {type(exc).__name__}"
                definition = run.version.steps
                index = min(run.step_index, len(definition) - 1)
                step = definition[index]
                recorded = [(run.pk, index, step["id"], step["type"], WorkflowStep.Status.FAILED, reason, None)]
            context.remaining[run.notification_id] -= 1
            steps.extend(recorded)
            moves.append((*started, run.step_index, run.status, run.wake_at, run.published_at, run.digest))
            counts["held" if run.status == R.RUNNING and run.wake_at is not None else str(run.status)] += 1
        if early:
            # Woken early: the relay publishes them again when due (not only once their message is stale).
            WorkflowRun.objects.filter(pk__in=early).update(published_at=None)
        try:
            _write(steps, moves, now)
        except BaseException:
            for grant in context.grants.values():
                grant.settle(failed=True)
            raise
    for grant in context.grants.values():
        grant.settle()
    return dict(counts)


def _triggers(
    notification_ids: set[uuid.UUID],
) -> tuple[dict[uuid.UUID, tuple[dict[str, Any], str]], set[uuid.UUID]]:
    """Return (payload, locale) of the triggering notifications (a topic's runs share theirs), and those of a topic."""
    found: dict[uuid.UUID, tuple[dict[str, Any], str]] = {nid: ({}, "") for nid in notification_ids}
    topics: set[uuid.UUID] = set()
    for n in Notification.objects.filter(pk__in=list(notification_ids)).only("id", "payload", "locale", "topic_id"):
        found[n.pk] = (n.payload or {}, n.locale)
        if n.topic_id is not None:
            topics.add(n.pk)
    return found, topics


_STEPS_SQL = """
    INSERT INTO workflows_workflowstep (run_id, index, step_id, type, status, reason, notification_id, at)
    SELECT (e->>0)::bigint, (e->>1)::int, e->>2, e->>3, e->>4, e->>5, (e->>6)::uuid, %s
    FROM jsonb_array_elements(%s::jsonb) AS e
    ON CONFLICT (run_id, index) DO UPDATE SET status = EXCLUDED.status, reason = EXCLUDED.reason,
        notification_id = COALESCE(EXCLUDED.notification_id, workflows_workflowstep.notification_id), at = EXCLUDED.at
"""
# The guard: a run moves only from the step and status its advance started from (held under the row lock,
# and stated so that no other path can move a run without it).
_MOVES_SQL = """
    UPDATE workflows_workflowrun AS r
    SET step_index = (e->>3)::int, status = e->>4, wake_at = (e->>5)::timestamptz,
        published_at = (e->>6)::timestamptz, digest = CASE WHEN e->7 = 'null'::jsonb THEN r.digest ELSE e->7 END,
        updated_at = %s
    FROM jsonb_array_elements(%s::jsonb) AS e
    WHERE r.id = (e->>0)::bigint AND r.step_index = (e->>1)::int AND r.status = e->>2
"""


def _write(steps: list[tuple[Any, ...]], moves: list[tuple[Any, ...]], now: datetime) -> None:
    """Write the steps decided and move the runs: one statement each, however many runs."""
    with bound_cursor() as cursor:
        if steps:
            cursor.execute(_STEPS_SQL, [now, json_rows((*row[:5], row[5][:2000], row[6]) for row in steps)])
        if moves:
            cursor.execute(_MOVES_SQL, [now, json_rows(moves)])
            if cursor.rowcount != len(moves):
                raise RuntimeError("workflow runs moved under their locks")


def _db_now() -> datetime:
    with bound_cursor() as cursor:
        cursor.execute("SELECT now()")
        row = cursor.fetchone()
    assert row is not None
    return row[0]


def _advance_run(run: WorkflowRun, context: _Context) -> list[tuple[Any, ...]]:
    """Decide a locked run's steps from its current one to its next wait or its end; return the step rows.

    Moves `run` in memory (step_index, status, wake_at, published_at, digest); the caller writes both.
    """
    payload, locale = context.triggers[run.notification_id]
    steps: list[dict[str, Any]] = run.version.steps
    recorded: list[tuple[Any, ...]] = []
    # A running run with a wake_at was held back for room in a throttled queue until then.
    held_until = run.wake_at if run.status == R.RUNNING else None
    while True:
        index = run.step_index
        if index >= len(steps):
            run.status, run.wake_at = R.DONE, None
            break
        step = steps[index]
        if run.status == R.WAITING:
            outcome = _resume(run, step, context)
        else:
            holds, why = _condition(run, step, payload, recorded)
            held = _room(run, step, context, held_until is not None) if holds and step["type"] == "send" else None
            if held is not None:
                # No room (or not this broadcast's turn) in a throttled queue: the run stays at its send step and
                # the wake relay brings it back when the queue should have room (fair shares, as a topic's pages).
                reason = f"{why}; {held.reason}" if why else held.reason
                recorded.append((run.pk, index, step["id"], step["type"], WorkflowStep.Status.WAITING, reason, None))
                run.status, run.wake_at, run.published_at = R.RUNNING, held.wake_at, None
                break
            if holds:
                outcome = _start(run, index, step, payload, locale, context)
                if why:
                    outcome.reason = f"{why}; {outcome.reason}"
                if held_until is not None and step["type"] == "send":
                    outcome.reason = f"held for room in its queue until {held_until.isoformat()}; {outcome.reason}"
            else:
                outcome = Outcome(WorkflowStep.Status.SKIPPED, why)
        recorded.append((run.pk, index, step["id"], step["type"], outcome.status, outcome.reason,
                         outcome.notification_id))  # fmt: skip
        if outcome.status == WorkflowStep.Status.WAITING:
            run.status, run.wake_at, run.published_at = R.WAITING, outcome.wake_at, None
            break
        run.status, run.wake_at = R.RUNNING, None
        if outcome.run_status:
            run.status = outcome.run_status
            break
        run.step_index = index + 1
    return recorded


def _condition(
    run: WorkflowRun, step: dict[str, Any], payload: dict[str, Any], recorded: list[tuple[Any, ...]]
) -> tuple[bool, str]:
    """Return whether the step's `if` holds, and the reason naming the condition and the value it saw."""
    cond = step.get("if")
    if not cond:
        return True, ""
    if "payload" in cond:
        field = cond["payload"]
        found, value = definitions.payload_value(payload, field)
        seen = repr(value) if found else "absent"
        if "exists" in cond:
            holds = found == cond["exists"]
            return holds, f"if payload.{field} exists is {cond['exists']}: {seen} -> {str(holds).lower()}"
        if "in" in cond:
            holds = found and value in cond["in"]
            return holds, f"if payload.{field} in {cond['in']!r}: {seen} -> {str(holds).lower()}"
        holds = found and value == cond["equals"]
        return holds, f"if payload.{field} equals {cond['equals']!r}: {seen} -> {str(holds).lower()}"
    target = cond["step"]
    # Decided in this advance (not written yet), or earlier.
    here = [(row[4], row[6]) for row in recorded if row[2] == target]
    if here:
        status, notification_id = here[-1]
    else:
        row = WorkflowStep.objects.filter(run=run, step_id=target).values_list("status", "notification_id").first()
        status, notification_id = row if row is not None else ("pending", None)
    if notification_id is None:
        reached: set[str] = {status}
    else:
        reached = notification_statuses_reached(notification_id=notification_id) or {status}
    op = "status_in" if "status_in" in cond else "status_not_in"
    wanted = set(cond[op])
    holds = bool(reached & wanted) if op == "status_in" else not reached & wanted
    shown = ", ".join(sorted(reached))
    return bool(holds), f"if {target} {op} {sorted(wanted)}: reached [{shown}] -> {str(bool(holds)).lower()}"


def _start(
    run: WorkflowRun, index: int, step: dict[str, Any], payload: dict[str, Any], locale: str, context: _Context
) -> Outcome:
    kind = step["type"]
    if kind == "send":
        return _send(run, step, payload, locale, context)
    if kind == "delay":
        return _delay(run, step, payload, context.now)
    if kind == "digest":
        return _digest_join(run, step, payload)
    return _throttle(run, step, context)


def _room(run: WorkflowRun, step: dict[str, Any], context: _Context, was_held: bool) -> Outcome | None:
    """Take room for a topic run's send in each throttled queue it feeds; return the hold when one has none.

    The runs of a topic trigger are a broadcast fanned out one single at a time: at normal or low priority they
    ask notifier/dispatch/shares.py for room in each throttled `<channel>.low` as a topic's pages do, once per
    queue and message for all of the message's runs of the trigger still to go (flow `wf:<notification id>`).
    A run held back comes back when its place in the line should have reached the queue: a run held for the
    first time queues behind the flow's runs held already (its backlog), one held again behind this message's.
    """
    if run.notification_id not in context.topics or run.priority == "high":
        return None
    channels = [step["channel"]] if "channel" in step else list(step["channels"])
    grants: list[_Grant] = []
    for channel in channels:
        rate = shares.channel_rate(channel)
        if not rate:
            continue  # an unthrottled queue is not gated
        queue = queue_name(channel, run.priority)
        grant = context.grants.get((queue, run.notification_id))
        if grant is None:
            environment_id = owner_id(run.version.workflow)
            project, weight = environment_project_weight(environment_id)
            flow = f"wf:{run.notification_id}"
            # The runs of a trigger carry its payload, and the send workers render that once per process
            # (channels_app/renderings.py); a run with a digest renders its own, and one whose rendering takes the
            # workers longer than a provider slot counts as several: the room holds the horizon's worth of their time.
            cost = shares.render_cost(environment_id, step["template"]) if run.digest else 0.0
            units = shares.units_per_delivery(cost, rate)
            want = max(1, context.remaining[run.notification_id]) * units
            share = shares.ask(queue, rate=rate, project=project, weight=weight, flow=flow, want=want)
            grant = _Grant(queue, rate, project, weight, flow, share, left=share.granted // units, units=units)
            context.grants[(queue, run.notification_id)] = grant
        grants.append(grant)
    short = next((grant for grant in grants if grant.left <= 0), None)
    if short is None:
        for grant in grants:
            grant.left -= 1
            grant.released += was_held
        return None
    # Held runs come back one provider slot apart, in the order they were held, so a million of them do not all
    # ask again at once; the estimate errs early (the provider's whole rate), and a run early is held again.
    if was_held:
        short.held += 1
        place = short.held
    else:
        short.newly_held += 1
        place = max(0, short.share.backlog) + short.newly_held
    wait = max(HOLD_FLOOR_SECONDS, short.share.wait) + place * short.units / short.rate
    why = "no room in the queue" if short.share.reason != "turn" else "other broadcasts' turn"
    wake_at = context.now + timedelta(seconds=wait)
    return Outcome(
        WorkflowStep.Status.WAITING,
        f"held for room in {short.queue} ({why}, fair shares): again at {wake_at.isoformat()}",
        wake_at=wake_at,
    )


def _send(run: WorkflowRun, step: dict[str, Any], payload: dict[str, Any], locale: str, context: _Context) -> Outcome:
    """Send through the accept path of any send (compliance, caps, planning, outbox), in this transaction."""
    client = context.clients.get(run.client_id)
    if client is None:
        client = context.clients[run.client_id] = ApiClient.objects.get(pk=run.client_id)
    channels = [step["channel"]] if "channel" in step else list(step["channels"])
    data: dict[str, Any] = {
        "recipient": {"user_id": run.user_id},
        "template": step["template"],
        "channels": channels,
        "payload": {**payload, "digest": run.digest} if run.digest else payload,
        "priority": run.priority,
    }
    if locale:
        data["locale"] = locale
    try:
        with transaction.atomic():  # a refused send rolls back only itself
            result = notification_accept(client=client, data=data)
    except ApiError as exc:
        return Outcome(WorkflowStep.Status.FAILED, f"send refused: {exc.message}", run_status=R.FAILED)
    for delivery in result.deliveries:
        grant = context.grants.get((queue_name(delivery.channel, run.priority), run.notification_id))
        if grant is not None and delivery.status == Delivery.Status.QUEUED:
            grant.fed += 1  # what went into the queue (a suppressed or deferred delivery gives its room back)
    parts = [f"{d.channel} {d.status}" + (f" ({d.reason})" if d.reason else "") for d in result.deliveries]
    return Outcome(
        WorkflowStep.Status.DONE,
        "sent: " + (", ".join(parts) or "no deliveries"),
        notification_id=result.notification.pk,
    )


def _parse_instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _delay(run: WorkflowRun, step: dict[str, Any], payload: dict[str, Any], now: datetime) -> Outcome:
    if "seconds" in step:
        until = now + timedelta(seconds=step["seconds"])
        why = f"delay {step['seconds']}s"
    elif "until" in step:
        found, value = definitions.payload_value(payload, step["until"])
        parsed = _parse_instant(value) if found else None
        if parsed is None:
            return Outcome(WorkflowStep.Status.DONE, f"delay until payload.{step['until']}: no time there ({value!r})")
        until, why = parsed, f"delay until payload.{step['until']}"
    else:
        zone_name = Recipient.objects.filter(pk=run.recipient_id).values_list("timezone", flat=True).first() or ""
        at = definitions.parse_local_time(step["until_local"])
        local_now = now.astimezone(localtime.zone(zone_name))
        until = localtime.local_instant(datetime.combine(local_now.date(), at), zone_name)
        if until <= now:
            until = localtime.local_instant(datetime.combine(local_now.date() + timedelta(days=1), at), zone_name)
        why = f"delay until {step['until_local']} in {zone_name or localtime.DEFAULT_ZONE}"
    if until <= now:
        return Outcome(WorkflowStep.Status.DONE, f"{why}: {until.isoformat()} already passed")
    return Outcome(WorkflowStep.Status.WAITING, f"{why}: waiting until {until.isoformat()}", wake_at=until)


_DIGEST_JOIN_SQL = """
    INSERT INTO workflows_workflowdigest
        (workflow_id, step_id, recipient_id, key, leader_id, events, count, closes_at, closed, created_at)
    VALUES (%s, %s, %s, %s, %s, jsonb_build_array(%s::jsonb), 1, now() + make_interval(secs => %s), false, now())
    ON CONFLICT (workflow_id, step_id, recipient_id, key) WHERE NOT closed
    DO UPDATE SET events = workflows_workflowdigest.events || EXCLUDED.events,
                  count = workflows_workflowdigest.count + 1
        WHERE workflows_workflowdigest.closes_at > now()
    RETURNING leader_id, count, closes_at
"""


def _digest_join(run: WorkflowRun, step: dict[str, Any], payload: dict[str, Any]) -> Outcome:
    """Lead a new digest group or join the open one: the unique index decides between racing runs.

    The window is the database's: it closes at the leader's now() + window_seconds, and a group whose window
    passed takes no more runs (the WHERE of DO UPDATE), even while its leader has not woken yet.
    """
    key = definitions.digest_key(step.get("key", ""), payload)
    args = [run.version.workflow_id, step["id"], run.recipient_id, key, run.pk, json.dumps(payload),
            step["window_seconds"]]  # fmt: skip
    with bound_cursor() as cursor:
        cursor.execute(_DIGEST_JOIN_SQL, args)
        row = cursor.fetchone()
        if row is None:
            # The open group's window closed: close it for good (its leader still reads it) and open a new one.
            cursor.execute(
                "UPDATE workflows_workflowdigest SET closed = true WHERE workflow_id = %s AND step_id = %s"
                " AND recipient_id = %s AND key = %s AND NOT closed AND closes_at <= now()",
                args[:4],
            )
            cursor.execute(_DIGEST_JOIN_SQL, args)
            row = cursor.fetchone()
    assert row is not None
    leader_id, count, closes_at = row
    if leader_id == run.pk:
        return Outcome(
            WorkflowStep.Status.WAITING,
            f"digest '{key}': leads it, collecting until {closes_at.isoformat()}",
            wake_at=closes_at,
        )
    return Outcome(
        WorkflowStep.Status.MERGED,
        f"digest '{key}': joined the digest of run {leader_id} (event {count})",
        run_status=R.MERGED,
    )


def _digest_close(run: WorkflowRun, step: dict[str, Any]) -> Outcome:
    with bound_cursor() as cursor:
        cursor.execute(
            "UPDATE workflows_workflowdigest SET closed = true WHERE leader_id = %s AND step_id = %s"
            " AND closes_at <= now() RETURNING key, count, events",
            [run.pk, step["id"]],
        )
        row = cursor.fetchone()
        if row is None:
            cursor.execute(
                "SELECT closes_at FROM workflows_workflowdigest WHERE leader_id = %s AND step_id = %s",
                [run.pk, step["id"]],
            )
            found = cursor.fetchone()
            if found is not None:  # woken early (another clock): wait for the database's
                return Outcome(
                    WorkflowStep.Status.WAITING, f"digest: collecting until {found[0].isoformat()}", wake_at=found[0]
                )
            return Outcome(WorkflowStep.Status.DONE, "digest: no group found; continuing alone")
    key, count, events = row
    events = json.loads(events) if isinstance(events, str) else events
    run.digest = {"key": key, "count": count, "events": events}
    return Outcome(WorkflowStep.Status.DONE, f"digest '{key}': window closed with {count} events")


def _throttle(run: WorkflowRun, step: dict[str, Any], context: _Context) -> Outcome:
    cap = frequency.Cap(max=step["max"], per_seconds=step["per_seconds"])
    scope = f"wf:{run.version.workflow.key}:{step['id']}"
    now = context.now
    mine = (run.version.workflow_id, step["id"], run.recipient_id)

    def count_in_db() -> int:
        return context.admitted[mine] + (
            WorkflowStep.objects.filter(
                run__version__workflow_id=run.version.workflow_id, run__recipient_id=run.recipient_id,
                step_id=step["id"], type="throttle", status=WorkflowStep.Status.DONE,
                at__gt=now - timedelta(seconds=cap.per_seconds),
            )
            .exclude(run_id=run.pk)
            .count()
        )  # fmt: skip

    admitted, count = frequency.admit_one(
        scope=scope, cap=cap, recipient_id=run.recipient_id, member=str(run.pk), count_in_db=count_in_db
    )
    window = f"{cap.max} per {cap.per_seconds}s"
    if admitted:
        context.admitted[mine] += 1
        return Outcome(WorkflowStep.Status.DONE, f"throttle: run {count} of at most {window}")
    return Outcome(
        WorkflowStep.Status.THROTTLED, f"throttle: {count} runs already, at most {window}", run_status=R.THROTTLED
    )


def _resume(run: WorkflowRun, step: dict[str, Any], context: _Context) -> Outcome:
    """Finish the step a run waited on (its wake_at has come, by the database's clock)."""
    if step["type"] == "digest":
        return _digest_close(run, step)
    waited = run.wake_at.isoformat() if run.wake_at else "now"
    return Outcome(WorkflowStep.Status.DONE, f"{step['type']} {_wait_words(step)}: woke at {waited}")


def _wait_words(step: dict[str, Any]) -> str:
    if "seconds" in step:
        return f"{step['seconds']}s"
    if "until" in step:
        return f"until payload.{step['until']}"
    return f"until {step.get('until_local', '')}"


# --- cancelling ----------------------------------------------------------------------------------------------


def runs_cancel(*, notification: Notification) -> int:
    """Stop the runs of a triggering notification: live runs end `cancelled`, their waiting step too.

    What their send steps already created and is not yet sent is cancelled as any notification's. Waits on a
    run being advanced right now (its row lock), so the advance either finished first or finds it cancelled.
    """
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            WorkflowRun.objects.select_for_update(of=("self",))
            .filter(notification_id=notification.pk, status__in=LIVE)
            .values_list("pk", flat=True)
        )
        if ids:
            WorkflowRun.objects.filter(pk__in=ids).update(status=R.CANCELLED, wake_at=None, updated_at=now)
            WorkflowStep.objects.filter(run_id__in=ids, status=WorkflowStep.Status.WAITING).update(
                status=WorkflowStep.Status.CANCELLED, reason="cancelled by client", at=now
            )
        sent = WorkflowStep.objects.filter(
            run__notification_id=notification.pk, notification_id__isnull=False
        ).values_list("notification_id", flat=True)
        for child in Notification.objects.filter(pk__in=list(sent)):
            notification_cancel(notification=child)
        notification_cancel(notification=notification)
    return len(ids)
