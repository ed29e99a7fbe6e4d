"""API-key authentication for calling services."""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any, cast

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from core.scopes import view_scope
from notifier.clients import lookup_cache
from notifier.clients.models import ApiClient
from projects.scoping import enter_request_owner, owner_id

logger = logging.getLogger(__name__)

KEY_PREFIX = "ntf_"


def hash_key(raw_key: str) -> str:
    """Return the stored form of an API key (keys are 256-bit random, so a fast hash is enough)."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


def generate_key() -> tuple[str, str]:
    """Return a new raw API key and its lookup prefix."""
    prefix = secrets.token_hex(4)
    return f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}", prefix


def request_client(request: Request) -> ApiClient:
    """Return the API client that authenticated `request`, typed as one (for views behind ScopePermission).

    DRF types `request.user` as a Django user; on /api/v1 it is the ApiClient that ApiKeyAuthentication
    returned, and ScopePermission has refused every request without one before a view runs.
    """
    return cast(ApiClient, request.user)


def require_scope(client: ApiClient, scope: str, *, field: str, why: str) -> None:
    """Raise 403 `scope_missing` naming `scope` unless the client's key has it (beyond the view's own scope).

    For powers a view grants only for some bodies: sending to a topic needs `topics` besides `send`.
    """
    # Imported here: core.errors imports rest_framework.views, which loads this module as a setting.
    from core.errors import ApiError

    if scope not in (client.scopes or ()):
        raise ApiError(
            403,
            "scope_missing",
            f"This API key lacks the scope '{scope}', which {why} needs.",
            {"scope": [scope], field: [f"needs the '{scope}' scope"]},
        )


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Authenticate `Authorization: Bearer <key>` against the hashed keys of active API clients."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiClient, str] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme != self.keyword or not raw_key.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        key_hash = hash_key(raw_key.strip())
        known = lookup_cache.api_client_cached(key_hash)
        if known is not None and _throttled_per_client(request):
            # This process knows the key: its token is taken and the generation read in one round trip, and the
            # lookup below checks the copy against that generation instead of reading it again.
            from notifier.clients.rate_limit import take_before_authentication  # it imports this module

            take_before_authentication(request, known)
        # Cached per process, invalidated on every save of any client (notifier/lookup_cache.py).
        client: ApiClient | None = lookup_cache.api_client(key_hash)
        if client is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        # Touch last_used_at at most once a minute: no write per request on the hot path.
        now = timezone.now()
        if client.last_used_at is None or (now - client.last_used_at).total_seconds() > 60:
            ApiClient.objects.filter(pk=client.pk).update(last_used_at=now)
            lookup_cache.touched(key_hash, now)
        # Everything the request reads or writes through an owned model is the key's environment's from here on
        # (projects.scoping); the request middleware leaves the scope when the request ends.
        enter_request_owner(owner_id(client))
        return client, raw_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def _throttled_per_client(request: Request) -> bool:
    """Return whether the view `request` is for takes its tokens from the API client's bucket (most do)."""
    from notifier.clients.rate_limit import ApiClientRateThrottle  # it imports this module

    view = (request.parser_context or {}).get("view")
    throttles = getattr(view, "throttle_classes", ())
    return any(isinstance(t, type) and issubclass(t, ApiClientRateThrottle) for t in throttles)


class ScopePermission(BasePermission):
    """Allow an authenticated API client only if its key has the scope the view declares for the method."""

    def has_permission(self, request: Request, view: Any) -> bool:
        # Imported here: core.errors imports rest_framework.views, which loads this module as a setting.
        from core.errors import ApiError

        client = request.user
        if client is None or not getattr(client, "is_authenticated", False) or not isinstance(client, ApiClient):
            return False  # DRF answers 401 (NotAuthenticated) because an authenticator is configured.
        scope = view_scope(view, request.method or "GET")
        if scope is None:
            logger.error("view %s declares no scope for %s; refused", type(view).__name__, request.method)
            raise ApiError(403, "scope_missing", "This endpoint declares no scope; no key may call it.")
        if scope not in (client.scopes or ()):
            raise ApiError(403, "scope_missing", f"This API key lacks the scope '{scope}'.", {"scope": [scope]})
        return True


try:
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
        """Describe the bearer API key in the OpenAPI schema."""

        target_class = "notifier.clients.auth.ApiKeyAuthentication"
        name = "ApiKey"

        def get_security_definition(self, auto_schema: object) -> dict[str, str]:
            return {"type": "http", "scheme": "bearer", "description": "API key from `create_api_client`."}

except ImportError:  # drf-spectacular is a runtime dependency; this only keeps auth importable without it.
    pass
