"""The marketers' campaign wizard and progress page in the admin (views mounted by CampaignAdmin.get_urls).

Four steps in one form whose earlier and later answers travel as hidden fields, so it needs no JavaScript
and no session state: audience (topic with its subscriber count), message (template, payload, preview for
a sample subscriber, a test send to the marketer's own address), schedule (a local time in a named time
zone or in each recipient's own zone, and the rate cap), review. Creating calls campaign_create; pause, resume
and cancel call their services. Every action is audited.
"""

from __future__ import annotations

import json
import zoneinfo
from datetime import datetime, timedelta
from typing import Any, cast

from django import forms
from django.conf import settings
from django.db.models import Count, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from core.categories import is_optional
from core.charts import bar_chart, line_chart
from notifier.campaigns.models import Campaign
from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery
from notifier.dispatch.localtime import local_instant
from preferences.models import Subscription, Topic
from projects.scoping import owner_id, owner_scope
from templates_app.layouts import render_all
from templates_app.models import Template
from templates_app.rendering import RenderError
from templates_app.sms import sms_info

STEPS = {1: "Audience", 2: "Message", 3: "Schedule", 4: "Review"}
STEP_FIELDS: dict[int, tuple[str, ...]] = {
    1: ("name", "client", "topic"),
    2: ("template", "channels", "payload"),
    3: ("send_at_local", "schedule_in", "time_zone", "rate_per_second"),
    4: (),
}
REQUIRED = frozenset({"name", "client", "topic", "template", "time_zone", "rate_per_second"})
ZONE, RECIPIENT = "zone", "recipient"
# The last time zone is 12 hours behind UTC: a wall-clock time passed there has passed everywhere.
LAST_ZONE = "Etc/GMT+12"


def _in_projects(queryset: QuerySet[Any], projects: list[int] | None) -> QuerySet[Any]:
    """Narrow rows that carry an environment to `projects` (None: every project, for a superuser)."""
    return queryset if projects is None else queryset.filter(environment__project_id__in=projects)


def topic_choices(projects: list[int] | None = None) -> list[tuple[str, Any]]:
    """Return the topics of `projects` with their subscriber counts, grouped by project environment.

    A campaign's topic is its client's environment's topic of that key (checked in `check`): the groups show
    which environments have it.
    """
    topics = _in_projects(Topic.objects.select_related("environment__project"), projects)
    topics = topics.annotate(subscribers=Count("subscriptions")).order_by("environment__project__slug", "key")
    groups: dict[str, list[tuple[str, str]]] = {}
    for t in topics:
        label = f"{t.key} — {t.subscribers} subscriber{'s' if t.subscribers != 1 else ''}"
        groups.setdefault(str(t.environment), []).append((t.key, label))
    return list(groups.items())


def template_choices(projects: list[int] | None = None, environment_id: int | None = None) -> list[tuple[str, str]]:
    """Return the published templates of optional categories (what a campaign may send) of one environment.

    Without the environment (no client chosen yet): those of every environment of `projects`, each key once.
    """
    optional = [c for c in settings.NOTIFIER_CATEGORIES if is_optional(c)]
    templates = Template.objects.filter(category__in=optional, published_version__isnull=False)
    if environment_id is not None:
        templates = templates.filter(environment_id=environment_id)
    else:
        templates = _in_projects(templates, projects)
    return list(dict.fromkeys((t.key, f"{t.key} ({t.category})") for t in templates.order_by("key")))


class ClientChoiceField(forms.ModelChoiceField):
    """An API client, named with its project environment."""

    def label_from_instance(self, obj: Any) -> str:
        return f"{obj.name} ({obj.environment})"


