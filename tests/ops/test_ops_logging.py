"""Structured logs: bound ids appear as JSON keys and personal data is masked in every field."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core.logs import (
    BULK_LINES,
    bind_delivery_context,
    bound_log_context,
    clear_log_context,
    get_logger,
    json_formatter,
    mask_text,
)
from core.logs import log_lines as write_lines

EMAIL = "jane.doe+news@example.com"
PHONE = "+14155550123"
PHONE_SPACED = "+44 20 7946 0958"
PUSH_TOKEN = "dQw4w9WgXcQ:APA91bH7aK2mZ0pX9yLq3VtR8sN1uE6oI4wB5cD7fG2hJ"


@pytest.fixture
def log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Capture what the root logger writes through the production JSON formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    clear_log_context()
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    root.removeHandler(handler)
    root.setLevel(old_level)
    clear_log_context()


@pytest.mark.pure
def test_bound_ids_are_json_keys_of_stdlib_and_structlog_lines(log_lines: Callable[[], list[dict[str, Any]]]) -> None:
    """A line logged while ids are bound carries notification_id, delivery_id and trace_id as keys."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with bind_delivery_context(
        notification_id="0b5c3a4e-1111-4222-8333-444455556666", delivery_id=1234, trace_id=trace_id
    ):
        logging.getLogger("notifier.test").info("claimed")
        get_logger("notifier.test").info("sent", provider="sandbox")
    logging.getLogger("notifier.test").info("after")

    first, second, after = log_lines()
    for line in (first, second):
        assert line["notification_id"] == "0b5c3a4e-1111-4222-8333-444455556666"
        assert line["delivery_id"] == 1234
        assert line["trace_id"] == trace_id
        assert line["level"] == "info"
        assert "timestamp" in line
    assert first["event"] == "claimed"
    assert second["provider"] == "sandbox"
    # Leaving the block unbinds: nothing leaks into the next line.
    assert "delivery_id" not in after and "trace_id" not in after


@pytest.mark.pure
def test_bulk_lines_written_as_json_directly_equal_what_the_renderer_writes() -> None:
    """The JSON formatter's own encoding of `log_lines` is byte for byte structlog's JSONRenderer's."""
    lines = [
        {"event": "delivery sent", "delivery_id": 1, "attempts": 1, "ok": True, "ratio": 1.0, "gone": None},
        {"event": "delivery sent", "delivery_id": 2, "attempts": True, "ok": 1, "ratio": 1, "tags": ["a", EMAIL]},
        {"event": "delivery failed", "delivery_id": 3, "reason": f'rejected {EMAIL} \u00e9"', "api_key": "k-1"},
        {"event": "delivery failed", "delivery_id": 4, "reason": f'rejected {EMAIL} \u00e9"', "at": object()},
    ]
    record = logging.getLogger("channels_app.services").makeRecord(
        "channels_app.services", logging.INFO, "", 0, "%d lines", (len(lines),), None
    )
    setattr(record, BULK_LINES, lines)
    formatter = json_formatter()
    with bind_delivery_context(task_id="task-9"):
        fast = formatter.format(record)
        formatter.json_lines = False  # the renderer's own path
        rendered = formatter.format(record)
    # An object's text differs by its address only where the object is the same: drop that one field.
    assert [line.split(', "at": ')[0] for line in fast.splitlines()] == [
        line.split(', "at": ')[0] for line in rendered.splitlines()
    ]
    assert len(fast.splitlines()) == 4 and EMAIL not in fast and '"api_key": "' in fast


@pytest.mark.pure
def test_plain_bind_stays_until_cleared() -> None:
    """Without `with`, ids stay bound for the rest of the task until the context is cleared."""
    clear_log_context()
    bind_delivery_context(delivery_id=7, notification_id=None)
    assert bound_log_context() == {"delivery_id": 7}
    clear_log_context()
    assert bound_log_context() == {}


