"""Writes of campaigns: create, schedule through django-celery-beat, run once per slot, pause, resume, cancel.

A campaign run is a topic notification (category marketing by default, hence low priority) whose fan-out is
paced at the campaign's rate cap (see notifier.dispatch.fanout). A one-off campaign goes at an instant (`send_at`) or at
a wall-clock time in each subscriber's own time zone (`send_at_local`, the campaign's `timezone` for those
without one): its run then starts when the earliest zone reaches that time and each delivery waits as
`scheduled` until its subscriber's moment. Beat may fire a schedule twice (two beat processes,
a restart): a run is claimed with one conditional UPDATE and made in the same transaction as the notification,
whose unique (client, dedup_key) with dedup_key `campaign-<id>-<slot>` is a second guard.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import current_app as celery_app
from celery.schedules import crontab as celery_crontab
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, PeriodicTask

from core import task_names
from core.errors import ApiError
from notifier.accepting.policy import send_policy
from notifier.accepting.services import notification_accept, notification_cancel
from notifier.campaigns.models import Campaign
from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.outbox import group_by_queue, mark_published, publish
from notifier.deliveries.status import deliveries_hold_of_campaign, deliveries_release_of_campaign
from notifier.dispatch import fanout
from notifier.dispatch.localtime import is_zone, local_instant, parse_wall_clock
from preferences.models import Topic
from preferences.services import recipient_upsert
from projects.scoping import as_client_owner
from templates_app.selectors import TemplateNotFound, template_version_resolve

logger = logging.getLogger(__name__)

PAUSED_REASON = "campaign_paused"
# Two beat processes fire the same schedule within a second or two; a cron cannot fire more often than once
# a minute. A second claim inside this window is the same slot.
SAME_SLOT_SECONDS = 30
# Held deliveries wait "forever": the worker's claim and the relay's wake-up both skip them until resume.
HOLD_FOR = timedelta(days=36500)
EDITABLE = (Campaign.Status.DRAFT, Campaign.Status.SCHEDULED)
# The earliest time zone is 14 hours ahead of UTC (Pacific/Kiritimati): a local-time run that starts when it
# is the wall-clock time there is early for every subscriber; the fan-out holds each delivery until its moment.
EARLIEST_ZONE_AHEAD = timedelta(hours=14)


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(400, "invalid", message, {field: [message]})


def _parse_crontab(expression: str) -> list[str]:
    """Return the five fields of a crontab expression ("m h dom mon dow"), or raise a 400."""
    parts = expression.split()
    if len(parts) != 5:
        raise _invalid("crontab", "Expected five fields: minute hour day-of-month month day-of-week.")
    minute, hour, dom, month, dow = parts
    try:
        celery_crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow)
    except (ValueError, TypeError) as exc:
        raise _invalid("crontab", f"Invalid crontab: {exc}") from None
    return parts


@as_client_owner
def campaign_validate(
    *,
    client: ApiClient,
    template: str,
    category: str | None,
    channels: list[str],
    crontab: str,
    send_at: datetime | None,
    tz: str = "UTC",
    send_at_local: str = "",
) -> str:
    """Check a campaign's definition the way accepting its notification will; return its (the template's) category."""
    if category and category not in settings.NOTIFIER_CATEGORIES:
        raise _invalid("category", "Unknown category.")
    try:
        version = template_version_resolve(template)
    except TemplateNotFound as exc:
        raise _invalid("template", str(exc)) from None
    # Campaign runs ask for no priority: they travel at the category's default, which is within its ceiling.
    category, _ = send_policy(client=client, template_category=version.template.category, category=category)
    missing = [c for c in channels if c not in version.channels]
    if missing:
        raise _invalid("channels", f"Template '{template}' has no content for channel(s): {', '.join(missing)}.")
    if crontab and send_at:
        raise _invalid("send_at", "Give send_at (once) or crontab (recurring), not both.")
    if crontab:
        _parse_crontab(crontab)
    if send_at_local:
        if send_at:
            raise _invalid("send_at_local", "Give send_at or send_at_local, not both.")
        if crontab:
            raise _invalid("send_at_local", "A recurring campaign runs in its time zone; send_at_local is for once.")
        try:
            parse_wall_clock(send_at_local)
        except ValueError as exc:
            message = f"Expected a local date and time such as 2026-12-01T09:00:00: {exc}"
            raise _invalid("send_at_local", message) from None
    if not is_zone(tz or ""):
        raise _invalid("timezone", "Unknown time zone; expected an IANA name such as 'Europe/Berlin'.")
    return category


@as_client_owner
def campaign_create(
    *,
    client: ApiClient,
    name: str,
    template: str,
    topic: str,
    category: str | None = None,
    channels: list[str] | None = None,
    payload: dict[str, Any] | None = None,
    send_at: datetime | None = None,
    crontab: str = "",
    rate_per_second: int = 100,
    draft: bool = False,
    timezone: str = "UTC",  # the campaign's time zone (shadows django.utils.timezone here only)
    send_at_local: str = "",
) -> Campaign:
    """Create a campaign and, unless it is a draft, schedule it (no send_at and no crontab: run now)."""
    topic_obj = Topic.objects.filter(key=topic).first()
    if topic_obj is None:
        raise _invalid("topic", f"Unknown topic '{topic}'.")
    channels = list(channels or [])
    tz = timezone
    category = campaign_validate(
        client=client,
        template=template,
        category=category,
        channels=channels,
        crontab=crontab,
        send_at=send_at,
        tz=tz,
        send_at_local=send_at_local,
    )
    send_at_local = parse_wall_clock(send_at_local).isoformat() if send_at_local else ""
    with transaction.atomic():
        campaign = Campaign.objects.create(
            name=name,
            client=client,
            template_key=template,
            topic=topic_obj,
            category=category,
            channels=channels,
            payload=payload or {},
            send_at=send_at,
            crontab=crontab.strip(),
            rate_per_second=rate_per_second,
            timezone=tz,
            send_at_local=send_at_local,
        )
        if not draft:
            campaign_schedule(campaign=campaign)
    return campaign


def campaign_update(*, campaign: Campaign, **fields: Any) -> Campaign:
    """Change a draft or scheduled campaign (name, template, topic, category, channels, payload, schedule, rate)."""
    if campaign.status not in EDITABLE:
        raise ApiError(409, "invalid_state", f"A {campaign.status} campaign cannot be changed; pause or cancel it.")
    if "topic" in fields:
        topic = Topic.objects.filter(key=fields.pop("topic")).first()
        if topic is None:
            raise _invalid("topic", "Unknown topic.")
        campaign.topic = topic
    if "template" in fields:
        campaign.template_key = fields.pop("template")
        campaign.category = fields.get("category") or ""  # the new template's, unless given
    names = ("name", "category", "channels", "payload", "send_at", "crontab", "rate_per_second", "timezone")
    for name in (*names, "send_at_local"):
        if name in fields:
            setattr(campaign, name, fields.pop(name))
    if fields:
        raise _invalid(next(iter(fields)), "Unknown field.")
    campaign.category = campaign_validate(
        client=campaign.client,
        template=campaign.template_key,
        category=campaign.category or None,
        channels=list(campaign.channels),
        crontab=campaign.crontab,
        send_at=campaign.send_at,
        tz=campaign.timezone,
        send_at_local=campaign.send_at_local,
    )
    if campaign.send_at_local:
        campaign.send_at_local = parse_wall_clock(campaign.send_at_local).isoformat()
    with transaction.atomic():
        campaign.save()
        if campaign.status == Campaign.Status.SCHEDULED:
            campaign_schedule(campaign=campaign)
    return campaign


def campaign_schedule(*, campaign: Campaign) -> Campaign:
    """Give a campaign its beat entry (one-off ClockedSchedule or CrontabSchedule) and mark it scheduled."""
    now = timezone.now()
    with transaction.atomic():
        task = campaign.periodic_task or PeriodicTask(name=f"campaign-{campaign.pk}")
        if campaign.crontab:
            minute, hour, dom, month, dow = _parse_crontab(campaign.crontab)
            schedule, _ = CrontabSchedule.objects.get_or_create(
                minute=minute,
                hour=hour,
                day_of_month=dom,
                month_of_year=month,
                day_of_week=dow,
                timezone=campaign.timezone or "UTC",
            )
            task.crontab, task.clocked, task.one_off = schedule, None, False
        else:
            clocked = ClockedSchedule.objects.create(clocked_time=campaign_starts_at(campaign) or now)
            task.clocked, task.crontab, task.one_off = clocked, None, True
        task.task = task_names.RUN_CAMPAIGN
        task.args = json.dumps([campaign.pk])
        task.queue = "maintenance"
        task.routing_key = "maintenance"
        task.enabled = True
        task.description = f"Campaign {campaign.name!r}"
        task.save()
        campaign.periodic_task = task
        campaign.status = Campaign.Status.SCHEDULED
        campaign.save(update_fields=["periodic_task", "status", "updated_at"])
        starts_at = campaign_starts_at(campaign)
        if not campaign.crontab and (starts_at is None or starts_at <= now):
            # Due now: do not wait for beat's next tick. The claim makes the beat fire that follows a no-op.
            campaign_id = campaign.pk
            transaction.on_commit(lambda: _enqueue_run(campaign_id))
    return campaign


def campaign_starts_at(campaign: Campaign) -> datetime | None:
    """Return when a one-off campaign's run starts: its send_at, or, in local time, the earliest zone's moment."""
    if campaign.send_at_local:
        return parse_wall_clock(campaign.send_at_local).replace(tzinfo=UTC) - EARLIEST_ZONE_AHEAD
    return campaign.send_at


def _enqueue_run(campaign_id: int) -> None:
    try:
        celery_app.send_task(task_names.RUN_CAMPAIGN, args=[campaign_id], queue="maintenance", retry=False)
    except Exception as exc:
        logger.error("campaign %s run not enqueued (beat will fire it): %s", campaign_id, exc)


def run_slot(campaign: Campaign, now: datetime) -> str:
    """Return the run slot of a firing: "once" for a one-off campaign, the minute for a recurring one."""
    return now.strftime("%Y%m%dT%H%M") if campaign.crontab else "once"


_CLAIM_SQL = """
    UPDATE notifier_campaign SET status = 'running', last_run_at = %s, updated_at = %s
    WHERE id = %s AND status = 'scheduled'
      AND (last_run_at IS NULL OR last_run_at < %s - make_interval(secs => %s))
    RETURNING id