class CampaignWizardForm(forms.Form):
    """Every answer of the wizard; each step shows its own fields and carries the others hidden."""

    step = forms.IntegerField(widget=forms.HiddenInput, min_value=1, max_value=4, initial=1)
    name = forms.CharField(required=False, max_length=255)
    client = ClientChoiceField(
        queryset=ApiClient.objects.none(),
        required=False,
        help_text="The service the campaign is sent as: its project environment's topic and template are used.",
    )
    topic = forms.ChoiceField(
        required=False, choices=(), help_text="A topic of the client's project environment (grouped by environment)."
    )
    template = forms.ChoiceField(required=False, choices=())
    channels = forms.MultipleChoiceField(
        required=False,
        choices=[(c, c) for c in settings.CHANNELS],
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: every channel the template has.",
    )
    payload = forms.CharField(
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "style": "font-family: monospace"}),
        help_text="Template variables shared by every recipient (JSON object).",
    )
    send_at_local = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        label="Send at",
        help_text="Local time in the zone below (or each recipient's); empty sends as soon as it is created.",
    )
    schedule_in = forms.ChoiceField(
        required=False,
        initial=ZONE,
        label="Time zone of the send time",
        choices=[
            (ZONE, "The time zone below, for everyone"),
            (RECIPIENT, "Each recipient's own time zone (the zone below for recipients without one)"),
        ],
        widget=forms.RadioSelect,
    )
    time_zone = forms.ChoiceField(required=False, choices=(), initial="UTC")
    rate_per_second = forms.IntegerField(
        required=False, min_value=1, max_value=100_000, initial=100, help_text="Rate cap: messages per second."
    )

    def __init__(self, *args: Any, projects: list[int] | None = None, **kwargs: Any) -> None:
        """Offer the clients, topics and templates of `projects` (None: of every project, for a superuser)."""
        super().__init__(*args, **kwargs)
        clients = _in_projects(ApiClient.objects.filter(is_active=True), projects)
        client_field = cast(forms.ModelChoiceField, self.fields["client"])
        client_field.queryset = clients.select_related("environment__project").order_by("name")
        # Once a client is chosen (steps 2 on), the templates offered are its environment's.
        chosen = (
            clients.filter(pk=self.data.get("client")).first() if str(self.data.get("client", "")).isdigit() else None
        )
        cast(forms.ChoiceField, self.fields["topic"]).choices = [("", "—"), *topic_choices(projects)]
        cast(forms.ChoiceField, self.fields["template"]).choices = [
            ("", "—"),
            *template_choices(projects, chosen.environment_id if chosen else None),
        ]
        cast(forms.ChoiceField, self.fields["time_zone"]).choices = [
            (z, z) for z in sorted(zoneinfo.available_timezones())
        ]

    def step_fields(self, step: int) -> list[forms.BoundField]:
        """Return the bound fields a step shows."""
        return [self[name] for name in STEP_FIELDS[step]]

    def hidden_fields_for(self, step: int) -> list[str]:
        """Return the other steps' answers as hidden inputs (HTML), so every post carries them all."""
        shown = set(STEP_FIELDS[step]) | {"step"}
        return [self[name].as_hidden() for name in self.fields if name not in shown]

    def check(self, upto: int) -> bool:
        """Validate the answers of steps 1..upto (required ones, JSON, time in the future); True if fine."""
        if not self.is_valid():
            return False
        data = self.cleaned_data
        names = [name for step in range(1, upto + 1) for name in STEP_FIELDS[step]]
        for name in names:
            if name in REQUIRED and data.get(name) in (None, ""):
                self.add_error(name, "This field is required.")
        client = data.get("client")
        # A campaign's client, topic and template are of one project environment: the client's.
        if "topic" in names and client and data.get("topic"):
            if not Topic.objects.filter(environment_id=client.environment_id, key=data["topic"]).exists():
                self.add_error(
                    "topic", f"No topic '{data['topic']}' in {client.environment}, the client's environment."
                )
        if "template" in names and client and data.get("template") and self.template_obj() is None:
            self.add_error(
                "template", f"No template '{data['template']}' in {client.environment}, the client's environment."
            )
        if "payload" in names:
            try:
                payload = json.loads(data.get("payload") or "{}")
            except json.JSONDecodeError as exc:
                self.add_error("payload", f"Not valid JSON: {exc}")
            else:
                if not isinstance(payload, dict):
                    self.add_error("payload", "The payload must be a JSON object.")
        local_time = data.get("schedule_in") == RECIPIENT
        if "schedule_in" in names and local_time and not data.get("send_at_local"):
            self.add_error("send_at_local", "Give the local time to send at in each recipient's time zone.")
        elif "send_at_local" in names and local_time and data.get("send_at_local"):
            if local_instant(self._wall_clock(), LAST_ZONE) <= timezone.now():
                self.add_error("send_at_local", "This time has passed in every time zone.")
        elif "send_at_local" in names and data.get("send_at_local") and data.get("time_zone"):
            send_at = self.send_at()  # not None here: a time and a zone are given, and not per recipient
            if send_at is not None and send_at <= timezone.now():
                self.add_error("send_at_local", "This time is in the past.")
        return not self.errors

    def parsed_payload(self) -> dict[str, Any]:
        """Return the parsed payload (after check)."""
        return json.loads(self.cleaned_data.get("payload") or "{}")

    def _wall_clock(self) -> datetime:
        """Return the chosen send time as typed (naive): the form field reads it in the server's zone."""
        return timezone.make_naive(self.cleaned_data["send_at_local"], timezone.get_current_timezone())

    def at_recipient_time(self) -> bool:
        """Return whether the campaign goes at the chosen time in each recipient's own time zone."""
        return self.cleaned_data.get("schedule_in") == RECIPIENT and bool(self.cleaned_data.get("send_at_local"))

    def send_at(self) -> datetime | None:
        """Return the chosen local time in its zone as an aware datetime, or None for "now" or recipient time."""
        if not self.cleaned_data.get("send_at_local") or self.at_recipient_time():
            return None
        return self._wall_clock().replace(tzinfo=zoneinfo.ZoneInfo(self.cleaned_data["time_zone"]))

    def send_at_local_value(self) -> str:
        """Return the wall-clock time for each recipient's zone ("2026-12-01T09:00:00"), or "" for one zone."""
        return self._wall_clock().isoformat(timespec="seconds") if self.at_recipient_time() else ""

    def template_obj(self) -> Template | None:
        """Return the chosen template, of the chosen client's environment."""
        key = self.cleaned_data.get("template")
        client = self.cleaned_data.get("client")
        if not key or client is None:
            return None
        found = Template.objects.select_related("published_version__template")
        return found.filter(environment_id=client.environment_id, key=key).first()


