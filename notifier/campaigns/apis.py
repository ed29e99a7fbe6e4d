"""REST endpoints for campaigns. Thin: validate, call a service, render."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from notifier.auth import request_client
from notifier.campaigns.selectors import campaign_get, campaign_list, campaign_progress, campaign_runs
from notifier.campaigns.services import (
    campaign_cancel,
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_update,
)
from notifier.errors import ApiError
from notifier.models import Campaign

MAX_RATE = 100_000


class CampaignInput(serializers.Serializer):
    """The body of POST /api/v1/campaigns (and, all fields optional, of PATCH)."""

    name = serializers.CharField(max_length=255)
    template = serializers.RegexField(r"^[-a-zA-Z0-9_]+(@[1-9][0-9]*)?$", max_length=140)
    topic = serializers.SlugField(max_length=128)
    category = serializers.CharField(max_length=64, required=False)  # default: the template's
    channels = serializers.ListField(
        child=serializers.ChoiceField(choices=settings.CHANNELS), required=False, allow_empty=False, max_length=5
    )
    payload = serializers.DictField(required=False, default=dict)
    send_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    crontab = serializers.CharField(max_length=128, required=False, allow_blank=True, default="")
    timezone = serializers.CharField(max_length=64, default="UTC")
    rate_per_second = serializers.IntegerField(min_value=1, max_value=MAX_RATE, default=100)
    draft = serializers.BooleanField(default=False)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def campaign_out(campaign: Campaign, *, detail: bool = False) -> dict[str, Any]:
    """Render a campaign (with its progress and runs in the detail view)."""
    body: dict[str, Any] = {
        "id": campaign.pk,
        "name": campaign.name,
        "status": campaign.status,
        "template": campaign.template_key,
        "topic": campaign.topic.key,
        "category": campaign.category,
        "channels": campaign.channels,
        "payload": campaign.payload,
        "send_at": campaign.send_at,
        "crontab": campaign.crontab,
        "timezone": campaign.timezone,
        "rate_per_second": campaign.rate_per_second,
        "last_run_at": campaign.last_run_at,
        "created_at": campaign.created_at,
    }
    if detail:
        body["progress"] = campaign_progress(campaign=campaign)
        body["runs"] = [
            {
                "notification_id": str(n.pk),
                "status": n.status,
                "created_at": n.created_at,
                "subscribers_processed": n.fanout_processed,
                "recipients_total": n.recipients_total,
            }
            for n in campaign_runs(campaign=campaign)
        ]
    return body


def _get(request: Request, campaign_id: int) -> Campaign:
    campaign = campaign_get(client=request_client(request), campaign_id=campaign_id)
    if campaign is None:
        raise ApiError(404, "not_found", "No such campaign.")
    return campaign


class CampaignListCreateApi(APIView):
    """POST: create (and schedule) a campaign. GET: the client's campaigns."""

    required_scope = "campaigns"

    def post(self, request: Request) -> Response:
        serializer = CampaignInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        campaign = campaign_create(client=request_client(request), **serializer.validated_data)
        return Response(campaign_out(campaign, detail=True), status=status.HTTP_201_CREATED)

    def get(self, request: Request) -> Response:
        return Response({"results": [campaign_out(c) for c in campaign_list(client=request_client(request))]})


class CampaignDetailApi(APIView):
    """GET: a campaign with its progress. PATCH: change a draft or scheduled campaign."""

    required_scope = "campaigns"

    def get(self, request: Request, campaign_id: int) -> Response:
        return Response(campaign_out(_get(request, campaign_id), detail=True))

    def patch(self, request: Request, campaign_id: int) -> Response:
        campaign = _get(request, campaign_id)
        serializer = CampaignInput(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        fields = {k: v for k, v in serializer.validated_data.items() if k in request.data and k != "draft"}
        campaign = campaign_update(campaign=campaign, **fields)
        return Response(campaign_out(campaign, detail=True))


ACTIONS = {"pause": campaign_pause, "resume": campaign_resume, "cancel": campaign_cancel}


class CampaignActionApi(APIView):
    """POST /campaigns/{id}/pause|resume|cancel."""

    required_scope = "campaigns"

    def post(self, request: Request, campaign_id: int, action: str) -> Response:
        service = ACTIONS.get(action)
        if service is None:
            raise ApiError(404, "not_found", f"Unknown campaign action '{action}'.")
        campaign = _get(request, campaign_id)
        affected = service(campaign=campaign)
        campaign.refresh_from_db()
        return Response({**campaign_out(campaign, detail=True), "affected_deliveries": affected})
