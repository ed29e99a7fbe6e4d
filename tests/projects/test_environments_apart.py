"""Nothing folds, counts or deduplicates across project environments.

One person is known by the same user id (and the same address) to project A's live key, A's test key and project
B's live key. Each environment has its own templates and workflows under the same keys. Its digests (preference
digests and workflow digests), its throttles, frequency caps, dedup keys and statistics hold only its own
traffic: what the user reads (the digest emails in each key's sandbox, each key's answers) is checked, end to end
where workers decide it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from notifier.deliveries.models import Delivery
from notifier.dispatch.digest import digest_flush
from tests.conftest import wait_for
from tests.projects.test_isolation import keys  # noqa: F401 - the fixture

ITEM = {"en": {"email": {"subject": "{{ title }}", "text": "{{ title }}"}}}


def _digest_content(name: str) -> dict[str, Any]:
    """Return a digest template that says which environment's it is, then its count and items."""
    return {
        "en": {
            "email": {
                "subject": f"{name}: {{{{ count }}}} updates",
                "text": "{% for item in items %}{{ item.payload.title }};{% endfor %}",
            }
        }
    }


def _put_template(api: Any, key: str, category: str, content: dict[str, Any], **extra: Any) -> None:
    body = {"category": category, "default_locale": "en", "content": content, **extra}
    answer = api.put(f"/api/v1/templates/{key}", body, format="json")
    assert answer.status_code in (200, 201), answer.content


def _emails(api: Any) -> list[dict[str, Any]]:
    answer = api.get("/api/v1/sandbox/messages", {"channel": "email"})
    assert answer.status_code == 200, answer.content
    return list(answer.json()["results"])


@pytest.mark.django_db(transaction=True)
def test_each_environments_hourly_digest_holds_only_its_own_items(
    keys: dict[str, tuple[Any, Any]],  # noqa: F811 - the fixture
    start_worker: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    items = {"a": ["a1", "a2"], "a_test": ["t1", "t2", "t3"], "b": ["b1"]}
    preferences = {"categories": {"marketing": {"enabled": True, "frequency": "hourly_digest"}}}
    for name, (_, api) in keys.items():
        _put_template(api, "promo", "marketing", ITEM)
        # Each environment's own digest template and layout, under the same keys.
        layout = {"html": "<main>{{ content }}</main>", "text": f"{name} | {{{{ content }}}}"}
        assert api.put("/api/v1/layouts/frame", layout, format="json").status_code == 201
        _put_template(api, "digest", "marketing", _digest_content(name), layout="frame")
        assert api.put("/api/v1/recipients/dig-1", {"email": "dig-1@example.com"}, format="json").status_code == 201
        assert api.put("/api/v1/recipients/dig-1/preferences", preferences, format="json").status_code == 200
    start_worker(queues=["email.high", "email.low"])
    for name, (_, api) in keys.items():
        for title in items[name]:
            sent = api.post(
                "/api/v1/notifications",
                {"recipient": {"user_id": "dig-1"}, "template": "promo", "payload": {"title": title}},
                format="json",
            )
            assert sent.status_code == 202, sent.content
            assert [d["reason"] for d in sent.json()["deliveries"]] == ["digest:hourly_digest"]

    # The hour ends: one flush, one digest per environment, each with that environment's digest template.
    with django_capture_on_commit_callbacks(execute=True):
        assert digest_flush(frequency="hourly_digest", now=timezone.now()) == 3
    digests = Delivery.objects.filter(notification__template_key="digest")
    wait_for(lambda: digests.filter(status__in=["sent", "failed"]).count() == 3, 60)
    assert sorted(digests.values_list("status", "last_error")) == [("sent", "")] * 3

    for name, (client, api) in keys.items():
        [email] = _emails(api)
        assert email["address"] == "dig-1@example.com" and email["provider"] == "sandbox"
        assert email["content"]["subject"] == f"{name}: {len(items[name])} updates"
        # The first line is the laid-out digest (the footer with the recipient's links follows).
        lines = email["content"]["text"].splitlines()
        assert lines[0] == f"{name} | " + "".join(f"{title};" for title in items[name])
        # The digest is its environment's client's: a test key's goes to the sandbox whatever the live ones use.
        digest = Delivery.objects.select_related("notification__client").get(pk=email["delivery_id"])
        assert (digest.notification.client_id, digest.provider) == (client.pk, "sandbox")
    assert keys["a_test"][0].mode == "test"
