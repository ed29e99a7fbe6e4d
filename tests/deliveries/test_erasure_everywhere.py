"""Erasing a recipient leaves nothing of them anywhere: every table (walked through the catalog) and the archive.

The day is archived to moto's S3 and restored before the erasure; afterwards every string in every archived
file is searched as well, and the restored tables are part of the catalog walk.

Notifications on every channel go through the real send path in process (channels_app.services.deliver, the
sandbox providers), with a status-event endpoint so status events are written too, and audited changes over
the API. Each person also clicks a tracked link of an email (the link carries their user_id and marker), and
runs a workflow whose digest merges two triggers before its send step, with a third trigger left waiting in
an open digest. Then the recipient is erased over the API and every text, character and JSON column of every
table in the database (partitions included: the catalog lists them) is searched for their email, phone,
user_id, device token and a marker from their payloads, and so is what the API answers for each of their
notifications. A bystander's data is searched the same way and must still be found, so the search itself is
shown to work.
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from channels_app.models import SandboxMessage
from channels_app.services import deliver
from notifier.deliveries import archive, tasks
from notifier.deliveries.models import Delivery, DeliveryEvent, Notification
from notifier.statusevents.models import EventEndpoint
from notifier.workflows.models import WorkflowDigest, WorkflowRun
from notifier.workflows.services import runs_advance
from preferences.models import Recipient
from tests.factories import make_staff_user
from tests.stubs import aws
from tests.stubs.aws import MotoServer

pytestmark = pytest.mark.django_db

TEXT_TYPES = ("text", "character varying", "character", "json", "jsonb", "ARRAY")
CHANNELS = ["email", "sms", "push", "inapp", "webhook"]
CONTENT = {
    "en": {
        "email": {
            "subject": "Hi {{ name }}",
            "text": "{{ marker }} for {{ contact }}",
            # A tracked link: the click's URL carries the person's user_id and marker.
            "html": '<p>{{ marker }}</p><a href="https://shop.example.com/u/{{ name }}?m={{ marker }}">open</a>',
        },
        "sms": {"text": "{{ marker }} {{ contact }}"},
        "push": {"title": "{{ marker }}", "body": "{{ contact }}", "data": {"m": "{{ marker }}"}},
        "inapp": {"title": "{{ marker }}", "body": "{{ contact }}"},
        "webhook": {"body": {"marker": "{{ marker }}", "contact": "{{ contact }}"}},
    }
}


# A digest keyed by the person's contact (the key and the step reasons quote it), then a send whose condition
# reads their marker (its reason quotes the value).
WORKFLOW = [
    {"id": "batch", "type": "digest", "window_seconds": 3600, "key": "{{ contact }}"},
    {"id": "mail", "type": "send", "channel": "email", "template": "erase-t", "if": {"payload": "marker",
     "exists": True}},
]  # fmt: skip


class Person:
    """One recipient's identifying values, unique to this test run."""

    def __init__(self, label: str, n: int) -> None:
        tag = uuid.uuid4().hex[:10]
        self.user_id = f"{label}-{tag}"
        self.email = f"{label}.{tag}@example.com"
        self.phone = f"+1415555{n:04d}"
        self.token = f"device-token-{label}-{tag}"
        self.marker = f"MARKER-{label}-{tag}"

    def values(self) -> dict[str, str]:
        return {"email": self.email, "phone": self.phone, "user_id": self.user_id, "token": self.token,
                "marker": self.marker}  # fmt: skip