"""


def campaign_run(*, campaign_id: int, now: datetime | None = None) -> Notification | None:
    """Run a scheduled campaign once: claim it, create its topic notification; None if it was not due or taken.

    The claim and the notification commit together: a worker dying in between leaves the campaign scheduled
    (its message is redelivered and runs it), and a second firing waits on the row lock and then finds it
    running. The fan-out starts after commit.
    """
    now = now or timezone.now()
    campaign = Campaign.objects.select_related("client", "topic").filter(pk=campaign_id).first()
    if campaign is None:
        return None
    data: dict[str, Any] = {
        "topic": campaign.topic.key,
        "category": campaign.category,
        "template": campaign.template_key,
        "payload": campaign.payload or {},
        "dedup_key": f"campaign-{campaign.pk}-{run_slot(campaign, now)}",
    }
    if campaign.channels:
        data["channels"] = list(campaign.channels)
    if campaign.send_at_local:
        # Each subscriber's not_before is set by the fan-out (the campaign's time zone for those without one).
        data["send_at_local"] = campaign.send_at_local
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(_CLAIM_SQL, [now, now, campaign.pk, now, SAME_SLOT_SECONDS])
                if cursor.fetchone() is None:
                    logger.info("campaign %s not run: not scheduled, or already run in this slot", campaign.pk)
                    return None
            result = notification_accept(client=campaign.client, data=data)
            if result.duplicate:
                logger.warning("campaign %s slot already has notification %s", campaign.pk, result.notification.pk)
            Notification.objects.filter(pk=result.notification.pk, campaign__isnull=True).update(campaign=campaign)
    except ApiError as exc:
        # The definition no longer holds (template or category removed): park it as a draft for a human.
        Campaign.objects.filter(pk=campaign.pk).update(status=Campaign.Status.DRAFT, updated_at=timezone.now())
        logger.error("campaign %s could not run and went back to draft: %s", campaign.pk, exc.message)
        return None
    notification = result.notification
    notification.campaign = campaign
    return notification


def _set_status(campaign: Campaign, *, to: str, only_from: tuple[str, ...]) -> None:
    """Move a campaign's status with a conditional UPDATE (row-locked until commit), or raise a 409."""
    moved = Campaign.objects.filter(pk=campaign.pk, status__in=only_from).update(status=to, updated_at=timezone.now())
    if not moved:
        current = Campaign.objects.filter(pk=campaign.pk).values_list("status", flat=True).first()
        raise ApiError(409, "invalid_state", f"The campaign is {current}; it cannot become {to}.")
    campaign.status = to


