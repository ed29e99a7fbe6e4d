"""The marketers' campaign wizard and progress page (Django test client; the browser test is in test_admin_browser)."""

from __future__ import annotations

import io
import zoneinfo
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEntry
from notifier.campaigns.models import Campaign
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert, topic_subscribe
from templates_app.services import template_put
from tests.factories import make_topic

pytestmark = pytest.mark.django_db

PROMO = {
    "en": {"email": {"subject": "Spring sale {{ percent }}%", "text": "Hi, {{ percent }}% off."}},
    "de": {"email": {"subject": "Frühlingsangebot {{ percent }}%", "text": "Hallo, {{ percent }}% Rabatt."}},
}


def _marketer(monkeypatch: pytest.MonkeyPatch, name: str = "max", role: str = "marketing") -> Client:
    monkeypatch.setenv("STAFF_USER_PASSWORD", "pw-mkt-123456")
    call_command("create_staff_user", name, "--role", role, "--email", f"{name}@example.com", stdout=io.StringIO())
    client = Client()
    assert client.login(username=name, password="pw-mkt-123456")
    return client


def _setup() -> dict[str, Any]:
    template_put(key="spring", category="marketing", default_locale="en", content=PROMO)
    template_put(key="otp", category="security", default_locale="en", content={"en": {"sms": {"text": "{{ c }}"}}})
    topic = make_topic(key="newsletter", name="Newsletter")
    for i, locale in enumerate(["de", "en", "en"]):
        recipient_upsert(user_id=f"sub-{i}", email=f"sub{i}@example.com", locale=locale)
    topic_subscribe(topic=topic, user_ids=["sub-0", "sub-1", "sub-2"])
    client, _ = api_client_create(name="marketing-tool")
    return {"client": client, "topic": topic}


def _answers(client_pk: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": "Spring sale",
        "client": str(client_pk),
        "topic": "newsletter",
        "template": "spring",
        "payload": '{"percent": 20}',
        "time_zone": "Europe/Berlin",
        "rate_per_second": "50",
        "send_at_local": "",
        **extra,
    }


def test_the_wizard_walks_audience_message_schedule_review_then_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _setup()
    http = _marketer(monkeypatch)
    url = reverse("admin:campaigns_campaign_wizard")
    assert http.get(reverse("admin:campaigns_campaign_add"))["Location"] == url
    page = http.get(url).content.decode()
    assert "newsletter — 3 subscribers" in page
    assert "spring (marketing)" not in page  # the template is step 2
    # Step 1 needs its answers before moving on.
    response = http.post(url, {"step": "1", "_next": "1", **_answers(env["client"].pk, name="")})
    assert response.context["step"] == 1 and "name" in response.context["form"].errors
    response = http.post(url, {"step": "1", "_next": "1", **_answers(env["client"].pk)})
    assert response.context["step"] == 2
    body = response.content.decode()
    assert "spring (marketing)" in body and "otp (security)" not in body
    # Preview for a sample subscriber: the first one, in German.
    response = http.post(url, {"step": "2", "_preview": "1", **_answers(env["client"].pk)})
    assert "Frühlingsangebot 20%" in response.content.decode()
    assert "sub-0" in response.content.decode()
    # Test send to the marketer's own address, through the pipeline.
    response = http.post(url, {"step": "2", "_test": "1", **_answers(env["client"].pk)})
    test = Delivery.objects.get(address="max@example.com")
    assert test.channel == "email" and test.notification.template_key == "spring"
    assert AuditEntry.objects.filter(action="campaign.test_send", actor_name="max").exists()
    # Schedule: a past time is refused; a local time in Berlin is stored as the right instant.
    past = {"send_at_local": "2020-01-01T10:00"}
    response = http.post(url, {"step": "3", "_next": "1", **_answers(env["client"].pk, **past)})
    assert response.context["step"] == 3 and "send_at_local" in response.context["form"].errors
    local = (timezone.now() + timedelta(days=2)).astimezone(zoneinfo.ZoneInfo("Europe/Berlin"))
    when = {"send_at_local": local.strftime("%Y-%m-%dT%H:%M")}
    response = http.post(url, {"step": "3", "_next": "1", **_answers(env["client"].pk, **when)})
    assert response.context["step"] == 4
    assert "Europe/Berlin" in response.content.decode()
    response = http.post(url, {"step": "4", "_create": "1", **_answers(env["client"].pk, **when)})
    campaign = Campaign.objects.get(name="Spring sale")
    assert response["Location"] == reverse("admin:campaigns_campaign_progress", args=[campaign.pk])
    expected = datetime.strptime(when["send_at_local"], "%Y-%m-%dT%H:%M").replace(
        tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")
    )
    assert campaign.send_at == expected
    assert (campaign.status, campaign.rate_per_second, campaign.payload) == ("scheduled", 50, {"percent": 20})
    assert AuditEntry.objects.filter(action="campaign.create", target_id=str(campaign.pk)).exists()