def text_columns() -> list[tuple[str, str, str]]:
    """Return (schema, table, column) of every text-like column of every table, from the catalog."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_schema, c.table_name, c.column_name FROM information_schema.columns c"
            " JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
            " WHERE c.table_schema NOT IN ('pg_catalog', 'information_schema') AND t.table_type = 'BASE TABLE'"
            " AND c.data_type = ANY(%s) ORDER BY 1, 2, 3",
            [list(TEXT_TYPES)],
        )
        return [tuple(row) for row in cursor.fetchall()]


def find_everywhere(values: dict[str, str]) -> list[str]:
    """Return "table.column: what" for every column holding any of `values` (case-insensitively)."""
    hits = []
    columns = text_columns()
    assert len(columns) > 50  # the walk sees the whole schema, partitions included
    with connection.cursor() as cursor:
        for schema, table, column in columns:
            for what, value in values.items():
                cursor.execute(
                    f'SELECT count(*) FROM "{schema}"."{table}" WHERE "{column}"::text ILIKE %s',
                    [f"%{value}%"],
                )
                if cursor.fetchone()[0]:
                    hits.append(f"{schema}.{table}.{column}: {what}")
    return hits


def _send_all(api: Any, person: Person) -> list[int]:
    ids = []
    for n in range(2):
        resp = api.post(
            "/api/v1/notifications",
            {
                "recipient": {"user_id": person.user_id},
                "template": "erase-t",
                "category": "transactional",
                "channels": CHANNELS,
                "payload": {"marker": person.marker, "contact": person.email, "name": person.user_id, "n": n},
            },
            format="json",
        )
        assert resp.status_code == 202, resp.content
        ids += [d["id"] for d in resp.json().get("deliveries", [])]
    if not ids:
        ids = list(Delivery.objects.filter(recipient__user_id=person.user_id).values_list("pk", flat=True))
    return ids


def _trigger(api: Any, person: Person, contact: str, n: int) -> str:
    payload = {"marker": person.marker, "contact": contact, "name": person.user_id, "n": n}
    body = {"recipient": {"user_id": person.user_id}, "workflow": "erase-wf", "payload": payload}
    resp = api.post("/api/v1/notifications", body, format="json")
    assert resp.status_code == 202, resp.content
    return str(resp.json()["id"])


def _run_workflow(api: Any, person: Person) -> list[str]:
    """Run the digest workflow to its sent email, and leave one more run waiting; return the notification ids."""
    merged = [_trigger(api, person, person.email, n) for n in (10, 11)]
    waiting = _trigger(api, person, person.phone, 12)
    runs = {str(r.notification_id): r.pk for r in WorkflowRun.objects.filter(user_id=person.user_id)}
    runs_advance(run_ids=list(runs.values()))
    leader = runs[merged[0]]
    # The window closes by the database's clock, which stands still in this test's transaction: move it back.
    past = timezone.now() - timedelta(days=1)
    WorkflowDigest.objects.filter(leader_id=leader).update(closes_at=past)
    WorkflowRun.objects.filter(pk=leader).update(wake_at=past)
    runs_advance(run_ids=[leader])
    statuses = dict(WorkflowRun.objects.filter(user_id=person.user_id).values_list("notification_id", "status"))
    assert [statuses[uuid.UUID(i)] for i in [*merged, waiting]] == ["done", "merged", "waiting"]
    steps = api.get(f"/api/v1/notifications/{merged[0]}").json()["steps"]
    child = steps[1]["notification_id"]
    sent = list(Delivery.objects.filter(notification_id=child).values_list("pk", flat=True))
    assert len(sent) == 1 and deliver(sent).sent == 1
    return [*merged, waiting, child]


def _click(person: Person, delivery_ids: list[int]) -> None:
    """Click the tracked link of the person's first email (the redirect records the URL)."""
    email = SandboxMessage.objects.filter(delivery_id__in=delivery_ids, channel="email").order_by("id").first()
    link = re.search(r'href="([^"]*/t/c/[^"]+)"', email.content["html"]).group(1)
    answer = Client().get(urlsplit(link).path)
    assert answer.status_code == 302 and person.marker in answer["Location"]


