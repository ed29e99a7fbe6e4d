"""The accept's fast paths give what the slow ones give: body validation, the answer, new rows, remembered keys."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from django.db.models import signals
from rest_framework import serializers

from core.db import InstanceBuilder
from core.redis_guard import get_redis
from notifier.accepting.serializers import AcceptOutput, NotificationInput, accept_answer, send_input_fast
from notifier.accepting.services import AcceptResult
from notifier.clients.models import ApiClient
from notifier.deliveries import dedup
from notifier.deliveries.models import Delivery, Notification
from preferences.models import Recipient, Topic
from templates_app.services import template_put
from tests.bodies import mixed_bodies

PLAIN = {"recipient": {"user_id": "u-1"}, "template": "hello"}

# Values each field of a plain send may take: valid ones, and ones DRF converts, trims or refuses.
FIELD_VALUES: dict[str, list[Any]] = {
    "recipient": [
        {"user_id": "u-1"},
        {"user_id": " u-1"},
        {"user_id": "u-1\n"},
        {"user_id": ""},
        {"user_id": "   "},
        {"user_id": 42},
        {"user_id": None},
        {"user_id": "ü-1"},
        {"user_id": "u\x00"},
        {"user_id": "x" * 255},
        {"user_id": "x" * 256},
        {"user_id": "u-1", "email": "a@b"},
        {},
        "u-1",
        None,
        ["u-1"],
    ],
    "template": ["hello", "hello@2", "hello@0", "he llo", " hello", "", 7, None, "x" * 141, "hello\n", "héllo"],
    "channels": [
        ["email"],
        ["email", "sms"],
        ["push", "email", "sms", "inapp", "webhook"],
        [],
        ["email", "email"],
        ["fax"],
        "email",
        None,
        [1],
        ("email",),
        ["Email"],
        ["email", None],
        [["email"]],
        [{}],
    ],
    "payload": [{}, {"n": 1}, {"a": {"b": [1, None, "x"]}}, {"s": "\x00"}, {"k\x00": 1}, None, [], "x", {"n": None}],
    "dedup_key": ["k-1", "", " k", "k" * 255, "k" * 256, 5, None, "k\t", "ключ"],
    "priority": ["high", "normal", "low", "HIGH", "", None, 1, "urgent"],
    "category": ["transactional", "marketing", "nope", "", " transactional", None, 3],
    "locale": ["de", "pt-BR", "en_US", "x", "toolonglocale-" * 3, "", None, "de\n", "12"],
    "topic": ["news"],
    "send_at": ["2030-01-01T00:00:00Z"],
    "workflow": ["flow"],
    "unknown": [1],
}


def _drf(data: Any) -> dict[str, Any] | None:
    """Return what NotificationInput returns for `data`, or None if it refuses it."""
    try:
        return dict(NotificationInput().run_validation(data))
    except serializers.ValidationError:
        return None


def _assert_agrees(data: Any) -> bool:
    """Assert that the fast path never differs from DRF; return whether it took the body."""
    fast, slow = send_input_fast(data), _drf(data)
    if fast is None:
        return False
    assert slow is not None, f"the fast path accepted what DRF refuses: {data!r}"
    assert fast == slow, data
    if "recipient" in fast:  # a topic's send has none
        assert type(fast["recipient"]) is dict and fast["recipient"] is not data["recipient"]
    assert fast["payload"] is not data.get("payload")
    return True


@pytest.mark.pure
@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in FIELD_VALUES.items() for v in values])
def test_each_field_value_alone_is_validated_as_drf_validates_it(field: str, value: Any) -> None:
    _assert_agrees({**PLAIN, field: value})


def test_random_bodies_are_validated_as_drf_validates_them_and_plain_ones_take_the_fast_path() -> None:
    fast = 0
    required = {"recipient": {"user_id": "u-1"}, "template": "hello"}
    for body in mixed_bodies(26, FIELD_VALUES, 3000, valid=0.5, present=0.35, required=required):
        fast += _assert_agrees(body)
    assert fast > 100  # the common shapes are not all handed to DRF


@pytest.mark.pure
def test_a_plain_body_is_taken_with_every_field_in_drf_order() -> None:
    body = {
        "locale": "pt-BR", "priority": "low", "dedup_key": "k-1", "payload": {"n": [1, 2]},
        "channels": ["sms", "email"], "template": "hello@3", "category": "marketing", "recipient": {"user_id": "u-9"},
    }  # fmt: skip
    found = send_input_fast(body)
    assert found is not None and list(found) == list(_drf(body) or {})
    assert send_input_fast({"recipient": {"user_id": "u-1"}}) is None  # no template: DRF words the error
    assert send_input_fast([PLAIN]) is None and send_input_fast(None) is None


def _result(*, topic: Topic | None = None, total: int | None = None, duplicate: bool = False) -> AcceptResult:
    client = ApiClient(pk=7, name="c", mode=ApiClient.Mode.TEST)
    notification = Notification(id=uuid.uuid4(), client=client, topic=topic, recipients_total=total)
    recipient = Recipient(pk=3, user_id="u-1")
    deliveries = [
        Delivery(pk=11, notification=notification, recipient=recipient, channel="email", status="queued"),
        Delivery(pk=12, notification=notification, recipient=recipient, channel="sms", status="suppressed",
                 reason="opted_out"),
    ]  # fmt: skip
    return AcceptResult(notification=notification, duplicate=duplicate, deliveries=[] if topic else deliveries)


@pytest.mark.pure
@pytest.mark.parametrize(
    "result",
    [
        _result(),
        _result(duplicate=True),
        _result(topic=Topic(pk=5, key="news")),
        _result(topic=Topic(pk=5, key="news"), total=1200),
    ],
    ids=["user", "duplicate", "topic", "topic-with-total"],
)
def test_the_plain_answer_is_the_serializers(result: AcceptResult) -> None:
    expected = AcceptOutput().to_representation(result)
    found = accept_answer(result)
    assert found == expected and list(found) == list(expected)
    assert set(found) <= set(AcceptOutput().fields)


@pytest.mark.pure
@pytest.mark.parametrize("model", [Notification, Delivery])
def test_built_instances_hold_what_model_init_would(model: type[Any]) -> None:
    assert not signals.pre_init.has_listeners(model) and not signals.post_init.has_listeners(model)
    client = ApiClient(pk=7, name="c")
    recipient = Recipient(pk=3, user_id="u-1")
    if model is Notification:
        values: dict[str, Any] = {"id": uuid.uuid4(), "client": client, "channels": ["email"], "payload": {"n": 1},
                                  "category": "transactional", "send_at": None, "trace_id": "t"}  # fmt: skip
    else:
        parent = Notification(id=uuid.uuid4(), client=client)
        values = {"notification": parent, "recipient": recipient, "channel": "email", "address": "a@b",
                  "status": "suppressed", "reason": "opted_out", "not_before": None}  # fmt: skip
    built, made = InstanceBuilder(model).new(**values), model(**values)
    for field in model._meta.concrete_fields:
        a, b = getattr(built, field.attname), getattr(made, field.attname)
        if callable(field.default) and field.name not in values and not isinstance(a, dict | list):
            assert type(a) is type(b), field.name  # a fresh default each (a time, an id)
        else:
            assert a == b, field.name
    assert built._state.fields_cache == made._state.fields_cache
    assert (built._state.adding, built._state.db) == (made._state.adding, made._state.db) == (True, "default")
    assert InstanceBuilder(model).new(**values).__dict__ is not built.__dict__
    json_field = next((f for f in model._meta.concrete_fields if callable(f.default) and f.default is dict), None)
    if json_field is not None:  # a callable default is called for each instance, never shared
        assert getattr(InstanceBuilder(model).new(), json_field.attname) is not getattr(built, json_field.attname)


def test_keys_written_by_a_batch_are_claimed_for_later_requests(api: Any) -> None:
    template_put(key="hello", category="transactional", default_locale="en",
                 content={"en": {"email": {"subject": "Hi", "text": "Hello"}}})  # fmt: skip
    items = [{**PLAIN, "channels": ["email"], "dedup_key": f"k-{i}"} for i in range(3)]
    results = api.post("/api/v1/notifications/batch", {"notifications": items}, format="json").json()["results"]
    client_id = Notification.objects.get(pk=results[0]["id"]).client_id
    redis = get_redis()
    for i, result in enumerate(results):
        key = dedup._key(client_id, f"k-{i}")
        notification_id, request_hash = str(redis.get(key)).split("|")
        assert notification_id == result["id"]
        assert request_hash == Notification.objects.get(pk=result["id"]).request_hash
        assert 0 < int(redis.ttl(key)) <= settings.DEDUP_TTL_SECONDS
    # An entry already there is kept (SET NX) and answered as held; a claim released by another id stays too.
    assert dedup.claim_many(client_id=client_id, entries=[("k-0", "other", "hash")]) == {"k-0"}
    dedup.release_many(client_id=client_id, entries=[("k-0", "other")])
    assert str(redis.get(dedup._key(client_id, "k-0"))).startswith(results[0]["id"])
    again = api.post("/api/v1/notifications", items[1], format="json")
    assert again.status_code == 200 and again.json()["id"] == results[1]["id"]