def sample_preview(form: CampaignWizardForm) -> dict[str, Any]:
    """Render the chosen template for a sample subscriber of the topic (their locale), or say why not."""
    template = form.template_obj()
    if template is None or template.published_version is None:
        return {}
    subscription = (
        Subscription.objects.filter(topic__environment_id=owner_id(template), topic__key=form.cleaned_data.get("topic"))
        .select_related("recipient")
        .order_by("id")
        .first()
    )
    recipient = subscription.recipient if subscription else None
    locale = (recipient.locale if recipient else "") or template.default_locale
    try:
        # In the template's environment: its layouts are found by key there.
        with owner_scope(owner_id(template)):
            rendered = render_all(template.published_version, locale=locale, payload=form.parsed_payload())
    except RenderError as exc:
        return {"error": exc.message, "recipient": recipient}
    wanted = form.cleaned_data.get("channels") or list(rendered)
    channels = []
    for channel, result in rendered.items():
        if channel not in wanted:
            continue
        parts = []
        for name, value in result.parts.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if not text or text == "{}":
                continue  # a part this template does not use
            part: dict[str, Any] = {"name": name, "text": text, "html": channel == "email" and name == "html"}
            if channel == "sms":
                part["sms"] = sms_info(text)
            parts.append(part)
        channels.append({"channel": channel, "locale": result.locale, "parts": parts})
    return {"recipient": recipient, "channels": channels}


def campaign_rate(campaign: Campaign, *, window: timedelta = timedelta(minutes=1)) -> float:
    """Return the campaign's send rate over the last minute, in messages per second."""
    since = timezone.now() - window
    sent = Delivery.objects.filter(notification__campaign=campaign, sent_at__gte=since).count()
    return round(sent / window.total_seconds(), 2)


def progress_charts(campaign: Campaign, progress: dict[str, Any]) -> dict[str, Any]:
    """Draw the campaign's outcome bars and its sends per minute since it started (SVG, server-side)."""
    bars = bar_chart(
        {k: progress[k] for k in ("sent", "failed", "suppressed", "pending", "cancelled")}, title="Deliveries"
    )
    now = timezone.now().replace(second=0, microsecond=0)
    start = max(campaign.created_at.replace(second=0, microsecond=0), now - timedelta(hours=6))
    minutes = [start + timedelta(minutes=i) for i in range(int((now - start).total_seconds() // 60) + 1)]
    rows = (
        Delivery.objects.filter(notification__campaign=campaign, sent_at__gte=start)
        .annotate(minute=TruncMinute("sent_at"))
        .values("minute")
        .annotate(n=Count("id"))
        .order_by()
    )
    per_minute = {row["minute"]: row["n"] for row in rows}
    line = line_chart(
        {"sent": [per_minute.get(m, 0) for m in minutes]}, labels=minutes, title="Sent per minute", width=560
    )
    return {"bars": bars, "line": line}
