"""Admin for marketers: create, schedule, pause, resume and cancel campaigns; see their progress."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from audit.services import audit_record
from core.errors import ApiError
from notifier.campaigns.models import Campaign
from notifier.campaigns.selectors import campaign_progress
from notifier.campaigns.services import (
    EDITABLE,
    campaign_cancel,
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_schedule,
    campaign_test_send,
    campaign_validate,
    pausable_from,
)
from notifier.campaigns.wizard import STEPS, CampaignWizardForm, campaign_rate, progress_charts, sample_preview
from projects.admin import OwnedAdmin
from templates_app.selectors import TemplateNotFound


class CampaignForm(forms.ModelForm):
    """A campaign's definition, checked as its run will check it."""

    schedule = forms.BooleanField(
        required=False, initial=True, help_text="Schedule on save (untick to keep it as a draft)."
    )

    class Meta:
        model = Campaign
        fields = (
            "name",
            "client",
            "template_key",
            "topic",
            "category",
            "channels",
            "payload",
            "send_at",
            "send_at_local",
            "timezone",
            "crontab",
            "rate_per_second",
        )
        help_texts = {
            "send_at_local": "Instead of send at: a local time (2026-12-01T09:00:00) in each recipient's time "
            "zone; the time zone below for recipients without one.",
        }

    def clean(self) -> dict[str, Any]:
        data = cast(dict[str, Any], super().clean())  # ModelForm.clean returns cleaned_data, never None
        if self.instance.pk and self.instance.status not in EDITABLE:
            raise forms.ValidationError(f"A {self.instance.status} campaign cannot be changed; pause or cancel it.")
        client, topic = data.get("client"), data.get("topic")
        # A campaign's client, topic and template are of one project environment (the template is looked up in
        # the client's by campaign_validate below).
        if client and topic and topic.environment_id != client.environment_id:
            self.add_error("topic", f"The topic must be of {client.environment}, the client's environment.")
        if data.get("client") and data.get("template_key"):
            try:
                campaign_validate(
                    client=data["client"],
                    template=data["template_key"],
                    category=data.get("category") or "marketing",
                    channels=list(data.get("channels") or []),
                    crontab=(data.get("crontab") or "").strip(),
                    send_at=data.get("send_at"),
                    tz=data.get("timezone") or "UTC",
                    send_at_local=data.get("send_at_local") or "",
                )
            except ApiError as exc:
                field = next(iter(exc.fields), None)
                target = {"template": "template_key"}.get(field or "", field)
                if target in self.fields:
                    self.add_error(target, exc.message)
                else:
                    raise forms.ValidationError(exc.message) from None
        return data


CONTROL_VERBS = ("pause", "resume", "cancel")


def _staff(request: HttpRequest) -> User:
    """Return the user of an admin request (admin views run only for a logged-in staff user)."""
    return cast(User, request.user)