@pytest.mark.pure
def test_masking_removes_email_phone_and_token_from_every_field(log_lines: Callable[[], list[dict[str, Any]]]) -> None:
    """Emails, phone numbers and push tokens are masked in the message, extra fields and nested values."""
    logging.getLogger("notifier.test").warning(
        "send to %s via %s failed for %s", EMAIL, PHONE, PUSH_TOKEN, extra={"detail": {"to": PHONE_SPACED}}
    )
    get_logger("notifier.test").info(
        "provider answered",
        response={"errors": [f"invalid address {EMAIL}", f"token {PUSH_TOKEN} unregistered"]},
        recipient_phone=PHONE,
        note=f"call {PHONE_SPACED}",
    )
    try:
        raise ValueError(f"bounce for {EMAIL}")
    except ValueError:
        logging.getLogger("notifier.test").exception("provider error")

    raw = json.dumps(log_lines())
    for secret in (EMAIL, "jane.doe", PHONE, "4155550123", PHONE_SPACED, "7946 0958", PUSH_TOKEN, "APA91b"):
        assert secret not in raw, secret
    lines = log_lines()
    assert lines[0]["event"] == "send to [email] via [phone] failed for [token]"
    assert lines[0]["detail"] == {"to": "[phone]"}
    assert lines[1]["recipient_phone"] == "[redacted]"
    assert lines[1]["response"]["errors"] == ["invalid address [email]", "token [token] unregistered"]
    assert "ValueError: bounce for [email]" in lines[2]["exception"]


@pytest.mark.pure
def test_masking_keeps_ids_dates_and_paths() -> None:
    """What operators need to read stays: UUIDs, traceparents, dates, times, URL paths and module names."""
    text = (
        "notification 0b5c3a4e-1111-4222-8333-444455556666 at 2026-01-31 12:00:05 "
        "traceparent 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 "
        "GET /api/v1/notifications/42 in channels_app.tasks.send_deliveries attempt 3"
    )
    assert mask_text(text) == text


