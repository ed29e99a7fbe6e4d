"""core.db.insert_rows writes what the ORM writes, whichever of its per-type shortcuts a value takes."""

from __future__ import annotations

import json
import uuid
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from core.db import InstanceBuilder, bound_cursor, insert_rows, json_rows, texts_param
from notifier.deliveries.models import Delivery, Notification
from tests.factories import make_api_client, make_recipient

pytestmark = pytest.mark.django_db(transaction=True)

COMPARED = (
    "id",
    "payload",
    "channels",
    "send_at",
    "fallback_until",
    "updated_at",
    "created_at",
    "status",
    "priority",
    "dedup_key",
)


def _stored(model: Any, pk: Any) -> dict[str, Any]:
    row = model.objects.filter(pk=pk).values(*COMPARED if model is Notification else ("id",)).get()
    return dict(row)


def test_aware_datetimes_uuids_json_and_choices_are_stored_as_the_orm_stores_them() -> None:
    client, recipient = make_api_client(), make_recipient()
    at = datetime(2026, 12, 4, 9, 30, 15, 123456, tzinfo=UTC)
    values: dict[str, Any] = {
        "client": client,
        "recipient": recipient,
        "user_id": recipient.user_id,
        "category": "transactional",
        "template_key": "t",
        "priority": "high",
        "channels": ["email", "sms"],
        "payload": {"n": 1, "nested": {"list": [1, "ü", None]}, "at": "2026-12-04"},
        "send_at": at,
        "fallback_until": "delivered",
        "status": Notification.Status.SCHEDULED,  # a TextChoices member, a str subclass
        "dedup_key": "k-1",
    }
    fast = InstanceBuilder(Notification).new(id=uuid.uuid4(), **values)
    insert_rows([fast])
    orm = Notification(id=uuid.uuid4(), **values)
    orm.save(force_insert=True)

    got, want = _stored(Notification, fast.pk), _stored(Notification, orm.pk)
    assert got.pop("id") == fast.pk and want.pop("id") == orm.pk
    for stamp in ("created_at", "updated_at"):  # set at insert
        assert got.pop(stamp).tzinfo is not None and want.pop(stamp).tzinfo is not None
    assert got == want
    assert got["send_at"] == at and got["payload"]["nested"] == {"list": [1, "ü", None]}


def test_a_naive_datetime_still_warns_and_is_made_aware_as_the_orm_does() -> None:
    client = make_api_client()
    naive = datetime(2026, 12, 4, 9, 30)  # the case under test
    n = InstanceBuilder(Notification).new(
        id=uuid.uuid4(), client=client, category="c", template_key="t", priority="high", send_at=naive
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        insert_rows([n])
    assert any("naive datetime" in str(w.message) for w in caught)
    stored = Notification.objects.get(pk=n.pk).send_at
    assert stored is not None and stored.tzinfo is not None


def test_a_delivery_row_with_booleans_and_a_uuid_foreign_key() -> None:
    client, recipient = make_api_client(), make_recipient(email="a@example.com")
    n = InstanceBuilder(Notification).new(
        id=uuid.uuid4(), client=client, category="c", template_key="t", priority="high", recipient=recipient
    )
    insert_rows([n])
    d = InstanceBuilder(Delivery).new(
        notification=n, recipient=recipient, channel="email", priority="high", address="a@example.com"
    )
    insert_rows([d])
    stored = Delivery.objects.get(pk=d.pk)
    assert stored.notification_id == n.pk and stored.status == Delivery.Status.QUEUED
    for field in Delivery._meta.concrete_fields:
        if field.get_internal_type() == "BooleanField":
            assert getattr(stored, field.attname) == getattr(d, field.attname), field.name


def test_texts_param_reads_back_every_string_as_it_was() -> None:
    texts = ["plain", "with 'quote'", 'with "double"', "back\\slash", "{brace,comma}", "ünïcode", "", "NULL"]
    connection.ensure_connection()
    with bound_cursor() as cursor:
        cursor.execute("SELECT jsonb_array_elements_text(%s::jsonb)", [texts_param(texts)])
        assert [row[0] for row in cursor.fetchall()] == texts


def test_json_rows_writes_the_standard_encoders_values_and_leaves_what_orjson_refuses_to_it() -> None:
    at = datetime(2026, 12, 4, 9, 30, 15, 123456, tzinfo=UTC)
    whole = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)  # no microseconds: isoformat writes none
    naive = datetime(2026, 12, 4, 9, 30)
    key = uuid.uuid4()
    status = Notification.Status.SCHEDULED  # a str subclass
    rows = [[1, -7, 'ü \\ "q"', None, True, False, at, whole, naive, key, {"k": [1, 2.5, "x"]}, ["a"], status]]
    standard = json.dumps(
        rows, separators=(",", ":"), default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)
    )
    assert json.loads(json_rows(rows)) == json.loads(standard)

    # Past 64 bits orjson refuses an integer; the standard encoder writes it, and PostgreSQL reads it back whole.
    big = [[10**30, "x"]]
    assert json_rows(big) == json.dumps(big, separators=(",", ":"))
    connection.ensure_connection()
    with bound_cursor() as cursor:
        cursor.execute("SELECT (e->>0)::numeric FROM jsonb_array_elements(%s::jsonb) AS e", [json_rows(big)])
        assert cursor.fetchall() == [(10**30,)]
    with pytest.raises(TypeError, match="cannot encode object"):
        json_rows([[object()]])
