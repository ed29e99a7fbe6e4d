"""Seed the cluster's own database (`python -m tests.cluster.seed <receiver url> <subscribers>`): print JSON.

Runs as a process of its own because the cluster's database is not the test database of pytest-django: it is
reached, as a deployment reaches it, through DATABASE_URL in the environment. Creates an API client (every
scope and category), the three templates of the load (a marketing fan-out, transactional singles, security
OTPs), one recipient for the singles, one for the OTPs and a topic of `subscribers` recipients, every one
with its webhook at the stand-in receiver; and an in-app template (`alert`) for the inbox stream's check.
Prints {"key": <raw API key>}.
"""

from __future__ import annotations

import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import connection  # noqa: E402  # after django.setup()

from core.scopes import SCOPES  # noqa: E402
from notifier.clients.services import api_client_create  # noqa: E402
from preferences.services import recipient_upsert, topic_subscribe, topic_upsert  # noqa: E402
from templates_app.services import template_put  # noqa: E402

TEMPLATES = {"news": "marketing", "receipt": "transactional", "otp": "security"}
CONTENT = {"en": {"webhook": {"body": {"event": "notice", "ref": "{{ ref }}"}}}}
ALERT = {"en": {"inapp": {"title": "Alert {{ ref }}", "body": "Seen live"}}}


def main(receiver: str, subscribers: int) -> None:
    """Write the load's client, templates, recipients and topic; print the raw API key as JSON."""
    _, key = api_client_create(name="cluster-load", allowed_categories=list(TEMPLATES.values()), scopes=list(SCOPES))
    for template, category in TEMPLATES.items():
        template_put(key=template, category=category, default_locale="en", content=CONTENT)
    template_put(key="alert", category="transactional", default_locale="en", content=ALERT)
    recipient_upsert(user_id="single", webhook_url=f"{receiver}/single")
    recipient_upsert(user_id="otp", webhook_url=f"{receiver}/otp")
    topic, _ = topic_upsert(key="everyone", name="Everyone")
    topic_subscribe(topic=topic, user_ids=[f"fan-{i}" for i in range(subscribers)])
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE preferences_recipient SET webhook_url = %s WHERE user_id LIKE 'fan-%%'", [f"{receiver}/fan"]
        )
    print(json.dumps({"key": key}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
