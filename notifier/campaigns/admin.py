"""Admin for marketers: create, schedule, pause, resume and cancel campaigns; see their progress."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from notifier.campaigns.selectors import campaign_progress
from notifier.campaigns.services import (
    EDITABLE,
    campaign_cancel,
    campaign_pause,
    campaign_resume,
    campaign_schedule,
    campaign_validate,
)
from notifier.errors import ApiError
from notifier.models import Campaign


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
            "crontab",
            "rate_per_second",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.instance.pk and self.instance.status not in EDITABLE:
            raise forms.ValidationError(f"A {self.instance.status} campaign cannot be changed; pause or cancel it.")
        if data.get("client") and data.get("template_key"):
            try:
                campaign_validate(
                    client=data["client"],
                    template=data["template_key"],
                    category=data.get("category") or "marketing",
                    channels=list(data.get("channels") or []),
                    crontab=(data.get("crontab") or "").strip(),
                    send_at=data.get("send_at"),
                )
            except ApiError as exc:
                field = next(iter(exc.fields), None)
                target = {"template": "template_key"}.get(field or "", field)
                if target in self.fields:
                    self.add_error(target, exc.message)
                else:
                    raise forms.ValidationError(exc.message) from None
        return data


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    """Campaigns; saving schedules through django-celery-beat, actions pause, resume and cancel."""

    form = CampaignForm
    list_display = ("name", "topic", "template_key", "status", "send_at", "crontab", "rate_per_second", "last_run_at")
    list_filter = ("status", "category")
    search_fields = ("name", "template_key", "topic__key")
    list_select_related = ("topic",)
    readonly_fields = ("status", "periodic_task", "last_run_at", "progress")
    actions = ("pause", "resume", "cancel")

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

    def _apply(self, request: HttpRequest, queryset: QuerySet[Campaign], service: Any, verb: str) -> None:
        for campaign in queryset:
            try:
                affected = service(campaign=campaign)
            except ApiError as exc:
                self.message_user(request, f"{campaign}: {exc.message}", messages.WARNING)
            else:
                self.message_user(request, f"{campaign}: {verb} ({affected} deliveries affected).")

    @admin.action(description="Pause the selected campaigns")
    def pause(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._apply(request, queryset, campaign_pause, "paused")

    @admin.action(description="Resume the selected campaigns")
    def resume(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._apply(request, queryset, campaign_resume, "resumed")

    @admin.action(description="Cancel the selected campaigns")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._apply(request, queryset, campaign_cancel, "cancelled")