@pytest.mark.pure
def test_bulk_lines_come_out_one_json_object_each_with_context_and_masking(
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:
    """`log_lines` writes what one call per line would: a line each, bound context, personal data masked."""
    logger = logging.getLogger("channels_app.services")
    with bind_delivery_context(task_id="task-7"):
        write_lines(
            logger,
            logging.INFO,
            [
                {"event": "delivery sent", "delivery_id": 1, "provider": "sandbox"},
                {"event": "delivery failed", "delivery_id": 2, "reason": f"rejected {EMAIL}"},
                # Masking is remembered per field and value within a call: a value seen again is masked again,
                # and values equal as dict keys (1, 1.0, True) keep their own types.
                {"event": "delivery failed", "delivery_id": 1.0, "reason": f"rejected {EMAIL}", "attempts": True},
                {"event": "delivery failed", "delivery_id": True, "attempts": 1},
            ],
        )
    write_lines(logger, logging.DEBUG, [{"event": "not kept", "delivery_id": 3}])  # below the level

    sent, failed, again, typed = log_lines()
    assert again["reason"] == failed["reason"] and EMAIL not in again["reason"]
    assert again["delivery_id"] == 1.0 and isinstance(again["delivery_id"], float) and again["attempts"] is True
    assert typed["delivery_id"] is True and typed["attempts"] == 1 and not isinstance(typed["attempts"], bool)
    assert sent["event"] == "delivery sent" and sent["delivery_id"] == 1 and sent["provider"] == "sandbox"
    assert failed["event"] == "delivery failed" and failed["delivery_id"] == 2
    assert EMAIL not in failed["reason"] and "[email]" in failed["reason"]
    for line in (sent, failed, again, typed):
        assert line["task_id"] == "task-7"
        assert line["level"] == "info" and line["logger"] == "channels_app.services"
        assert line["timestamp"].endswith("Z")


BEAT = ["celery", "-A", "config", "beat", "--loglevel", "INFO", "-S", "django_celery_beat.schedulers:DatabaseScheduler",
        "--max-interval", "1", "--pidfile", ""]  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task_logs", ["false", "true"])
def test_beat_logs_its_scheduled_sends_only_when_task_logs_are_asked_for(start_process: Any, task_logs: str) -> None:
    """The workflow wake-up is due every second: unasked, beat writes no line for it; its other lines pass."""
    beat = start_process("beat", BEAT, {"CELERY_TASK_LOGS": task_logs, "WORKFLOW_WAKE_INTERVAL_SECONDS": "0.5"})
    beat.wait_ready(lambda: "beat: Starting" in beat.log() or "Sending due task" in beat.log(), timeout=60)
    time.sleep(3)
    beat.stop()
    lines = [line for line in beat.log().splitlines() if "Sending due task" in line]
    if task_logs == "true":
        assert any("workflows" in line for line in lines), beat.log()[-2000:]
    else:
        assert lines == [], lines[:3]
        assert "beat: Starting" in beat.log()  # its other lines pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sent_logs", [True, False])
def test_lines_per_delivery_sent_follow_the_setting_and_failures_are_logged_always(
    settings: Any, log_lines: Callable[[], list[dict[str, Any]]], sent_logs: bool
) -> None:
    """DELIVERY_SENT_LOGS=false drops the audit line of each delivery sent, never that of a delivery failed."""
    from channels_app.providers.registry import get_provider
    from channels_app.services import deliver
    from notifier.accepting.services import notification_accept
    from notifier.deliveries.models import Delivery
    from preferences.services import recipient_upsert
    from templates_app.services import template_put
    from tests.factories import make_api_client

    content = {"en": {"email": {"subject": "Hi", "text": "Hello"}}}
    template_put(key="receipt", category="transactional", default_locale="en", content=content)
    settings.DELIVERY_SENT_LOGS = sent_logs
    ids = {}
    try:
        for outcome, behaviour in (("sent", ""), ("failed", "email=permanent")):
            recipient_upsert(user_id=f"log-{outcome}", email=f"log-{outcome}@example.com")
            data = {"recipient": {"user_id": f"log-{outcome}"}, "template": "receipt", "channels": ["email"]}
            notification = notification_accept(client=make_api_client(), data=data).notification
            ids[outcome] = Delivery.objects.get(notification=notification).pk
            settings.SANDBOX_BEHAVIOUR = behaviour
            get_provider.cache_clear()  # the adapter reads its behaviour when built
            deliver([ids[outcome]])
    finally:
        get_provider.cache_clear()

    assert Delivery.objects.get(pk=ids["sent"]).status == Delivery.Status.SENT
    assert Delivery.objects.get(pk=ids["failed"]).status == Delivery.Status.FAILED
    lines = [line for line in log_lines() if line.get("logger") == "channels_app.services"]
    audit = {line["delivery_id"]: line["event"] for line in lines}
    assert audit.get(ids["failed"]) == "delivery failed"
    assert (ids["sent"] in audit) is sent_logs


@pytest.mark.pure
def test_success_lines_let_one_through_per_interval_and_count_the_rest() -> None:
    from notifier.clients.middleware import SuccessLines

    lines = SuccessLines()
    assert lines.take(100.0, 1.0) == 0
    assert [lines.take(100.0 + t, 1.0) for t in (0.1, 0.5, 0.99)] == [None, None, None]
    assert lines.take(101.0, 1.0) == 3  # the next line says how many were left out
    assert lines.take(101.5, 1.0) is None
    assert lines.take(102.2, 1.0) == 1


@pytest.mark.django_db
def test_access_lines_of_successes_are_thinned_by_the_setting_and_refusals_are_logged_each(
    settings: Any, log_lines: Callable[[], list[dict[str, Any]]], api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REQUEST_SUCCESS_LOG_SECONDS thins the lines of requests answered below 400, never those of a 4xx."""
    from django.test import Client

    from notifier.clients import middleware

    def access() -> list[dict[str, Any]]:
        return [line for line in log_lines() if line.get("logger") == "notifier.access"]

    settings.LOG_REQUESTS = True
    settings.REQUEST_SUCCESS_LOG_SECONDS = 0
    for _ in range(3):
        assert api.get("/api/v1/templates").status_code == 200
    assert [line["status"] for line in access()] == [200, 200, 200]  # 0: each one

    monkeypatch.setattr(middleware, "_success_lines", middleware.SuccessLines())
    settings.REQUEST_SUCCESS_LOG_SECONDS = 3600
    for _ in range(3):
        assert api.get("/api/v1/templates").status_code == 200
    assert Client().get("/api/v1/templates").status_code == 401  # no key
    assert api.get("/api/v1/notifications/00000000-0000-0000-0000-000000000000").status_code == 404
    assert [line["status"] for line in access()[3:]] == [200, 401, 404]

    middleware._success_lines._next = 0.0  # the interval is over
    assert api.get("/api/v1/templates").status_code == 200
    last = access()[-1]
    assert last["status"] == 200 and last["successes_not_logged"] == 2
    assert all(line["http_route"].startswith("api/v1/") for line in access())
