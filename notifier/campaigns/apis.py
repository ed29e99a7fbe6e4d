"""REST endpoints for campaigns. Thin: validate, call a service, render (notifier/campaigns/serializers.py)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from notifier.campaigns.models import Campaign
from notifier.campaigns.selectors import campaign_get, campaign_list
from notifier.campaigns.serializers import (
    CampaignActionOutput,
    CampaignDetailOutput,
    CampaignInput,
    CampaignListOutput,
)
from notifier.campaigns.services import (
    campaign_cancel,
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_update,
)
from notifier.clients.auth import request_client, require_scope


def _get(request: Request, campaign_id: int) -> Campaign:
    campaign = campaign_get(client=request_client(request), campaign_id=campaign_id)
    if campaign is None:
        raise ApiError(404, "not_found", "No such campaign.")
    return campaign


class CampaignListCreateApi(APIView):
    """POST: create (and schedule) a campaign. GET: the client's campaigns."""

    required_scope = "campaigns"

    @extend_schema(
        operation_id="campaign_create",
        summary="Create a campaign",
        request=CampaignInput,
        responses={201: CampaignDetailOutput},
    )
    def post(self, request: Request) -> Response:
        serializer = CampaignInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        # A campaign is a send to a whole topic: the topics scope, besides campaigns (as a topic send needs).
        require_scope(request_client(request), "topics", field="topic", why="a campaign (a send to a topic)")
        campaign = campaign_create(client=request_client(request), **serializer.validated_data)
        return Response(CampaignDetailOutput(campaign).data, status=status.HTTP_201_CREATED)

    @extend_schema(operation_id="campaigns_list", summary="List campaigns", responses=CampaignListOutput)
    def get(self, request: Request) -> Response:
        return Response(CampaignListOutput({"results": campaign_list(client=request_client(request))}).data)


class CampaignDetailApi(APIView):
    """GET: a campaign with its progress. PATCH: change a draft or scheduled campaign."""

    required_scope = "campaigns"
    error_statuses = {"patch": {409: "The campaign is running or finished: pause or cancel it first."}}

    @extend_schema(operation_id="campaign_get", summary="Read a campaign", responses=CampaignDetailOutput)
    def get(self, request: Request, campaign_id: int) -> Response:
        return Response(CampaignDetailOutput(_get(request, campaign_id)).data)

    @extend_schema(
        operation_id="campaign_update",
        summary="Change a draft or scheduled campaign",
        request=CampaignInput(partial=True),
        responses=CampaignDetailOutput,
    )
    def patch(self, request: Request, campaign_id: int) -> Response:
        campaign = _get(request, campaign_id)
        require_scope(request_client(request), "topics", field="topic", why="changing a campaign (a send to a topic)")
        serializer = CampaignInput(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        fields = {k: v for k, v in serializer.validated_data.items() if k in request.data and k != "draft"}
        campaign = campaign_update(campaign=campaign, **fields)
        return Response(CampaignDetailOutput(campaign).data)


ACTIONS = {"pause": campaign_pause, "resume": campaign_resume, "cancel": campaign_cancel}


class CampaignActionApi(APIView):
    """POST /campaigns/{id}/pause|resume|cancel."""

    required_scope = "campaigns"
    error_statuses = {409: "The campaign's state does not allow this action."}

    @extend_schema(
        operation_id="campaign_action",
        summary="Pause, resume or cancel a campaign",
        parameters=[OpenApiParameter("action", str, OpenApiParameter.PATH, enum=sorted(ACTIONS))],
        request=None,
        responses=CampaignActionOutput,
    )
    def post(self, request: Request, campaign_id: int, action: str) -> Response:
        service = ACTIONS.get(action)
        if service is None:
            raise ApiError(404, "not_found", f"Unknown campaign action '{action}'.")
        campaign = _get(request, campaign_id)
        affected = service(campaign=campaign)
        campaign.refresh_from_db()
        return Response(CampaignActionOutput(campaign, context={"affected_deliveries": affected}).data)
