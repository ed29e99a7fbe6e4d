"""The preference center: a page behind a signed, expiring link where a recipient changes their preferences.

Mounted at the site root (`/preferences/<token>`), no login and no JavaScript: a plain HTML form, posted back
to the same URL and redirected to a GET (so reloading never posts twice). The form is turned into the API's
preferences document and validated by the API's own serializer, then saved by the preference services.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from core.categories import is_optional
from preferences import selectors, services
from preferences.compliance import FREQUENCIES
from preferences.models import Recipient
from preferences.serializers import PreferencesSerializer, _zones
from preferences.translations import label, language_for, strings
from projects.scoping import owner_scope

HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)(?::[0-5]\d)?$")


def _respond(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    response = render(request, template, context, status=status)
    # The token in the URL is the recipient's credential: keep it out of caches and referrers.
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex"
    return response


def _error_page(request: HttpRequest, *, expired: bool, status: int) -> HttpResponse:
    # No recipient is known here, so the browser's language chooses (a German mail client, a German page).
    language = language_for(request.headers.get("Accept-Language", "").split(",", 1)[0])
    t = strings(language)
    title, body = (t["expired_title"], t["expired_body"]) if expired else (t["invalid_title"], t["invalid_body"])
    return _respond(
        request, "preferences/center_error.html", {"lang": language, "title": title, "body": body}, status=status
    )


def _form_from_prefs(recipient: Recipient) -> dict[str, Any]:
    """Return the form's values for the recipient's stored preferences."""
    prefs = selectors.recipient_preferences(recipient=recipient)
    quiet = prefs["quiet_hours"] or {}
    values: dict[str, Any] = {
        "opted_out": prefs["opted_out"],
        "channels": {c: prefs["channels"].get(c) is not False for c in settings.CHANNELS},
        "categories": {},
        "quiet_start": quiet.get("start", ""),
        "quiet_end": quiet.get("end", ""),
        "timezone": recipient.timezone,
    }
    for category in settings.NOTIFIER_CATEGORIES:
        current = prefs["categories"].get(category) or {}
        only = current.get("channels")
        values["categories"][category] = {
            "enabled": current.get("enabled", True) is not False,
            "frequency": current.get("frequency") or "immediate",
            # No list means every channel.
            "channels": {c: only is None or c in only for c in settings.CHANNELS},
        }
    return values


def _form_from_post(request: HttpRequest) -> dict[str, Any]:
    """Return the form's values as posted (unchecked checkboxes are simply absent)."""
    post = request.POST
    return {
        "opted_out": post.get("opted_out") == "on",
        "channels": {c: post.get(f"channel-{c}") == "on" for c in settings.CHANNELS},
        "categories": {
            category: {
                "enabled": post.get(f"category-{category}-enabled") == "on" or not is_optional(category),
                "frequency": post.get(f"category-{category}-frequency", "immediate"),
                "channels": {c: post.get(f"category-{category}-channel-{c}") == "on" for c in settings.CHANNELS},
            }
            for category in settings.NOTIFIER_CATEGORIES
        },
        "quiet_start": post.get("quiet_start", "").strip(),
        "quiet_end": post.get("quiet_end", "").strip(),
        "timezone": post.get("timezone", "").strip(),
    }


def _document(recipient: Recipient, values: dict[str, Any]) -> dict[str, Any]:
    """Build the API's preferences document from the form, keeping what the form does not show.

    `True` for a channel that was explicitly on is carried over; a category with every channel ticked has no
    channel list (the API's "all channels").
    """
    prefs = selectors.recipient_preferences(recipient=recipient)
    channels: dict[str, bool] = {}
    for channel, on in values["channels"].items():
        if not on:
            channels[channel] = False
        elif channel in prefs["channels"]:
            channels[channel] = True
    categories: dict[str, dict[str, Any]] = {}
    for category, chosen in values["categories"].items():
        current = dict(prefs["categories"].get(category) or {})
        if not is_optional(category):
            if current:
                categories[category] = current
            continue
        # A key is written when it was stored before or differs from its default, so saving an untouched page
        # changes nothing (and audits nothing).
        for key, default in (("enabled", True), ("frequency", "immediate")):
            if key in current or chosen[key] != default:
                current[key] = chosen[key]
        ticked = [c for c in settings.CHANNELS if chosen["channels"][c]]
        if len(ticked) == len(settings.CHANNELS):
            current.pop("channels", None)
        else:
            current["channels"] = ticked
        if current:
            categories[category] = current
    quiet = None
    if values["quiet_start"] or values["quiet_end"]:
        quiet = {"start": values["quiet_start"][:5], "end": values["quiet_end"][:5]}
    return {"opted_out": values["opted_out"], "channels": channels, "categories": categories, "quiet_hours": quiet}


