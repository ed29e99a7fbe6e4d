"""The project endpoint: what the calling key's project and environment allow (docs/api.md, "Projects")."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import ApiError
from projects.quotas import quota_usage
from projects.scoping import scope_environment_id
from projects.selectors import environment_settings
from projects.serializers import ProjectOutput

PROJECT_EXAMPLE = {
    "slug": "shop",
    "name": "Shop",
    "environment": "live",
    "quotas": {
        "email": {"limit": 10000, "used": 2417, "resets_at": "2026-12-07T00:00:00Z"},
        "sms": {"limit": 500, "used": 0, "resets_at": "2026-12-07T00:00:00Z"},
    },
    "promotion": "direct",
}


class ProjectApi(APIView):
    """GET /project: the calling key's project, environment, daily quotas and promotion rule."""

    required_scope = "send"

    @extend_schema(
        operation_id="project_get",
        summary="Read the key's project",
        description="The project and environment of the calling key, with each daily quota of the environment "
        "(its limit, what today has used, when it resets: midnight UTC) and the project's promotion rule.",
        responses={200: ProjectOutput},
        examples=[OpenApiExample("A live key with quotas", value=PROJECT_EXAMPLE, response_only=True)],
    )
    def get(self, request: Request) -> Response:
        # Authentication entered the key's environment (projects.scoping): that is the caller's own.
        environment_id = scope_environment_id()
        found = environment_settings(environment_id)
        if found is None:  # the key's environment was deleted while cached: nothing to describe
            raise ApiError(404, "not_found", "This key's project environment no longer exists.")
        quotas = {
            channel: {"limit": u.limit, "used": u.used, "resets_at": u.resets_at}
            for channel, u in quota_usage(environment_id).items()
        }
        body = {
            "slug": found.slug,
            "name": found.name,
            "environment": found.environment,
            "quotas": quotas,
            "promotion": found.promotion,
        }
        return Response(ProjectOutput(body).data)