def pausable_from(campaign: Campaign) -> tuple[str, ...]:
    """Return the statuses a campaign can be paused from.

    A local-time campaign is done once its fan-out is, while its deliveries may wait a day for their
    subscribers' moment: it can still be paused (and resumed, which keeps each delivery's local time).
    """
    if campaign.send_at_local and not campaign.crontab:
        return (Campaign.Status.SCHEDULED, Campaign.Status.RUNNING, Campaign.Status.DONE)
    return (Campaign.Status.SCHEDULED, Campaign.Status.RUNNING)


def campaign_pause(*, campaign: Campaign) -> int:
    """Pause a campaign: stop its fan-out and schedule, hold its not-yet-sent deliveries; return how many."""
    now = timezone.now()
    with transaction.atomic():
        # Waits for a fan-out page in flight (it holds the row FOR SHARE), so the hold below sees its rows.
        _set_status(campaign, to=Campaign.Status.PAUSED, only_from=pausable_from(campaign))
        if campaign.periodic_task_id:
            PeriodicTask.objects.filter(pk=campaign.periodic_task_id).update(enabled=False)
        held = deliveries_hold_of_campaign(
            campaign_id=campaign.pk, reason=PAUSED_REASON, until=now + HOLD_FOR, at=now, detail="campaign paused"
        )
    return len(held)