def _field_errors(values: dict[str, Any], t: dict[str, str]) -> dict[str, str]:
    """Return the errors a recipient can make on this form, in their language, by field name."""
    errors: dict[str, str] = {}
    start, end = values["quiet_start"], values["quiet_end"]
    for name, value in (("quiet_start", start), ("quiet_end", end)):
        if value and not HHMM.match(value):
            errors[name] = t["err_time"]
    if not errors and bool(start) != bool(end):
        errors["quiet_end" if start else "quiet_start"] = t["err_both"]
    if not errors and start and start[:5] == end[:5]:
        errors["quiet_end"] = t["err_same"]
    if values["timezone"] and values["timezone"] not in _zones():
        errors["timezone"] = t["err_timezone"]
    return errors


def _page(
    request: HttpRequest,
    recipient: Recipient,
    values: dict[str, Any],
    *,
    errors: dict[str, str] | None = None,
    saved: bool = False,
) -> HttpResponse:
    language = language_for(recipient.locale)
    t = strings(language)
    categories = [
        {
            "key": category,
            "label": label(language, f"category_{category}"),
            "locked": not is_optional(category),
            "enabled": values["categories"][category]["enabled"],
            "frequency": values["categories"][category]["frequency"],
            "channels": [
                {
                    "key": c,
                    "label": label(language, f"channel_{c}"),
                    "on": values["categories"][category]["channels"][c],
                }
                for c in settings.CHANNELS
            ],
        }
        for category in settings.NOTIFIER_CATEGORIES
    ]
    context = {
        "lang": language,
        "t": t,
        "values": values,
        "errors": errors or {},
        "saved": saved,
        "channels": [
            {"key": c, "label": label(language, f"channel_{c}"), "on": values["channels"][c]} for c in settings.CHANNELS
        ],
        "categories": categories,
        "frequencies": [{"key": f, "label": t[f"frequency_{f}"]} for f in FREQUENCIES],
        "zones": sorted(_zones()),
    }
    return _respond(request, "preferences/center.html", context, status=400 if errors else 200)


# The signed token in the URL is the credential; a cross-site form without it cannot target anyone, and with
# `Referrer-Policy: no-referrer` browsers send `Origin: null`, which Django's CSRF check would refuse.
@csrf_exempt
@require_http_methods(["GET", "HEAD", "POST"])
def preference_center_view(request: HttpRequest, token: str) -> HttpResponse:
    """GET shows the recipient's preferences; POST saves them and redirects back to the page."""
    try:
        user_id, environment_id = services.preference_token_read(token)
    except signing.SignatureExpired:
        return _error_page(request, expired=True, status=410)
    except signing.BadSignature:
        return _error_page(request, expired=False, status=404)
    # The link's environment is the page's owner, as an API key's is its request's (projects.scoping): the same
    # user id names another recipient in every other project environment.
    with owner_scope(environment_id):
        return _preference_center(request, user_id)


def _preference_center(request: HttpRequest, user_id: str) -> HttpResponse:
    """Show or save the preferences of the recipient `user_id` of the scope's environment."""
    recipient = selectors.recipient_get(user_id=user_id)
    if recipient is None:
        return _error_page(request, expired=False, status=404)
    if request.method != "POST":
        return _page(request, recipient, _form_from_prefs(recipient), saved=request.GET.get("saved") == "1")

    values = _form_from_post(request)
    t = strings(language_for(recipient.locale))
    errors = _field_errors(values, t)
    if not errors:
        document = PreferencesSerializer(data=_document(recipient, values))
        if document.is_valid():
            quiet = document.validated_data["quiet_hours"] or {}
            services.preferences_save_by_recipient(
                recipient=recipient,
                opted_out=document.validated_data["opted_out"],
                channels=document.validated_data["channels"],
                categories=document.validated_data["categories"],
                quiet_start=quiet.get("start"),
                quiet_end=quiet.get("end"),
                timezone_name=values["timezone"],
            )
            return HttpResponseRedirect(f"{request.path}?saved=1")
        # Only a tampered form gets here (the page offers valid choices only): name the section.
        errors = {str(key): t["err_other"] for key in document.errors}
    return _page(request, recipient, values, errors=errors)


urlpatterns = [path("preferences/<str:token>", preference_center_view, name="preference-center")]