@admin.register(Campaign)
class CampaignAdmin(OwnedAdmin):
    """Campaigns; saving schedules through django-celery-beat, actions pause, resume and cancel."""

    form = CampaignForm
    list_display = (
        "name",
        "topic",
        "template_key",
        "status",
        "send_at",
        "crontab",
        "rate_per_second",
        "last_run_at",
        "progress_link",
    )
    list_filter = ("status", "category")
    search_fields = ("name", "template_key", "topic__key")
    list_select_related = ("topic",)
    readonly_fields = ("status", "periodic_task", "last_run_at", "progress")
    actions = ("pause", "resume", "cancel")
    action_permissions = {verb: f"campaigns.{verb}_campaign" for verb in ("pause", "resume", "cancel")}

    @admin.display(description="Progress")
    def progress(self, obj: Campaign) -> str:
        if not obj.pk:
            return "-"
        p = campaign_progress(campaign=obj)
        return ", ".join(f"{k}: {p[k]}" for k in ("targeted", "sent", "failed", "suppressed", "pending", "cancelled"))

    def save_model(self, request: HttpRequest, obj: Campaign, form: forms.ModelForm, change: bool) -> None:
        obj.crontab = obj.crontab.strip()
        super().save_model(request, obj, form, change)
        if form.cleaned_data.get("schedule") and obj.status in EDITABLE:
            campaign_schedule(campaign=obj)

    # Pausing, resuming and cancelling change a running send's outcome for every subscriber: each takes its
    # own permission (campaigns.pause_campaign, ...), not merely the right to see or edit the campaign.
    # With a campaign: in its project (the member's role there); without: in any of the user's projects.
    def has_pause_permission(self, request: HttpRequest, obj: Campaign | None = None) -> bool:
        return self.may(request, "pause", obj)

    def has_resume_permission(self, request: HttpRequest, obj: Campaign | None = None) -> bool:
        return self.may(request, "resume", obj)

    def has_cancel_permission(self, request: HttpRequest, obj: Campaign | None = None) -> bool:
        return self.may(request, "cancel", obj)

    def _may(self, request: HttpRequest, verb: str, campaign: Campaign) -> bool:
        """Return whether the staff user holds the permission of `verb` (pause, resume or cancel) on `campaign`."""
        return verb in CONTROL_VERBS and bool(getattr(self, f"has_{verb}_permission")(request, campaign))

    def _apply(self, request: HttpRequest, queryset: QuerySet[Campaign], service: Any, verb: str) -> None:
        for campaign in queryset:
            before = campaign.status
            try:
                affected = service(campaign=campaign)
            except ApiError as exc:
                self.message_user(request, f"{campaign}: {exc.message}", messages.WARNING)
            else:
                audit_record(
                    actor=request.user,
                    action=f"campaign.{service.__name__.removeprefix('campaign_')}",
                    target_type="campaign",
                    target_id=campaign.pk,
                    changes={"status": [before, campaign.status]},
                )
                self.message_user(request, f"{campaign}: {verb} ({affected} deliveries affected).")

    @admin.display(description="")
    def progress_link(self, obj: Campaign) -> str:
        return format_html('<a href="{}">Progress</a>', reverse("admin:campaigns_campaign_progress", args=[obj.pk]))

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        """Create campaigns step by step (the plain model form stays for editing)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:campaigns_campaign_wizard"))

    def get_urls(self) -> list[URLPattern]:
        own = [
            path("wizard/", self.admin_site.admin_view(self.wizard_view), name="campaigns_campaign_wizard"),
            path(
                "<path:object_id>/progress/",
                self.admin_site.admin_view(self.progress_view),
                name="campaigns_campaign_progress",
            ),
            path(
                "<path:object_id>/control/<str:verb>/",
                self.admin_site.admin_view(require_POST(self.control_view)),
                name="campaigns_campaign_control",
            ),
        ]
        return own + super().get_urls()

    def wizard_view(self, request: HttpRequest) -> HttpResponse:
        """Walk a marketer through audience, message (preview, test send), schedule and review; then create."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        preview: dict[str, Any] = {}
        # The clients, topics and templates of the projects where the user may create campaigns.
        projects = self.projects_where(request, "add")
        if request.method != "POST":
            initial = {"step": 1, "time_zone": "UTC", "rate_per_second": 100, "payload": "{}"}
            form = CampaignWizardForm(initial=initial, projects=projects)
            step = 1
        else:
            form = CampaignWizardForm(request.POST, projects=projects)
            step = int(request.POST.get("step") or 1) if str(request.POST.get("step") or "1").isdigit() else 1
            step = min(max(step, 1), 4)
            if "_back" in request.POST:
                step = max(step - 1, 1)
                form.is_valid()
            elif form.check(step):
                if "_next" in request.POST:
                    step = min(step + 1, 4)
                elif "_test" in request.POST:
                    self._test_send(request, form)
                elif "_create" in request.POST:
                    campaign = self._create(request, form)
                    if campaign is not None:
                        return HttpResponseRedirect(reverse("admin:campaigns_campaign_progress", args=[campaign.pk]))
                if step >= 2 and not form.errors:
                    preview = sample_preview(form)
        data = getattr(form, "cleaned_data", {}) or {}
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"New campaign — step {step} of 4: {STEPS[step]}",
            "form": form,
            "step": step,
            "steps": STEPS,
            "fields": form.step_fields(step),
            "hidden": form.hidden_fields_for(step),
            "preview": preview,
            "review": data if step == 4 else {},
            "send_at": form.send_at() if step == 4 and data else None,
            "send_at_local": form.send_at_local_value() if step == 4 and data else "",
            "user_email": _staff(request).email,
        }
        return TemplateResponse(request, "admin/campaigns/campaign/wizard.html", context)

    def _test_send(self, request: HttpRequest, form: CampaignWizardForm) -> None:
        data = form.cleaned_data
        template = form.template_obj()
        try:
            notification = campaign_test_send(
                client=data["client"],
                template=data["template"],
                category=template.category if template else "marketing",
                payload=form.parsed_payload(),
                staff_user_id=str(request.user.pk),
                email=_staff(request).email,
            )
        except (ApiError, TemplateNotFound) as exc:
            form.add_error("template", getattr(exc, "message", str(exc)))
            return
        delivery = notification.deliveries.order_by("id").first()
        audit_record(
            actor=request.user,
            action="campaign.test_send",
            target_type="template",
            target_id=data["template"],
            changes={"notification": [None, str(notification.pk)]},
        )
        state = f"delivery #{delivery.pk}, {delivery.status}" if delivery else "no delivery"
        self.message_user(request, f"Test sent to {_staff(request).email} ({state}).", messages.SUCCESS)

    def _create(self, request: HttpRequest, form: CampaignWizardForm) -> Campaign | None:
        data = form.cleaned_data
        template = form.template_obj()
        try:
            campaign = campaign_create(
                client=data["client"],
                name=data["name"],
                template=data["template"],
                topic=data["topic"],
                category=template.category if template else "marketing",
                channels=list(data.get("channels") or []),
                payload=form.parsed_payload(),
                send_at=form.send_at(),
                send_at_local=form.send_at_local_value(),
                timezone=data["time_zone"],
                rate_per_second=data["rate_per_second"],
            )
        except ApiError as exc:
            field = next(iter(exc.fields), None)
            form.add_error(field if field in form.fields else None, exc.message)
            return None
        audit_record(
            actor=request.user,
            action="campaign.create",
            target_type="campaign",
            target_id=campaign.pk,
            changes={
                "name": [None, campaign.name],
                "topic": [None, data["topic"]],
                "template": [None, campaign.template_key],
                "send_at": [None, campaign.send_at.isoformat() if campaign.send_at else "now"],
                "send_at_local": [None, campaign.send_at_local or None],
                "timezone": [None, campaign.timezone],
                "rate_per_second": [None, campaign.rate_per_second],
            },
        )
        self.message_user(request, f"Campaign '{campaign.name}' created ({campaign.status}).", messages.SUCCESS)
        return campaign

    def progress_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show a campaign's live progress: counts, rate, charts, and pause, resume, cancel."""
        if not self.has_view_permission(request):
            raise PermissionDenied  # campaigns are not for this role at all
        campaign = get_object_or_404(self.get_queryset(request).select_related("topic"), pk=object_id)
        if not self.has_view_permission(request, campaign):
            raise PermissionDenied
        progress = campaign_progress(campaign=campaign)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Campaign: {campaign.name}",
            "campaign": campaign,
            "progress": progress,
            "rate": campaign_rate(campaign),
            "charts": progress_charts(campaign, progress),
            "live": campaign.status in (Campaign.Status.SCHEDULED, Campaign.Status.RUNNING),
            "can_pause": self._may(request, "pause", campaign)
            and campaign.status in pausable_from(campaign)
            and (campaign.status != Campaign.Status.DONE or progress["pending"] > 0),
            "can_resume": self._may(request, "resume", campaign) and campaign.status == Campaign.Status.PAUSED,
            "can_cancel": self._may(request, "cancel", campaign)
            and campaign.status not in (Campaign.Status.CANCELLED, Campaign.Status.DONE),
        }
        return TemplateResponse(request, "admin/campaigns/campaign/progress.html", context)

    def control_view(self, request: HttpRequest, object_id: str, verb: str) -> HttpResponse:
        """Pause, resume or cancel one campaign from its progress page (the campaign services), audited."""
        services = {"pause": campaign_pause, "resume": campaign_resume, "cancel": campaign_cancel}
        if verb not in services or not self.may(request, verb):
            raise PermissionDenied  # in none of the user's projects
        campaign = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not self._may(request, verb, campaign):
            raise PermissionDenied
        before = campaign.status
        try:
            affected = services[verb](campaign=campaign)
        except ApiError as exc:
            self.message_user(request, exc.message, messages.WARNING)
        else:
            audit_record(
                actor=request.user,
                action=f"campaign.{verb}",
                target_type="campaign",
                target_id=campaign.pk,
                changes={"status": [before, campaign.status]},
            )
            self.message_user(request, f"Campaign {campaign.status} ({affected} deliveries affected).")
        return HttpResponseRedirect(reverse("admin:campaigns_campaign_progress", args=[campaign.pk]))

    @admin.action(description="Pause the selected campaigns", permissions=["pause"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._apply(request, queryset, campaign_pause, "paused")

    @admin.action(description="Resume the selected campaigns", permissions=["resume"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._apply(request, queryset, campaign_resume, "resumed")

    @admin.action(description="Cancel the selected campaigns", permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._apply(request, queryset, campaign_cancel, "cancelled")