def _setup(api: Any, service: Any, people: list[Person]) -> tuple[dict[str, list[int]], dict[str, list[str]]]:
    """Send, click and run the workflow for each person; return their deliveries and workflow notifications."""
    from templates_app.services import template_put

    template_put(key="erase-t", category="transactional", default_locale="en", content=CONTENT)
    answer = api.put("/api/v1/workflows/erase-wf", {"category": "transactional", "steps": WORKFLOW}, format="json")
    assert answer.status_code == 201, answer.content
    EventEndpoint.objects.create(
        client=service, url="https://events.example.com/hook", secret="s" * 32, statuses=["queued", "sent"]
    )
    sent: dict[str, list[int]] = {}
    flows: dict[str, list[str]] = {}
    for person in people:
        body = {"email": person.email, "phone": person.phone, "webhook_url": "https://hooks.example.com/in"}
        assert api.put(f"/api/v1/recipients/{person.user_id}", body, format="json").status_code in (200, 201)
        devices = api.post(f"/api/v1/recipients/{person.user_id}/devices", {"token": person.token}, format="json")
        assert devices.status_code in (200, 201), devices.content
        ids = _send_all(api, person)
        assert len(ids) == 2 * len(CHANNELS)
        for pk in ids:
            deliver([pk])
        states = set(Delivery.objects.filter(pk__in=ids).values_list("status", flat=True))
        assert states == {"sent"}, states
        _click(person, ids)
        sent[person.user_id] = ids
        flows[person.user_id] = _run_workflow(api, person)
    return sent, flows


@pytest.fixture
def bucket(moto_server: MotoServer, settings: Any) -> Iterator[Any]:
    """A fresh bucket on moto's S3, configured as the archive's; yields a boto3 client of it."""
    client = aws.archive_bucket(moto_server, settings, prefix="erasure")
    yield client
    archive.restore_drop(timezone.now().date())


def archive_strings(client: Any, bucket_name: str) -> tuple[list[str], list[int]]:
    """Return every string value and every recipient_id in every archived file (and the manifests' text)."""
    strings: list[str] = []
    recipient_ids: list[int] = []
    for item in client.list_objects_v2(Bucket=bucket_name).get("Contents", ()):
        body = client.get_object(Bucket=bucket_name, Key=item["Key"])["Body"].read()
        if not item["Key"].endswith(".parquet"):
            strings.append(body.decode())
            continue
        for column in pq.read_table(io.BytesIO(body)).to_pylist():
            for name, value in column.items():
                if isinstance(value, str):
                    strings.append(value)
                elif isinstance(value, list):
                    strings.extend(str(v) for v in value)
                if name == "recipient_id" and value is not None:
                    recipient_ids.append(value)
    return strings, recipient_ids


def api_answers(api: Any, notification_ids: list[str]) -> str:
    """Return what the API answers for each notification (its deliveries' events and workflow steps too), as text."""
    texts = []
    for pk in notification_ids:
        answer = api.get(f"/api/v1/notifications/{pk}")
        assert answer.status_code == 200, answer.content
        texts.append(answer.content.decode())
    return "\n".join(texts)