def campaign_resume(*, campaign: Campaign) -> int:
    """Resume a paused campaign: release its held deliveries at the rate cap and continue its fan-out."""
    now = timezone.now()
    with transaction.atomic():
        fanning = list(
            Notification.objects.filter(campaign=campaign, status=Notification.Status.FANNING_OUT).values_list(
                "pk", flat=True
            )
        )
        ran = Notification.objects.filter(campaign=campaign).exists()
        to = Campaign.Status.RUNNING if fanning else Campaign.Status.SCHEDULED
        if ran and not fanning and not campaign.crontab:
            to = Campaign.Status.DONE
        _set_status(campaign, to=to, only_from=(Campaign.Status.PAUSED,))
        if campaign.periodic_task_id and to == Campaign.Status.SCHEDULED:
            PeriodicTask.objects.filter(pk=campaign.periodic_task_id).update(enabled=True)
        released, later = deliveries_release_of_campaign(
            campaign_id=campaign.pk,
            reason=PAUSED_REASON,
            at=now,
            detail="campaign resumed",
            local_times=(lambda ids: _local_times(campaign, ids, now)) if campaign.send_at_local else None,
        )
    rate = campaign.rate_per_second or None
    _publish_paced(released, rate=rate)
    span = len(released) / rate if rate else None
    for notification_id in fanning:
        # The fan-out continues once the released deliveries have had their share of the rate.
        fanout.enqueue_unfinished(notification_id, countdown=span)
    return len(released) + len(later)


def _local_times(campaign: Campaign, delivery_ids: list[int], now: datetime) -> dict[int, datetime]:
    """Return the subscriber's moment of each released delivery of a local-time campaign that is not yet due."""
    wall = parse_wall_clock(campaign.send_at_local)
    zones = Delivery.objects.filter(pk__in=delivery_ids).values_list("pk", "recipient__timezone")
    times = {delivery_id: local_instant(wall, zone_name or campaign.timezone) for delivery_id, zone_name in zones}
    return {delivery_id: at for delivery_id, at in times.items() if at > now}


def _publish_paced(rows: list[tuple[int, str, str]], *, rate: int | None) -> None:
    """Publish released deliveries at most `rate` per second (delayed messages); the relay covers failures."""
    groups = group_by_queue(rows)
    if not rate:
        mark_published(publish(groups))
        return
    chunk = max(1, min(settings.SEND_BATCH_SIZE, rate))
    offset = 0
    for queue, ids in groups.items():
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            mark_published(publish({queue: part}, countdown=offset / rate, batch_size=chunk))
            offset += len(part)


def campaign_cancel(*, campaign: Campaign) -> int:
    """Cancel a campaign: no further runs, its fan-out stops, deliveries not yet sent are cancelled."""
    with transaction.atomic():
        _set_status(
            campaign,
            to=Campaign.Status.CANCELLED,
            only_from=tuple(s for s in Campaign.Status.values if s != Campaign.Status.CANCELLED),
        )
        if campaign.periodic_task_id:
            PeriodicTask.objects.filter(pk=campaign.periodic_task_id).update(enabled=False)
    cancelled = 0
    for notification in Notification.objects.filter(campaign=campaign):
        cancelled += notification_cancel(notification=notification)
    return cancelled


@as_client_owner
def campaign_test_send(
    *, client: ApiClient, template: str, category: str, payload: dict[str, Any], staff_user_id: str, email: str
) -> Notification:
    """Send a campaign's template once, by email, to the marketer's own address, through the real pipeline.

    The marketer is a recipient of their own ("staff:<id>") so the test is an ordinary delivery: rendered,
    rate-limited, compliance-checked and recorded like every other.
    """
    if not email:
        raise _invalid("email", "Your user has no email address to send a test to.")
    version = template_version_resolve(template)
    if "email" not in version.channels:
        raise _invalid("template", f"Template '{template}' has no email content: a test goes to your email.")
    user_id = f"staff:{staff_user_id}"
    recipient_upsert(user_id=user_id, email=email)
    data = {
        "recipient": {"user_id": user_id},
        "category": category,
        "template": template,
        "channels": ["email"],
        "payload": payload,
    }
    return notification_accept(client=client, data=data).notification
