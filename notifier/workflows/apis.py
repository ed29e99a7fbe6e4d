"""Workflows over the API: save versions, read and list them (thin: validate, call a service, render)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from core.openapi import error_response
from core.pagination import CursorPage, cursor_id
from core.serializers import validate_with
from notifier.clients.auth import request_client
from notifier.workflows.selectors import WorkflowNotFound, promotion_list, workflow_get, workflow_list
from notifier.workflows.serializers import (
    PromotionInput,
    PromotionListOutput,
    PromotionOutput,
    WorkflowListQuery,
    WorkflowOutput,
    WorkflowPage,
    WorkflowPutInput,
    WorkflowVersionOutput,
)
from notifier.workflows.services import promotion_apply, workflow_put, workflow_rollback
from projects.scoping import owner_id
from templates_app.serializers import RollbackInputSerializer

EXAMPLE = {
    "category": "transactional",
    "steps": [
        {"id": "inapp", "type": "send", "channel": "inapp", "template": "comment_added"},
        {"id": "wait", "type": "delay", "seconds": 900},
        {
            "id": "mail", "type": "send", "channel": "email", "template": "comment_added",
            "if": {"step": "inapp", "status_not_in": ["opened"]},
        },
    ],
}  # fmt: skip


def _actor(request: Request) -> str:
    """Name the caller in a version's created_by."""
    return f"api:{getattr(request.user, 'name', '')}"


class WorkflowListApi(APIView):
    """GET /workflows: every workflow, oldest first, keyset-paginated."""

    required_scope = "templates"

    @extend_schema(
        operation_id="workflows_list", summary="List workflows", parameters=[WorkflowListQuery], responses=WorkflowPage
    )
    def get(self, request: Request) -> Response:
        params = WorkflowListQuery(data=request.query_params)
        params.is_valid(raise_exception=True)
        limit = params.validated_data["limit"]
        rows = workflow_list(after_id=cursor_id(params.validated_data.get("cursor")) or 0, limit=limit + 1)
        page = rows[:limit]
        return Response(WorkflowPage(CursorPage(page, page[-1].pk if len(rows) > limit else None)).data)


class WorkflowApi(APIView):
    """PUT /workflows/{key} saves a new version (validated); GET /workflows/{key} reads the workflow."""

    required_scope = "templates"
    # A project that changes its live environment only by promotion refuses a live key's PUT.
    error_statuses = {
        "put": {409: "`promotion_required`: the project changes its live environment only by promotion from test."}
    }

    @extend_schema(
        operation_id="workflow_put",
        summary="Create a workflow version",
        request=WorkflowPutInput,
        responses={201: WorkflowVersionOutput, 400: error_response(400, "A step is invalid (the message names it).")},
        examples=[OpenApiExample("Read in time, or an email", value=EXAMPLE, request_only=True)],
    )
    def put(self, request: Request, key: str) -> Response:
        data = validate_with(WorkflowPutInput, request.data)
        version = workflow_put(
            key=key,
            category=data["category"],
            steps=data["steps"],
            actor=_actor(request),
            audit_actor=request.user,
            enforce_promotion=True,
        )
        return Response(WorkflowVersionOutput(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="workflow_get",
        summary="Read a workflow",
        responses={200: WorkflowOutput, 404: error_response(404, "No such workflow.")},
    )
    def get(self, request: Request, key: str) -> Response:
        workflow = workflow_get(key=key)
        if workflow is None:
            raise ApiError(404, "not_found", f"No workflow '{key}'.")
        return Response(WorkflowOutput(workflow).data)


class WorkflowRollbackApi(APIView):
    """POST /workflows/{key}/rollback: make an earlier version the one sends run again, as the next version."""

    required_scope = "templates"

    @extend_schema(
        operation_id="workflow_rollback",
        summary="Roll a workflow back to an earlier version",
        request=RollbackInputSerializer,
        responses={201: WorkflowVersionOutput, 404: error_response(404, "No such workflow, or no such version.")},
    )
    def post(self, request: Request, key: str) -> Response:
        if workflow_get(key=key) is None:  # an unknown workflow is a 404 whatever the body
            raise ApiError(404, "not_found", f"No workflow '{key}'.")
        data = validate_with(RollbackInputSerializer, request.data)
        try:
            version = workflow_rollback(
                key=key, version=data["version"], actor=_actor(request), audit_actor=request.user
            )
        except WorkflowNotFound as exc:
            raise ApiError(404, "not_found", str(exc)) from None
        return Response(WorkflowVersionOutput(version).data, status=status.HTTP_201_CREATED)


PROMOTION_EXAMPLE = {
    "kind": "template",
    "key": "order_shipped",
    "test_version": 5,
    "live_version": 3,
    "diff": "--- live/template/order_shipped@3\n+++ test/template/order_shipped@5\n@@ -4,7 +4,7 @@\n"
    '       "email": {\n-        "subject": "Shipped"\n+        "subject": "Your order {{ order_id }} shipped"\n',
}


class PromotionApi(APIView):
    """GET /promotion lists what test has that live does not; POST /promotion copies it to live."""

    required_scope = "templates"

    @extend_schema(
        operation_id="promotion_list",
        summary="List what test would promote to live",
        description="Every layout, template and workflow of the key's project whose version in the test "
        "environment (a template's published version, a layout's or workflow's newest) differs from the live "
        "environment's, with a diff to review. Either environment's key of the project may call it.",
        responses={200: PromotionListOutput},
        examples=[OpenApiExample("A changed template", value={"results": [PROMOTION_EXAMPLE]}, response_only=True)],
    )
    def get(self, request: Request) -> Response:
        candidates = promotion_list(environment_id=owner_id(request_client(request)))
        return Response(PromotionListOutput({"results": candidates}).data)

    @extend_schema(
        operation_id="promotion_apply",
        summary="Promote from test to live",
        description="Copies each item's test version to live as live's next version (published), audit-logged. "
        "Layouts are written first, then templates, then workflows, whatever the order of the items; the answer "
        "has one result per item, in order, with the HTTP `status` that item would have had alone.",
        request=PromotionInput,
        responses={200: PromotionOutput},
        examples=[
            OpenApiExample(
                "A template and its layout",
                value={"items": [{"kind": "template", "key": "order_shipped"}, {"kind": "layout", "key": "brand"}]},
                request_only=True,
            ),
            OpenApiExample(
                "One promoted, one unknown",
                value={
                    "results": [
                        {"kind": "template", "key": "order_shipped", "status": 200, "live_version": 4},
                        {
                            "kind": "layout", "key": "brand", "status": 404, "live_version": None,
                            "error": {
                                "code": "not_found", "message": "No layout 'brand' in test.",
                                "fields": {"key": ["no such layout in test"]},
                            },
                        },
                    ]
                },
                response_only=True,
            ),
        ],
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        data = validate_with(PromotionInput, request.data)
        results = promotion_apply(
            environment_id=owner_id(request_client(request)),
            items=data["items"],
            actor=_actor(request),
            audit_actor=request.user,
            client_id=request.user.pk,
            allowed_categories=getattr(request.user, "allowed_categories", None),
        )
        return Response(PromotionOutput({"results": results}).data)
