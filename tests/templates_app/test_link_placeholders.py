"""Per-recipient links are placed only where the template's author wrote them, never where a payload value is.

A caller controls the payload; if a payload value imitating the `{{ preferences_url }}` stand-in were
replaced too, any caller could have any recipient's signed preference link sent to a webhook (or into a
message) of its choosing. Delivered in process through the real send path (channels_app.services.deliver),
the webhook over HTTP to a loopback receiver, the other channels to their sandbox providers.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from channels_app.models import SandboxMessage
from channels_app.services import deliver
from notifier.accepting.services import notification_accept
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import preference_token_read, recipient_upsert
from templates_app.rendering import PREFERENCES_URL_PLACEHOLDER, render
from templates_app.services import template_put
from tests.stubs.config import WEBHOOK_SECRET

pytestmark = pytest.mark.django_db

STAND_IN = PREFERENCES_URL_PLACEHOLDER
CONTENT = {
    "en": {
        "webhook": {
            "body": {
                "note": "{{ note }}",
                "pieces": "{{ a }}{{ b }}",
                "guess": "{{ guess }}",
                "manage": "{{ preferences_url }}",
            }
        },
        "sms": {"text": "{{ note }} | {{ preferences_url }}"},
        "email": {
            "subject": "Hi",
            "text": "{{ note }} {{ a }}{{ b }}\nManage: {{ preferences_url }}",
            "html": '<p>{{ note }}</p><p><a href="{{ preferences_url }}">Manage</a></p>',
        },
        "inapp": {"title": "{{ note }}", "body": "{{ a }}{{ b }}"},
    }
}
PAYLOAD = {
    "note": STAND_IN,
    "a": STAND_IN[:21],
    "b": STAND_IN[21:],
    "guess": f"{STAND_IN}/{'0' * 32}",
    # A payload cannot point the template's own preference link elsewhere either.
    "preferences_url": "https://evil.example/phish",
}


def _signed_user(link: str) -> str | None:
    return preference_token_read(link.rstrip("/").rsplit("/", 1)[1])[0]


def test_a_payload_imitating_the_stand_in_is_never_replaced_by_a_signed_link(
    webhook_receiver: Any, settings: Any
) -> None:
    settings.WEBHOOK_SIGNING_SECRET = WEBHOOK_SECRET
    settings.WEBHOOK_ALLOW_PRIVATE_TARGETS = True
    settings.CHANNEL_PROVIDERS = {**settings.CHANNEL_PROVIDERS, "webhook": ["webhook"]}
    template_put(key="links", category="transactional", default_locale="en", content=CONTENT)
    client = api_client_create(name="links")[0]
    recipient_upsert(
        user_id="victim", email="victim@example.com", phone="+14155550177", webhook_url=f"{webhook_receiver.url}/h"
    )
    result = notification_accept(
        client=client,
        data={
            "recipient": {"user_id": "victim"},
            "category": "transactional",
            "template": "links",
            "channels": ["webhook", "sms", "email", "inapp"],
            "payload": PAYLOAD,
        },
    )
    ids = [d.pk for d in result.deliveries]
    assert len(ids) == 4
    for pk in ids:  # one batch per channel, as the workers of each queue would
        deliver([pk])
    states = dict(Delivery.objects.filter(pk__in=ids).values_list("channel", "status"))
    assert set(states.values()) == {"sent"}, states

    [request] = webhook_receiver.requests
    body = Webhook(WEBHOOK_SECRET).verify(request.body, {k.lower(): v for k, v in request.headers.items()})
    # The payload's values arrive exactly as sent: no signed link was put in their place.
    assert (body["note"], body["pieces"], body["guess"]) == (STAND_IN, STAND_IN, PAYLOAD["guess"])
    # The template's own placeholder is the recipient's signed link, not the payload's URL.
    assert _signed_user(body["manage"]) == "victim"
    raw = request.body.decode()
    assert raw.count("/preferences/") == 1 and "evil.example" not in raw

    by_channel = {
        d.channel: SandboxMessage.objects.get(delivery_id=d.pk).content
        for d in Delivery.objects.filter(pk__in=ids).exclude(channel__in=["webhook", "inapp"])
    }
    note, link = by_channel["sms"]["text"].split(" | ")
    assert note == STAND_IN and _signed_user(link) == "victim"
    email = by_channel["email"]
    assert email["text"].startswith(f"{STAND_IN} {STAND_IN}\n")
    assert _signed_user(email["text"].rsplit("Manage: ", 1)[1].strip()) == "victim"
    assert f"<p>{STAND_IN}</p>" in email["html"] and email["html"].count("/preferences/") == 1
    inapp = Delivery.objects.get(pk__in=ids, channel="inapp")
    assert inapp.content == {"title": STAND_IN, "body": STAND_IN, "url": ""}
    assert "evil.example" not in json.dumps(by_channel)


def test_each_rendering_has_its_own_marker() -> None:
    template_put(key="links", category="transactional", default_locale="en", content=CONTENT)
    from templates_app.models import Template

    version = Template.objects.get(key="links").published_version
    assert version is not None
    first = render(version, channel="sms", locale="en", payload=PAYLOAD)
    second = render(version, channel="sms", locale="en", payload=PAYLOAD)
    assert first.link_marker != second.link_marker
    assert first.link_marker.startswith(STAND_IN + "/")
    assert first.parts["text"] == f"{STAND_IN} | {first.link_marker}"
