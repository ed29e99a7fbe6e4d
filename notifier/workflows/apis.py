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
from notifier.workflows.selectors import workflow_get, workflow_list
from notifier.workflows.serializers import (
    WorkflowListQuery,
    WorkflowOutput,
    WorkflowPage,
    WorkflowPutInput,
    WorkflowVersionOutput,
)
from notifier.workflows.services import workflow_put

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
            key=key, category=data["category"], steps=data["steps"], actor=f"api:{getattr(request.user, 'name', '')}"
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
