"""API-key scopes: what each one allows (docs/security.md, "API keys and scopes") and how views declare theirs.

Every DRF view under /api/v1/ declares the scope it needs, either for every method with
`required_scope = "send"` or per method with `required_scopes = {"GET": "recipients:read", ...}`.
`notifier.clients.auth.ScopePermission` (the project's default permission class) enforces it: a key without the scope
gets a 403
`scope_missing` naming it, and a view that declares nothing is refused for every key (fail closed).
"""

from __future__ import annotations

from typing import Any

# Name -> what it allows; the order is the one docs/security.md lists them in.
SCOPES: dict[str, str] = {
    "send": "send, list, read and cancel its own notifications; its delivery statistics; manage its own event "
    "endpoint; read its project and quotas",
    "recipients:read": "list, find and read recipients, devices, preferences and inboxes",
    "recipients:write": "change or erase recipients, devices, preferences; mint inbox tokens and preference links",
    "templates": "list, create, read, preview, change and publish the templates and layouts of its project environment",
    "templates:admin": "kept for compatibility: grants nothing more than templates",
    "topics": "list and create topics, subscribe and unsubscribe users; send to a topic (with send or campaigns)",
    "suppressions": "list, add and remove suppression-list entries",
    "campaigns": "create, change, pause and resume campaigns",
    "operations": "dead letters (list, replay, discard) and sandbox messages",
}
# Recipient endpoints: reading needs recipients:read, any change recipients:write.
RECIPIENT_SCOPES: dict[str, str] = {
    "GET": "recipients:read",
    "PUT": "recipients:write",
    "POST": "recipients:write",
    "PATCH": "recipients:write",
    "DELETE": "recipients:write",
}
DEFAULT_SCOPES: tuple[str, ...] = ("send",)


def default_scopes() -> list[str]:
    """Return the scopes a new client gets unless told otherwise (a callable default for the model field)."""
    return list(DEFAULT_SCOPES)


def parse_scopes(value: str) -> list[str]:
    """Parse "s1,s2" or "all" into a list of known scopes; raise ValueError naming unknown ones."""
    names = [s.strip() for s in value.split(",") if s.strip()]
    if names == ["all"]:
        return list(SCOPES)
    unknown = sorted(set(names) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(unknown)} (known: {', '.join(SCOPES)}, or 'all')")
    return [s for s in SCOPES if s in names]


def view_scope(view: Any, method: str) -> str | None:
    """Return the scope `view` declares for `method` (None when it declares none for it)."""
    per_method: dict[str, str] | None = getattr(view, "required_scopes", None)
    if per_method:
        # HEAD reads like GET; OPTIONS describes the endpoint and needs what its GET needs, if anything.
        scope = per_method.get(method) or (per_method.get("GET") if method in ("HEAD", "OPTIONS") else None)
        if scope:
            return scope
    return getattr(view, "required_scope", None)
