"""What is owned, and the short list of what is installation-wide, with the reason for each.

Every model of the project's apps is one of three things (tests/architecture/test_owners.py holds it so):
- it carries its owner in its own `environment` column (projects.scoping.owner_field);
- its default manager is an OwnedManager whose `owner_path` leads through its parent row to such a column;
- it is named here.
"""

from __future__ import annotations

INSTALLATION_WIDE: dict[str, str] = {
    "projects.Project": "the owners themselves",
    "projects.Environment": "the owners themselves",
    "projects.Membership": "a staff user's roles in projects: what the admin narrows by, not what a key makes",
    "audit.AuditEntry": (
        "the audit log of staff, keys and the system across projects, for superusers; an entry names its actor "
        "and target and outlives both"
    ),
}

# Models whose default manager narrows nothing although they are owned, each with the way it is owned.
OWNED_WITHOUT_SCOPE: dict[str, str] = {
    # Authentication reads every environment's keys by their hash; the admin narrows clients by membership.
    "clients.ApiClient": "environment",
}