def test_progress_page_draws_charts_and_pauses_resumes_cancels(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _setup()
    http = _marketer(monkeypatch)
    from notifier.campaigns.services import campaign_create

    campaign = campaign_create(
        client=env["client"],
        name="Later",
        template="spring",
        topic="newsletter",
        payload={"percent": 5},
        send_at=timezone.now() + timedelta(days=1),
    )
    url = reverse("admin:campaigns_campaign_progress", args=[campaign.pk])
    page = http.get(url).content.decode()
    assert "<svg" in page and "Sent per minute" in page and 'id="campaign-pause"' in page
    http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, "pause"]))
    assert Campaign.objects.get(pk=campaign.pk).status == "paused"
    assert 'id="campaign-resume"' in http.get(url).content.decode()
    http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, "resume"]))
    assert Campaign.objects.get(pk=campaign.pk).status == "scheduled"
    http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, "cancel"]))
    assert Campaign.objects.get(pk=campaign.pk).status == "cancelled"
    actions = list(AuditEntry.objects.filter(target_type="campaign").order_by("id").values_list("action", flat=True))
    assert actions == ["campaign.pause", "campaign.resume", "campaign.cancel"]


def test_support_cannot_open_the_wizard_or_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _setup()
    http = _marketer(monkeypatch, name="sue", role="support")
    from notifier.campaigns.services import campaign_create

    campaign = campaign_create(client=env["client"], name="X", template="spring", topic="newsletter", draft=True)
    assert http.get(reverse("admin:campaigns_campaign_wizard")).status_code == 403
    assert http.get(reverse("admin:campaigns_campaign_progress", args=[campaign.pk])).status_code == 403
    assert http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, "cancel"])).status_code == 403


