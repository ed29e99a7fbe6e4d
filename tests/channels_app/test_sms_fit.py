"""SMS that fits: encoding and segments on each SMS delivery, in the API, preview and metrics; too_long fails early."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from channels_app import renderings
from channels_app.models import SandboxMessage
from channels_app.services import deliver
from core import metrics
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert
from templates_app import selectors as template_selectors
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.factories import make_staff_user

CONTENT = {"en": {"sms": {"text": "{{ text }}"}}}


def _send(api: Any, text: str, user_id: str = "sms-1") -> dict[str, Any]:
    response = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": user_id}, "template": "say", "category": "transactional", "payload": {"text": text}},
        format="json",
    )
    assert response.status_code == 202, response.content
    return response.json()


def _segments_total(encoding: str) -> float:
    return metrics.SMS_SEGMENTS.labels(encoding)._value.get()


@pytest.mark.django_db(transaction=True)
def test_sms_deliveries_know_their_encoding_and_segments_and_too_long_fails(
    api: Any, start_worker: Any, settings: Any
) -> None:
    template_put(key="say", category="transactional", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="sms-1", phone="+15005550006")
    start_worker(queues=["sms.high"], env={"SMS_MAX_SEGMENTS": "2"})
    cases = {
        "gsm": ("Hello [world] " + "a" * 140, "gsm7", 1),  # 154 + 2 escapes = 156 septets: one part
        "ext": ("€" * 81, "gsm7", 2),  # 162 septets
        "emoji": ("Hi 😀", "ucs2", 1),
        "long": ("я" * 135, "ucs2", 3),  # 135 > 2 * 67: over the limit of 2
    }
    ids = {name: _send(api, text)["id"] for name, (text, _, _) in cases.items()}
    wait_for(lambda: Delivery.objects.filter(status__in=["sent", "failed"]).count() == 4, 60)
    for name, (_, encoding, segments) in cases.items():
        detail = api.get(f"/api/v1/notifications/{ids[name]}").json()
        (sms,) = detail["deliveries"]
        assert (sms["encoding"], sms["segments"]) == (encoding, segments), name
        if name == "long":
            assert sms["status"] == "failed" and sms["reason"] == "too_long"
            assert "3 segments" in sms["last_error"]
            assert [e["status"] for e in sms["events"]] == ["queued", "sending", "failed"]
            # No provider was called: the sandbox recorded nothing for it.
            assert not SandboxMessage.objects.filter(delivery_id=sms["id"]).exists()
        else:
            assert sms["status"] == "sent"
            assert SandboxMessage.objects.filter(delivery_id=sms["id"]).count() == 1


@pytest.mark.django_db(transaction=True)
def test_sent_segments_are_counted_by_encoding(api: Any, settings: Any) -> None:
    """The worker pipeline (run in this process) counts what it sent, by encoding; a failed one is not counted."""
    settings.SMS_MAX_SEGMENTS = 6
    # The in-process pipeline caches template versions by key: ids from an earlier test's rows are stale.
    template_selectors._exact_versions.clear()
    renderings.forget()
    template_put(key="say", category="transactional", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="sms-1", phone="+15005550006")
    before = {enc: _segments_total(enc) for enc in ("gsm7", "ucs2")}
    _send(api, "a" * 307)  # 3 gsm7
    _send(api, "😀" * 36)  # 2 ucs2
    _send(api, "я" * 500)  # 8 ucs2: too long
    report = deliver(list(Delivery.objects.order_by("id").values_list("id", flat=True)))
    assert report.sent == 2 and report.failed == 1
    assert _segments_total("gsm7") - before["gsm7"] == 3
    assert _segments_total("ucs2") - before["ucs2"] == 2


@pytest.mark.django_db
def test_preview_shows_encoding_segments_and_warns(api: Any, settings: Any) -> None:
    settings.SMS_MAX_SEGMENTS = 2
    template_put(key="say", category="transactional", default_locale="en", content=CONTENT)

    def preview(text: str) -> dict[str, Any]:
        response = api.post("/api/v1/templates/say/preview", {"payload": {"text": text}}, format="json")
        assert response.status_code == 200, response.content
        return response.json()["channels"]["sms"]["sms"]

    short = preview("Your code is 1234")
    assert short == {"encoding": "gsm7", "units": 17, "segments": 1, "max_segments": 2, "warning": ""}
    assert "UCS-2" in preview("Code 1234 ✓")["warning"]
    two = preview("a" * 200)
    assert two["segments"] == 2 and "billed" in two["warning"]
    over = preview("a" * 400)
    assert over["segments"] == 3 and "too_long" in over["warning"]

    staff = Client()
    staff.force_login(make_staff_user("support", superuser=True))
    from templates_app.models import TemplateVersion

    version = TemplateVersion.objects.get(template__key="say")
    url = reverse("admin:templates_app_templateversion_preview", args=[version.pk])
    page = staff.post(url, {"payload": json.dumps({"text": "a" * 400}), "locale": "en"})
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="sms-info"' in body and "<strong>3</strong> segments" in body
    assert 'id="sms-warning"' in body and "too_long" in body