def test_erasure_leaves_no_trace_in_any_table_or_the_archive(
    api: Any, service: Any, client: Any, bucket: Any, settings: Any
) -> None:
    categories = {name: dict(rules) for name, rules in settings.NOTIFIER_CATEGORIES.items()}
    categories["transactional"]["track"] = {"clicks": True}
    settings.NOTIFIER_CATEGORIES = categories
    victim, bystander = Person("victim", 1), Person("bystander", 2)
    sent, flows = _setup(api, service, [victim, bystander])
    victim_pk = Recipient.objects.get(user_id=victim.user_id).pk
    victim_notifications = [
        str(pk) for pk in Notification.objects.filter(user_id=victim.user_id).values_list("pk", flat=True)
    ]
    assert set(flows[victim.user_id]) <= set(victim_notifications)
    # Staff changed the recipient in the admin: its history names the object by the user_id.
    staff_user = make_staff_user("eraser", superuser=True)
    for person in (victim, bystander):
        row = Recipient.objects.get(user_id=person.user_id)
        LogEntry.objects.create(
            user=staff_user, content_type=ContentType.objects.get_for_model(Recipient), object_id=str(row.pk),
            object_repr=str(row), action_flag=CHANGE, change_message='[{"changed": {"fields": ["Email"]}}]',
        )  # fmt: skip
    today = timezone.now().date()
    archive.archive_day(today)
    archive.restore_day(today)
    before = find_everywhere(victim.values())
    # Sanity: before the erasure the values are found where they live, the restored archive included.
    for where in (
        "notifier_notification.payload",
        "channels_app_sandboxmessage",
        "archive.notification_",
        "notifier_deliveryevent.detail",
        "archive.delivery_event_",
        "workflows_workflowrun.user_id",
        "workflows_workflowrun.digest",
        "workflows_workflowdigest.events",
        "workflows_workflowdigest.key",
        "workflows_workflowstep.reason",
    ):
        assert any(where in hit for hit in before), (where, before)
    strings, ids = archive_strings(bucket, settings.ARCHIVE_BUCKET)
    assert victim.user_id in strings and victim_pk in ids
    answers = api_answers(api, victim_notifications)
    assert victim.marker in answers and victim.email in answers and victim.phone in answers

    assert api.delete(f"/api/v1/recipients/{victim.user_id}").status_code == 204
    # The archive's part runs after commit as a task; here its body runs in place of the worker.
    assert tasks.archive_forget_recipient(victim_pk, today.isoformat()) == [today.isoformat()]

    assert find_everywhere(victim.values()) == []
    assert not [v for v in victim.values().values() if v in api_answers(api, victim_notifications)]
    strings, ids = archive_strings(bucket, settings.ARCHIVE_BUCKET)
    assert victim_pk not in ids
    assert not [s for s in strings if any(v in s for v in victim.values().values())]
    assert bystander.user_id in strings
    assert archive.archive_complete(today)  # the rewritten day has its manifest, checksums included
    assert sum(archive.restore_day(today).values()) > 0
    kept = find_everywhere(bystander.values())
    for where in (
        "notifier_notification.payload",
        "notifier_notification.user_id",
        "notifier_delivery.address",
        "notifier_statusevent.data",
        "preferences_recipient.user_id",
        "channels_app_sandboxmessage",
        "notifier_deliveryevent.detail",
        "workflows_workflowrun.user_id",
        "workflows_workflowdigest.events",
        "workflows_workflowstep.reason",
    ):
        assert any(where in hit for hit in kept), (where, kept)  # fmt: skip
    # The rows themselves stay: history and counts still add up.
    assert Delivery.objects.filter(pk__in=sent[victim.user_id], status="sent").count() == 2 * len(CHANNELS)
    clicks = DeliveryEvent.objects.filter(delivery_id__in=sent[victim.user_id], status="clicked")
    assert list(clicks.values_list("detail", flat=True)) == ["redirect"]  # the click counts, its URL is gone
    # The run still waiting for its digest ends there: what it would render is gone.
    runs = [api.get(f"/api/v1/notifications/{pk}").json() for pk in flows[victim.user_id][:3]]
    assert [r["run_status"] for r in runs] == ["done", "merged", "cancelled"]
    assert [s["status"] for s in runs[2]["steps"]] == ["cancelled", "cancelled"]

    # The admin shows "erased" instead of rendering the message again from what is left.
    assert client.login(username="eraser", password="pw-123456")
    for pk in sent[victim.user_id][: len(CHANNELS)]:
        page = client.get(reverse("admin:deliveries_delivery_change", args=[pk])).content.decode()
        assert "Erased" in page
        assert victim.marker not in page and victim.email not in page
    page = client.get(reverse("admin:deliveries_delivery_change", args=[sent[bystander.user_id][0]])).content.decode()
    assert bystander.marker in page