def test_the_wizard_schedules_at_each_recipients_local_time(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _setup()
    http = _marketer(monkeypatch)
    url = reverse("admin:campaigns_campaign_wizard")
    local = {"schedule_in": "recipient"}
    # Each recipient's time needs a time, and one that has not passed in every time zone.
    response = http.post(url, {"step": "3", "_next": "1", **_answers(env["client"].pk, **local)})
    assert response.context["step"] == 3 and "send_at_local" in response.context["form"].errors
    # 10:00 "yesterday" here may still be ahead somewhere (UTC-12); two days ago it has passed everywhere.
    past = (timezone.now() - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    response = http.post(url, {"step": "3", "_next": "1", **_answers(env["client"].pk, send_at_local=past, **local)})
    assert "every time zone" in str(response.context["form"].errors["send_at_local"])
    when = {"send_at_local": "2031-01-15T09:00", **local}
    response = http.post(url, {"step": "3", "_next": "1", **_answers(env["client"].pk, **when)})
    assert response.context["step"] == 4
    assert "in each recipient's time zone (Europe/Berlin for recipients without one)" in response.content.decode()
    http.post(url, {"step": "4", "_create": "1", **_answers(env["client"].pk, **when)})
    campaign = Campaign.objects.get(name="Spring sale")
    assert (campaign.send_at, campaign.send_at_local, campaign.timezone) == (
        None,
        "2031-01-15T09:00:00",
        "Europe/Berlin",
    )
    assert campaign.status == "scheduled"
    assert campaign.periodic_task.clocked.clocked_time == datetime(2031, 1, 14, 19, 0, tzinfo=zoneinfo.ZoneInfo("UTC"))


def _staff_with(*perms: str, name: str = "vic") -> Client:
    """Log in a staff user holding exactly `perms` ("app.codename")."""
    user = User.objects.create_user(name, password="pw-staff-123456", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    assert client.login(username=name, password="pw-staff-123456")
    return client


def _later(env: dict[str, Any], name: str = "Later") -> Campaign:
    from notifier.campaigns.services import campaign_create

    return campaign_create(
        client=env["client"],
        name=name,
        template="spring",
        topic="newsletter",
        payload={"percent": 5},
        send_at=timezone.now() + timedelta(days=1),
    )


def _offered_actions(http: Client) -> list[str]:
    """Return the actions the campaign list offers this staff user (none: no action form at all)."""
    changelist = http.get(reverse("admin:campaigns_campaign_changelist"))
    assert changelist.status_code == 200
    form = changelist.context["action_form"]
    return [] if form is None else [name for name, _ in form.fields["action"].choices]


def _changelist_action(http: Client, action: str, campaign: Campaign) -> Any:
    return http.post(
        reverse("admin:campaigns_campaign_changelist"),
        {"action": action, "_selected_action": [str(campaign.pk)], "index": "0"},
    )


def test_staff_who_may_edit_but_not_control_campaigns_cannot_pause_resume_or_cancel() -> None:
    env = _setup()
    campaign = _later(env)
    http = _staff_with("campaigns.view_campaign", "campaigns.change_campaign")
    assert not {"pause", "resume", "cancel"} & set(_offered_actions(http))
    page = http.get(reverse("admin:campaigns_campaign_progress", args=[campaign.pk])).content.decode()
    assert "campaign-pause" not in page and "campaign-cancel" not in page
    for verb in ("pause", "resume", "cancel"):
        assert http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, verb])).status_code == 403
        _changelist_action(http, verb, campaign)
        assert Campaign.objects.get(pk=campaign.pk).status == "scheduled"
    assert not AuditEntry.objects.filter(target_type="campaign", action__in=["campaign.pause", "campaign.cancel"])


def test_each_control_takes_its_own_permission() -> None:
    env = _setup()
    campaign = _later(env)
    http = _staff_with("campaigns.view_campaign", "campaigns.pause_campaign")
    offered = _offered_actions(http)
    assert "pause" in offered and "resume" not in offered and "cancel" not in offered
    _changelist_action(http, "pause", campaign)
    assert Campaign.objects.get(pk=campaign.pk).status == "paused"
    page = http.get(reverse("admin:campaigns_campaign_progress", args=[campaign.pk])).content.decode()
    assert "campaign-resume" not in page
    assert http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, "resume"])).status_code == 403
    assert http.post(reverse("admin:campaigns_campaign_control", args=[campaign.pk, "cancel"])).status_code == 403
    assert Campaign.objects.get(pk=campaign.pk).status == "paused"


def test_the_marketing_role_holds_every_control(monkeypatch: pytest.MonkeyPatch) -> None:
    env = _setup()
    http = _marketer(monkeypatch)
    first, second = _later(env, "First"), _later(env, "Second")
    _changelist_action(http, "pause", first)
    assert Campaign.objects.get(pk=first.pk).status == "paused"
    _changelist_action(http, "resume", first)
    assert Campaign.objects.get(pk=first.pk).status == "scheduled"
    _changelist_action(http, "cancel", second)
    assert Campaign.objects.get(pk=second.pk).status == "cancelled"
    actions = set(AuditEntry.objects.filter(target_type="campaign").values_list("action", flat=True))
    assert {"campaign.pause", "campaign.resume", "campaign.cancel"} <= actions
