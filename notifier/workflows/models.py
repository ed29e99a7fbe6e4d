"""Workflow definitions (versioned), their runs per recipient, the steps each run reached, and digest groups."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from projects.scoping import OwnedManager, owner_field


class Workflow(models.Model):
    """A named workflow; what it does is in its versions (every PUT adds one)."""

    environment = owner_field()

    key = models.SlugField(max_length=128)
    latest_version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["environment", "key"], name="workflow_environment_key_uniq")]

    def __str__(self) -> str:
        return self.key


class WorkflowVersion(models.Model):
    """One immutable version of a workflow: its category and its list of steps."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    category = models.CharField(max_length=64)
    steps = models.JSONField()
    created_by = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("workflow__environment_id")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "version"], name="workflow_version_unique")]
        ordering = ["workflow", "-version"]

    def __str__(self) -> str:
        return f"{self.workflow.key}@{self.version}"


class WorkflowTrigger(models.Model):
    """The workflow version a triggering notification started (one per notification; a topic's runs share it)."""

    notification_id = models.UUIDField(unique=True)
    version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="triggers")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("version__workflow__environment_id")

    def __str__(self) -> str:
        return f"trigger {self.notification_id}"


class WorkflowRun(models.Model):
    """One recipient's run of a workflow version: where it is (`step_index`) and when it wakes."""

    class Status(models.TextChoices):
        RUNNING = "running"  # its current step is to be decided (an advance message is on its way)
        WAITING = "waiting"  # its current step waits until wake_at (a delay, a digest window)
        DONE = "done"
        MERGED = "merged"  # joined another run's digest
        THROTTLED = "throttled"
        CANCELLED = "cancelled"
        FAILED = "failed"

    # No database FK to the partitioned notifications (their table has no unique id of its own across days).
    notification_id = models.UUIDField()
    version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="runs")
    client_id = models.BigIntegerField()
    recipient_id = models.BigIntegerField()
    user_id = models.CharField(max_length=255)
    priority = models.CharField(max_length=8)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    step_index = models.PositiveSmallIntegerField(default=0)
    wake_at = models.DateTimeField(null=True, blank=True)
    # When an advance message for this run was last published; the wake relay re-publishes a stale one.
    published_at = models.DateTimeField(null=True, blank=True)
    # {"count", "events", "key"} once this run's digest window closed: the later steps' templates read it.
    digest = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = OwnedManager("version__workflow__environment_id")

    class Meta:
        constraints = [
            # A topic page redone after a crash creates no second run for a subscriber.
            models.UniqueConstraint(fields=["notification_id", "recipient_id"], name="workflow_run_unique"),
        ]
        indexes = [
            models.Index(
                fields=["wake_at"], condition=Q(status__in=["running", "waiting"]), name="workflow_run_live_idx"
            ),
            models.Index(fields=["recipient_id", "-created_at"], name="workflow_run_recipient_idx"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.user_id})"


class WorkflowStep(models.Model):
    """A step a run reached: its outcome and why (a step not reached yet has no row and reads `pending`)."""

    class Status(models.TextChoices):
        WAITING = "waiting"
        DONE = "done"
        SKIPPED = "skipped"
        MERGED = "merged"
        THROTTLED = "throttled"
        FAILED = "failed"
        CANCELLED = "cancelled"

    run = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveSmallIntegerField()
    step_id = models.CharField(max_length=64)
    type = models.CharField(max_length=16)
    status = models.CharField(max_length=16, choices=Status.choices)
    reason = models.TextField(blank=True, default="")
    # The notification a send step created (its deliveries are the step's).
    notification_id = models.UUIDField(null=True, blank=True)
    at = models.DateTimeField()

    objects = OwnedManager("run__version__workflow__environment_id")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="workflow_step_unique")]
        ordering = ["run", "index"]

    def __str__(self) -> str:
        return f"{self.step_id}: {self.status}"


class WorkflowDigest(models.Model):
    """An open digest group: the runs of one workflow step, recipient and rendered key within one window.

    The partial unique index is the arbiter of racing triggers (INSERT … ON CONFLICT): the first run leads,
    the others append their payload and end `merged`. The window closes by the database's clock.
    """

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="digests")
    step_id = models.CharField(max_length=64)
    recipient_id = models.BigIntegerField()
    key = models.CharField(max_length=255)
    leader = models.ForeignKey(WorkflowRun, on_delete=models.CASCADE, related_name="led_digests")
    events = models.JSONField(default=list)
    count = models.PositiveIntegerField(default=1)
    closes_at = models.DateTimeField()
    closed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OwnedManager("workflow__environment_id")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "step_id", "recipient_id", "key"],
                condition=Q(closed=False),
                name="workflow_digest_open_unique",
            )
        ]

    def __str__(self) -> str:
        return f"digest {self.key} ({self.count})"
