"""Writes of API clients: creating one with its first key, assigning and rotating keys, webhook secrets."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from audit.services import audit_record
from core.scopes import DEFAULT_SCOPES, SCOPES
from core.webhook_secrets import SECRET_PREFIX, decode_secret
from notifier.clients.auth import generate_key, hash_key
from notifier.clients.models import ApiClient
from projects.models import DEFAULT_PROJECT_SLUG
from projects.selectors import ProjectNotFound, environment_of


def api_client_create(
    *,
    name: str,
    allowed_categories: list[str] | None = None,
    scopes: list[str] | None = None,
    mode: str = ApiClient.Mode.LIVE,
    project: str = DEFAULT_PROJECT_SLUG,
    audit_actor: Any = None,
) -> tuple[ApiClient, str]:
    """Create an API client and return it with its raw key (shown once, stored only hashed).

    `scopes` defaults to `send` only (core.scopes.DEFAULT_SCOPES). A `test` client's deliveries all go to the
    sandbox provider (docs/api.md, "Test keys"). The key belongs to the `mode` environment of `project` (a slug):
    everything it makes is that environment's (docs/projects.md).
    """
    if mode not in ApiClient.Mode.values:
        raise ValueError(f"unknown mode: {mode} (known: {', '.join(ApiClient.Mode.values)})")
    unknown = sorted(set(allowed_categories or []) - set(settings.NOTIFIER_CATEGORIES))
    if unknown:
        raise ValueError(f"unknown categories: {', '.join(unknown)}")
    scopes = list(DEFAULT_SCOPES) if scopes is None else scopes
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(unknown)}")
    try:
        environment = environment_of(project=project, mode=mode)
    except ProjectNotFound as exc:
        raise ValueError(str(exc)) from None
    raw_key, prefix = generate_key()
    client = ApiClient.objects.create(
        environment=environment,
        name=name,
        key_prefix=prefix,
        key_hash=hash_key(raw_key),
        allowed_categories=allowed_categories or [],
        scopes=scopes,
        mode=mode,
    )
    if audit_actor is not None:
        changes = {
            "scopes": [None, scopes],
            "allowed_categories": [None, client.allowed_categories],
            "mode": [None, mode],
            "project": [None, project],
        }
        audit_record(actor=audit_actor, action="api_client.create", target_type="api_client", target_id=client.pk,
                     changes=changes)  # fmt: skip
    return client, raw_key


def api_client_assign_key(*, client: ApiClient) -> str:
    """Give an (unsaved or saved) client a new key's prefix and hash without saving; return the raw key."""
    raw_key, prefix = generate_key()
    client.key_prefix, client.key_hash = prefix, hash_key(raw_key)
    return raw_key


def api_client_rotate_key(*, client: ApiClient, audit_actor: Any = None) -> str:
    """Give a client a new key (the old one stops working at once) and return it."""
    old_prefix = client.key_prefix
    raw_key = api_client_assign_key(client=client)
    client.save(update_fields=["key_prefix", "key_hash"])
    if audit_actor is not None:
        audit_record(actor=audit_actor, action="api_client.rotate_key", target_type="api_client", target_id=client.pk,
                     changes={"key_prefix": [old_prefix, client.key_prefix]})  # fmt: skip
    return raw_key


# Standard Webhooks secrets carry 24 to 64 random bytes.
WEBHOOK_SECRET_BYTES = (24, 64)


def webhook_secret_problem(secret: str) -> str | None:
    """Return why `secret` is not a usable "whsec_<base64>" signing secret, or None when it is one."""
    if not secret.startswith(SECRET_PREFIX):
        return f"Must start with '{SECRET_PREFIX}' followed by base64 (Standard Webhooks)."
    try:
        raw = decode_secret(secret)
    except ValueError:
        return f"The part after '{SECRET_PREFIX}' must be base64."
    low, high = WEBHOOK_SECRET_BYTES
    if not low <= len(raw) <= high:
        return f"The secret must decode to {low} to {high} bytes, not {len(raw)}."
    return None
