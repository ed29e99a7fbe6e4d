"""Write audit entries. Callers describe the actor; values are masked before they are stored."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit.models import AuditEntry
from core.logs import mask_value


@dataclass(frozen=True)
class Actor:
    """Who made a change: `kind` is one of AuditEntry.ActorType."""

    kind: str
    id: str = ""
    name: str = ""


SYSTEM = Actor(AuditEntry.ActorType.SYSTEM, name="system")


def actor_for(principal: Any) -> Actor:
    """Return the actor for an API client, a Django user or an Actor (anything else counts as the system)."""
    if isinstance(principal, Actor):
        return principal
    if principal is None:
        return SYSTEM
    # An API client has `key_prefix`; a Django user has `get_username`. Duck-typed so this app imports neither.
    if hasattr(principal, "key_prefix"):
        return Actor(AuditEntry.ActorType.CLIENT, str(principal.pk), str(principal.name))
    if hasattr(principal, "get_username"):
        return Actor(AuditEntry.ActorType.STAFF, str(principal.pk), str(principal.get_username()))
    return SYSTEM


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Return `{field: [before, after]}` for the fields whose value differs (fields missing on one side are None)."""
    return {
        name: [before.get(name), after.get(name)]
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name)
    }


def audit_record(
    *, actor: Any, action: str, target_type: str, target_id: Any = "", changes: Mapping[str, Any] | None = None
) -> AuditEntry:
    """Append one audit entry; `changes` is stored with personal data masked (emails, phones, tokens, secrets)."""
    who = actor_for(actor)
    masked = mask_value(dict(changes or {}))
    return AuditEntry.objects.create(
        actor_type=who.kind,
        actor_id=who.id[:64],
        actor_name=who.name[:150],
        action=action[:64],
        target_type=target_type[:64],
        target_id=str(target_id)[:255],
        changes=masked,
    )


def audit_forget_target(*, target_type: str, target_id: str, replacement: str) -> int:
    """Rename the target of every entry about an erased object (its id is personal data); return how many.

    The one change ever made to the audit log: the entries stay, with what happened and when, but no longer
    name the person (their `changes` were masked when written).
    """
    return AuditEntry.objects.filter(target_type=target_type, target_id=target_id).update(target_id=replacement)
