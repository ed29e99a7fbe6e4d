"""The preference center without a browser: links, the page's form, its errors, and links in sent messages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.conf import settings
from django.core import signing
from django.test import Client

from audit.models import AuditEntry
from channels_app.models import SandboxMessage
from notifier.accepting.services import notification_accept
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.models import Recipient
from preferences.services import preference_link, preference_token, preference_token_read, recipient_upsert
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from projects.scoping import owner_id
from templates_app.services import template_put
from tests.conftest import wait_for

CHANNELS = list(settings.CHANNELS)
# The page as a browser posts it for a recipient with no preferences: every box ticked, no quiet hours.
FORM_DEFAULTS = {
    **{f"channel-{c}": "on" for c in CHANNELS},
    **{f"category-{cat}-channel-{c}": "on" for cat in ("social", "marketing") for c in CHANNELS},
    "category-social-enabled": "on",
    "category-social-frequency": "immediate",
    "category-marketing-enabled": "on",
    "category-marketing-frequency": "immediate",
    "quiet_start": "",
    "quiet_end": "",
    "timezone": "",
}


def _path(url: str, settings: Any) -> str:
    base = settings.PUBLIC_BASE_URL.rstrip("/")
    assert url.startswith(base + "/preferences/")
    return url[len(base) :]


@pytest.mark.django_db
def test_link_api_returns_a_signed_expiring_url(api: Any, settings: Any) -> None:
    recipient_upsert(user_id="u-link")
    response = api.post("/api/v1/recipients/u-link/preference-link", {"ttl_seconds": 3600}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    token = _path(body["url"], settings).rsplit("/", 1)[1]
    assert preference_token_read(token) == ("u-link", DEFAULT_LIVE_ENVIRONMENT_ID)
    assert body["expires_at"].endswith("Z")
    # Unknown recipients and out-of-range lifetimes are refused with the usual error shapes.
    assert api.post("/api/v1/recipients/nobody/preference-link", {}, format="json").status_code == 404
    bad = api.post("/api/v1/recipients/u-link/preference-link", {"ttl_seconds": 5}, format="json")
    assert bad.status_code == 400 and "ttl_seconds" in bad.json()["error"]["fields"]


@pytest.mark.pure
def test_link_view_declares_its_scope() -> None:
    from preferences.apis import PreferenceLinkApi

    assert PreferenceLinkApi.required_scope == "recipients:write"


@pytest.mark.django_db
def test_form_saves_what_the_api_shows_and_audits_it(api: Any, settings: Any) -> None:
    recipient, _ = recipient_upsert(
        user_id="u-form", locale="en", category_prefs={"marketing": {"channels": ["email"], "enabled": True}}
    )
    url = _path(preference_link(recipient=recipient, ttl_seconds=600)[0], settings)
    page = Client().get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'lang="en"' in html and "Notification preferences" in html
    # The non-optional categories are shown, locked.
    assert re.search(r'id="category-security-enabled" checked disabled', html)
    assert page["Cache-Control"] == "no-store" and page["Referrer-Policy"] == "no-referrer"

    # The stored channel list of marketing is shown: only email is ticked.
    assert re.search(r'name="category-marketing-channel-email" checked', html)
    assert not re.search(r'name="category-marketing-channel-push" checked', html)
    assert re.search(r'name="category-social-channel-push" checked', html)

    form = {**FORM_DEFAULTS, "category-marketing-frequency": "daily_digest", "quiet_start": "22:00"}
    form.update(quiet_end="07:30", timezone="Europe/Berlin")
    del form["category-social-enabled"], form["channel-sms"]
    for channel in [c for c in CHANNELS if c not in ("email", "inapp")]:  # marketing by email and in the app
        del form[f"category-marketing-channel-{channel}"]
    saved = Client(enforce_csrf_checks=True).post(url, form)
    assert saved.status_code == 302 and saved["Location"].endswith("?saved=1")
    assert "saved" in Client().get(saved["Location"]).content.decode()

    prefs = api.get("/api/v1/recipients/u-form/preferences").json()
    assert prefs["categories"]["social"] == {"enabled": False, "frequency": "immediate"}
    assert prefs["categories"]["marketing"] == {
        "channels": ["email", "inapp"],
        "enabled": True,
        "frequency": "daily_digest",
    }
    assert prefs["channels"] == {"sms": False}
    assert prefs["quiet_hours"] == {"start": "22:00", "end": "07:30"}
    assert api.get("/api/v1/recipients/u-form").json()["timezone"] == "Europe/Berlin"

    entry = AuditEntry.objects.get(action="preferences.update", target_id="u-form")
    assert (entry.actor_type, entry.actor_id) == ("recipient", "u-form")
    assert set(entry.changes) == {"category_prefs", "channel_prefs", "quiet_start", "quiet_end"}
    zone = AuditEntry.objects.get(action="recipient.update", target_id="u-form")
    assert (zone.actor_type, zone.changes) == ("recipient", {"timezone": ["", "Europe/Berlin"]})

    # Saving the page again as shown changes nothing and audits nothing.
    html = Client().get(url).content.decode()
    shown = {name: "on" for name in re.findall(r'name="([^"]+)" checked', html)}
    shown |= dict(re.findall(r'name="(quiet_(?:start|end))" value="([^"]*)"', html))
    assert "category-marketing-channel-inapp" in shown and "category-marketing-channel-push" not in shown
    shown |= {"timezone": "Europe/Berlin", "category-social-frequency": "immediate"}
    shown["category-marketing-frequency"] = "daily_digest"
    assert Client().post(url, shown).status_code == 302
    assert api.get("/api/v1/recipients/u-form/preferences").json() == prefs
    assert AuditEntry.objects.filter(action="preferences.update", target_id="u-form").count() == 1


@pytest.mark.django_db
def test_bad_input_is_a_400_page_naming_the_field_in_german(settings: Any) -> None:
    recipient, _ = recipient_upsert(user_id="u-de", locale="de-DE")
    url = _path(preference_link(recipient=recipient, ttl_seconds=600)[0], settings)
    assert 'lang="de"' in Client().get(url).content.decode()
    page = Client().post(url, {**FORM_DEFAULTS, "quiet_start": "25:00", "quiet_end": "07:00"})
    assert page.status_code == 400
    html = page.content.decode()
    assert 'id="quiet_start" name="quiet_start" value="25:00" aria-invalid="true"' in html
    assert "Geben Sie eine Uhrzeit als HH:MM ein" in html
    one = Client().post(url, {**FORM_DEFAULTS, "quiet_start": "22:00"})
    assert one.status_code == 400 and "beide Uhrzeiten" in one.content.decode()
    # A forged frequency never reaches the database.
    forged = Client().post(url, {**FORM_DEFAULTS, "category-marketing-frequency": "weekly"})
    assert forged.status_code == 400
    assert Recipient.objects.get(user_id="u-de").category_prefs == {}
    assert not AuditEntry.objects.filter(target_id="u-de").exists()


@pytest.mark.django_db
def test_tampered_expired_and_foreign_links_are_clear_4xx_pages(settings: Any) -> None:
    recipient, _ = recipient_upsert(user_id="u-bad")
    url = _path(preference_link(recipient=recipient, ttl_seconds=600)[0], settings)
    tampered = Client().get(url[:-4] + "AAAA")
    assert tampered.status_code == 404 and "This link is not valid" in tampered.content.decode()
    assert Client().post(url[:-4] + "AAAA", FORM_DEFAULTS).status_code == 404
    # A token signed for another purpose (the unsubscribe salt) is not a preference link.
    owner = owner_id(recipient)
    value = f"dS1iYWQ.{signing.b62_encode(2**40)}.{signing.b62_encode(owner)}"
    other = signing.Signer(salt="preferences.unsubscribe").sign(value)
    mine = preference_token(user_id="u-bad", environment_id=owner, expires_at=2**40)
    assert mine.rsplit(":", 1)[0] == other.rsplit(":", 1)[0]
    assert Client().get(f"/preferences/{other}").status_code == 404
    expired = preference_token(user_id="u-bad", environment_id=owner, expires_at=1_000_000_000)
    page = Client(HTTP_ACCEPT_LANGUAGE="de-DE,de;q=0.9").get(f"/preferences/{expired}")
    assert page.status_code == 410 and "Dieser Link ist abgelaufen" in page.content.decode()
    # An erased recipient has no preferences to show.
    from preferences.services import recipient_erase

    recipient_erase(recipient=recipient)
    assert Client().get(url).status_code == 404


@pytest.mark.django_db
def test_links_minted_before_links_named_their_environment_name_the_default_live_one() -> None:
    recipient_upsert(user_id="u-before", quiet_start="22:00", quiet_end="07:00")
    value = f"dS1iZWZvcmU.{signing.b62_encode(2**40)}"  # `<b64 user_id>.<b62 expiry>`, no environment
    token = signing.Signer(salt="preferences.center").sign(value)
    assert preference_token_read(token) == ("u-before", DEFAULT_LIVE_ENVIRONMENT_ID)
    page = Client().get(f"/preferences/{token}")
    assert page.status_code == 200 and 'value="22:00' in page.content.decode()


@pytest.mark.django_db(transaction=True)
def test_sent_messages_carry_the_recipients_preference_link(start_worker: Any, settings: Any) -> None:
    content = {
        "en": {
            "email": {"subject": "News", "text": "Hello", "html": "<html><body><p>Hello</p></body></html>"},
            "sms": {"text": "Settings: {{ preferences_url }}"},
        },
        "de": {"email": {"subject": "Neues", "text": "Hallo", "html": "<p>Hallo</p>"}},
    }
    template_put(key="news", category="marketing", default_locale="en", content=content)
    template_put(key="otp", category="security", default_locale="en", content=content)
    client = api_client_create(name="pc")[0]
    recipient_upsert(user_id="u-mail", email="m@example.com", phone="+14155550123", locale="de")
    recipient_upsert(user_id="u-mail2", email="m2@example.com", phone="+14155550124")
    start_worker(queues=["email.low", "email.high", "sms.low", "sms.high"])

    def send(user_id: str, template: str, channels: list[str]) -> list[Delivery]:
        category = "marketing" if template == "news" else "security"
        data = {"recipient": {"user_id": user_id}, "category": category, "template": template}
        data.update(channels=channels, payload={})
        return notification_accept(client=client, data=data).deliveries

    news = send("u-mail", "news", ["email", "sms"]) + send("u-mail2", "news", ["sms"])
    otp = send("u-mail", "otp", ["email"])
    ids = [d.pk for d in news + otp]
    wait_for(lambda: Delivery.objects.filter(pk__in=ids, status="sent").count() == len(ids), 60)
    by_delivery = {m.delivery_id: m.content for m in SandboxMessage.objects.filter(delivery_id__in=ids)}

    email, sms, sms2 = (by_delivery[d.pk] for d in news)
    # Optional email: the footer, in the recipient's language, with both links.
    link = re.search(r"Benachrichtigungseinstellungen verwalten: (\S+)", email["text"]).group(1)
    assert "/unsubscribe/" in re.search(r"Abmelden: (\S+)", email["text"]).group(1)
    assert f'<a href="{link}">' in email["html"]
    assert preference_token_read(link.rsplit("/", 1)[1])[0] == "u-mail"
    # {{ preferences_url }} in a template: each recipient gets their own link, though rendering is shared.
    assert preference_token_read(sms["text"].rsplit("/", 1)[1])[0] == "u-mail"
    assert preference_token_read(sms2["text"].rsplit("/", 1)[1])[0] == "u-mail2"
    assert Client().get(_path(link, settings)).status_code == 200
    # Security email is not optional: no footer.
    assert "/preferences/" not in by_delivery[otp[0].pk]["text"]
