"""One-click unsubscribe links (RFC 8058)."""

from __future__ import annotations

import pytest
from django.core import signing
from django.test import Client
from django.urls import include, path
from pytest_django import Settings

from preferences.compliance import evaluate
from preferences.models import Recipient
from preferences.services import (
    UNSUBSCRIBE_SALT,
    _unsubscribe_mac,
    recipient_upsert,
    unsubscribe_token,
    unsubscribe_token_read,
    unsubscribe_url,
)
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID

urlpatterns = [path("", include("preferences.unsubscribe_urls"))]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def _path(url: str, settings: Settings) -> str:
    base = settings.PUBLIC_BASE_URL.rstrip("/")
    assert url.startswith(base + "/unsubscribe/")
    return url[len(base) :]


def test_get_confirms_and_post_unsubscribes(settings: Settings) -> None:
    recipient, _ = recipient_upsert(
        user_id="u-unsub", email="u@example.com", category_prefs={"marketing": {"channels": ["email"]}}
    )
    url = _path(unsubscribe_url(recipient=recipient, category="marketing"), settings)
    client = Client(enforce_csrf_checks=True)

    page = client.get(url)
    assert page.status_code == 200 and b'method="post"' in page.content
    recipient.refresh_from_db()
    assert recipient.category_prefs["marketing"].get("enabled", True) is True  # a GET changes nothing

    # What a mail client sends for RFC 8058, with no cookie or CSRF token.
    done = client.post(url, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded")
    assert done.status_code == 200 and b"unsubscribed" in done.content
    recipient.refresh_from_db()
    assert recipient.category_prefs["marketing"] == {"channels": ["email"], "enabled": False}
    assert evaluate(
        recipient=recipient, category="marketing", channel="email", address="u@example.com", suppressed=False
    ).reason == ("category_disabled")
    # Other categories are untouched; repeating is harmless.
    assert "social" not in recipient.category_prefs
    assert client.post(url).status_code == 200


def test_tampered_or_foreign_tokens_are_rejected(settings: Settings) -> None:
    recipient, _ = recipient_upsert(user_id="u-x")
    url = _path(unsubscribe_url(recipient=recipient, category="social"), settings)
    assert Client().post(url[:-3] + "abc").status_code == 404
    assert Client().get("/unsubscribe/garbage").status_code == 404
    Recipient.objects.filter(pk=recipient.pk).update(erased_at="2025-01-01T00:00:00Z")
    assert Client().post(url).status_code == 404


def test_a_token_names_its_recipient_and_category_and_any_change_breaks_it() -> None:
    recipient, _ = recipient_upsert(user_id="team/u-7")
    token = unsubscribe_token(recipient=recipient, category="social")
    assert unsubscribe_token_read(token) == ("team/u-7", "social", recipient.environment_id)
    other, _ = recipient_upsert(user_id="team/u-8")
    forged = unsubscribe_token(recipient=other, category="social").rsplit(".", 1)[0] + "." + token.rsplit(".", 1)[1]
    with pytest.raises(signing.BadSignature):
        unsubscribe_token_read(forged)


def test_links_signed_in_the_earlier_format_still_work() -> None:
    recipient, _ = recipient_upsert(user_id="u-old", category_prefs={})
    token = signing.dumps({"r": "u-old", "c": "social"}, salt=UNSUBSCRIBE_SALT)
    assert Client().post(f"/unsubscribe/{token}").status_code == 200
    recipient.refresh_from_db()
    assert recipient.category_prefs["social"]["enabled"] is False


def test_compact_links_sent_before_links_named_their_environment_name_the_default_live_one() -> None:
    recipient, _ = recipient_upsert(user_id="u-compact", category_prefs={})
    payload = unsubscribe_token(recipient=recipient, category="social").split(".")[0]
    token = f"{payload}.{_unsubscribe_mac(payload)}"  # `<base64 user_id/category>.<hmac>`, no environment
    assert unsubscribe_token_read(token) == ("u-compact", "social", DEFAULT_LIVE_ENVIRONMENT_ID)
    assert Client().post(f"/unsubscribe/{token}").status_code == 200
    recipient.refresh_from_db()
    assert recipient.category_prefs["social"]["enabled"] is False


def test_no_link_for_categories_that_cannot_be_switched_off() -> None:
    recipient, _ = recipient_upsert(user_id="u-sec")
    with pytest.raises(ValueError, match="cannot"):
        unsubscribe_url(recipient=recipient, category="security")
