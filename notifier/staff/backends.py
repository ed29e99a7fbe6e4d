"""Staff permissions per project: a member's role applies to the objects of the project it was given in.

Django's ModelBackend answers "may this user change templates?" for all objects at once; a staff user who is
`support` in one project and `marketing` in another has no single answer. This backend (AUTHENTICATION_BACKENDS,
in place of ModelBackend) answers it per object: `user.has_perm("templates_app.change_template", template)`
holds if the role the user has in the template's project holds that permission. The admin of owned models
(projects.admin.OwnedAdmin) asks it so for each object, and asks with a Project to learn in which projects a
user holds a permission (what its lists show).

- A **member** of projects (projects.Membership) holds, in each of those projects, the permissions of the
  role (its list in notifier/staff/roles.py, from which the migration made the "Support" and "Marketing"
  groups) and those granted to them personally (user permissions), and nothing in other projects. Their
  groups do not count: a member of several projects has no single role. Asked without an object (may they
  open the deliveries' list at all, the admin's index, the dashboard's link), they hold what any of their
  roles holds.
- A staff user who is a member of **no project** keeps their groups and permissions, on the project `default`
  (which is what every staff user saw before projects).
- Superusers hold everything (Django's own rule, before any backend is asked).
- Rows of an owned table without an owner (an installation-wide suppression) are readable by whoever may read
  that table in some project, and changed by superusers only.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend

from notifier.staff.roles import ROLE_PERMISSIONS, ROLES
from projects.models import Membership
from projects.selectors import default_project_id, project_id_of


def _roles(user: Any) -> dict[int, str]:
    """Return the user's role per project id (read once per user object, so once per request)."""
    if not hasattr(user, "_project_roles"):
        user._project_roles = dict(Membership.objects.filter(user=user).values_list("project_id", "role"))
    return user._project_roles


def _role_permissions(user: Any) -> dict[str, set[str]]:
    """Return the permissions ("app.codename") of each role the user holds somewhere (notifier/staff/roles.py)."""
    return {role: set(ROLE_PERMISSIONS[ROLES[role]]) for role in set(_roles(user).values()) if role in ROLES}


class ProjectRoleBackend(ModelBackend):
    """ModelBackend, with a member's permissions taken from their role in each project (see the module)."""

    def get_group_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        # A member's groups do not count: their roles, per project, replace them.
        if user_obj.is_active and not user_obj.is_anonymous and _roles(user_obj):
            return set()
        return super().get_group_permissions(user_obj, obj)

    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous:
            return set()
        # Without an object: the user's own (and a non-member's groups'), cached by ModelBackend on the user.
        own = super().get_all_permissions(user_obj)
        roles = _roles(user_obj)
        by_role = _role_permissions(user_obj) if roles else {}
        if obj is None:
            return own.union(*by_role.values())
        owned, project_id = project_id_of(obj)
        if not owned:
            return set()  # not an object of a project: no object permissions, as ModelBackend
        if project_id is None:
            anywhere = own.union(*by_role.values())
            return {perm for perm in anywhere if perm.partition(".")[2].startswith("view_")}
        if not roles:
            return own if project_id == default_project_id() else set()
        role = roles.get(project_id)
        return own | by_role.get(role, set()) if role is not None else set()
