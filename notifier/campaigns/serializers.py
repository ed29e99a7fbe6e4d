"""Input and output serializers of the campaigns API."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.serializers import JsonObjectField
from notifier.accepting.serializers import TEMPLATE_SPEC, StrictSerializer
from notifier.campaigns.models import Campaign
from notifier.campaigns.selectors import campaign_progress, campaign_runs

MAX_RATE = 100_000


class CampaignInput(StrictSerializer):
    """The body of POST /api/v1/campaigns (and, all fields optional, of PATCH)."""

    name = serializers.CharField(max_length=255)
    template = serializers.RegexField(TEMPLATE_SPEC, max_length=140)
    topic = serializers.SlugField(max_length=128)
    category = serializers.CharField(max_length=64, required=False, help_text="Default: the template's.")
    channels = serializers.ListField(
        child=serializers.ChoiceField(choices=settings.CHANNELS), required=False, allow_empty=False, max_length=5
    )
    payload = JsonObjectField(required=False, default=dict)
    send_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    crontab = serializers.CharField(max_length=128, required=False, allow_blank=True, default="")
    timezone = serializers.CharField(max_length=64, default="UTC")
    # Optional, instead of send_at: that wall-clock time in each subscriber's own time zone (`timezone` for
    # subscribers without one); validated by campaign_validate.
    send_at_local = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    rate_per_second = serializers.IntegerField(min_value=1, max_value=MAX_RATE, default=100)
    draft = serializers.BooleanField(default=False)


class CampaignProgressSerializer(serializers.Serializer):
    """Deliveries of every run of a campaign, counted."""

    targeted = serializers.IntegerField()
    sent = serializers.IntegerField()
    failed = serializers.IntegerField()
    suppressed = serializers.IntegerField()
    pending = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    by_status = serializers.DictField(child=serializers.IntegerField())


class CampaignRunSerializer(serializers.Serializer):
    """One run of a campaign: the topic notification it created."""

    notification_id = serializers.CharField(source="pk")
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    subscribers_processed = serializers.IntegerField(source="fanout_processed")
    recipients_total = serializers.IntegerField(allow_null=True)


class CampaignOutput(serializers.Serializer):
    """A campaign."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField()
    template = serializers.CharField(source="template_key")
    topic = serializers.CharField(source="topic.key")
    category = serializers.CharField()
    channels = serializers.ListField(child=serializers.CharField())
    payload = serializers.JSONField()
    send_at = serializers.DateTimeField(allow_null=True)
    crontab = serializers.CharField()
    timezone = serializers.CharField()
    send_at_local = serializers.SerializerMethodField()
    rate_per_second = serializers.IntegerField()
    last_run_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()

    def get_send_at_local(self, campaign: Campaign) -> str | None:
        """Return the recipient-local wall-clock time, or None when the campaign runs at one instant."""
        return campaign.send_at_local or None


class CampaignDetailOutput(CampaignOutput):
    """A campaign with its progress and its runs, newest first."""

    progress = serializers.SerializerMethodField()
    runs = serializers.SerializerMethodField()

    @extend_schema_field(CampaignProgressSerializer)
    def get_progress(self, campaign: Campaign) -> dict[str, Any]:
        return CampaignProgressSerializer(campaign_progress(campaign=campaign)).data

    @extend_schema_field(CampaignRunSerializer(many=True))
    def get_runs(self, campaign: Campaign) -> list[dict[str, Any]]:
        return CampaignRunSerializer(campaign_runs(campaign=campaign), many=True).data  # type: ignore[return-value]  # many=True gives a ListSerializer: .data is a list, the stubs say a dict


class CampaignActionOutput(CampaignDetailOutput):
    """A campaign after pause, resume or cancel, with how many deliveries the action touched."""

    affected_deliveries = serializers.SerializerMethodField()

    def get_affected_deliveries(self, campaign: Campaign) -> int:
        return self.context["affected_deliveries"]


class CampaignListOutput(serializers.Serializer):
    """The client's campaigns."""

    results = CampaignOutput(many=True)
