"""Digests end to end: sends over the API, the hourly flush, a real Celery send worker, the email in the sandbox."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from notifier.deliveries.models import Delivery
from notifier.dispatch.digest import digest_flush
from tests.conftest import wait_for

ITEM = {"en": {"email": {"subject": "{{ title }}", "text": "{{ title }}: {{ body }}"}}}
# What the digest template reads (docs/preferences.md, "Digests"): `items`, each {"template", "payload"}, and `count`.
DIGEST = {
    "en": {
        "email": {
            "subject": "{{ count }} updates",
            "text": "{% for item in items %}- {{ item.payload.title }}: {{ item.payload.body }}\n{% endfor %}",
        }
    }
}


def _put_template(api: Any, key: str, category: str, content: dict[str, Any]) -> None:
    body = {"category": category, "default_locale": "en", "content": content}
    answer = api.put(f"/api/v1/templates/{key}", body, format="json")
    assert answer.status_code in (200, 201), answer.content


def _emails(api: Any) -> list[dict[str, Any]]:
    answer = api.get("/api/v1/sandbox/messages", {"channel": "email"})
    assert answer.status_code == 200, answer.content
    return list(answer.json()["results"])


@pytest.mark.django_db(transaction=True)
def test_two_marketing_items_on_hourly_digest_arrive_as_one_email_after_the_flush(
    api: Any, start_worker: Any, django_capture_on_commit_callbacks: Any
) -> None:
    _put_template(api, "promo", "marketing", ITEM)
    _put_template(api, "digest", "marketing", DIGEST)
    assert api.put("/api/v1/recipients/dig-1", {"email": "dig-1@example.com"}, format="json").status_code == 201
    preferences = {"categories": {"marketing": {"enabled": True, "frequency": "hourly_digest"}}}
    answer = api.put("/api/v1/recipients/dig-1/preferences", preferences, format="json")
    assert answer.status_code == 200, answer.content
    start_worker(queues=["email.high", "email.low"])

    items = [("Spring sale", "30% off boots"), ("New arrivals", "linen shirts are in")]
    for title, body in items:
        sent = api.post(
            "/api/v1/notifications",
            {"recipient": {"user_id": "dig-1"}, "template": "promo", "payload": {"title": title, "body": body}},
            format="json",
        )
        assert sent.status_code == 202, sent.content
        assert [(d["status"], d["reason"]) for d in sent.json()["deliveries"]] == [("deferred", "digest:hourly_digest")]

    # The hour ends: the flush beat runs hourly takes what was parked up to now (its publish runs on commit).
    with django_capture_on_commit_callbacks(execute=True):
        assert digest_flush(frequency="hourly_digest", now=timezone.now()) == 1

    digest = Delivery.objects.get(notification__template_key="digest")
    wait_for(lambda: Delivery.objects.filter(pk=digest.pk, status__in=["sent", "failed"]).exists(), 60)
    digest.refresh_from_db()
    assert (digest.status, digest.last_error) == ("sent", "")
    [email] = _emails(api)
    assert email["delivery_id"] == digest.pk and email["address"] == "dig-1@example.com"
    assert email["content"]["subject"] == "2 updates"
    text = email["content"]["text"]
    assert "Spring sale: 30% off boots" in text and "New arrivals: linen shirts are in" in text
    assert set(Delivery.objects.exclude(pk=digest.pk).values_list("status", flat=True)) == {"digested"}
