"""Projects in the admin, and what every owned model's admin shares: staff see and change their projects' objects.

What a staff user may do is asked of Django with the object at hand, `user.has_perm(perm, obj)`, or with a
project, `user.has_perm(perm, project)` ("do they hold it in that project?"), and the authentication backend
answers from the member's role in that project (notifier/staff/backends.py, AUTHENTICATION_BACKENDS; the roles
live above this app). Superusers hold everything everywhere. docs/admin.md, "Projects and roles".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest

from projects.models import Environment, Membership, Project
from projects.scoping import owner_scope
from projects.selectors import default_project_id, environment_id_of, owner_path_of, project_id_of


def member_project_ids(user: Any, *perms: str) -> list[int] | None:
    """Return the ids of the projects a staff user sees (None: all, for a superuser).

    With `perms`, only the projects where the user holds at least one of them. A staff user who is a member of no
    project sees the project `default`: before projects every staff user saw everything, which an upgrade put
    there (docs/projects.md).
    """
    if user.is_superuser:
        return None
    ids = list(Membership.objects.filter(user=user).values_list("project_id", flat=True))
    if not ids:
        default = default_project_id()
        ids = [] if default is None else [default]
    if not perms:
        return ids
    return [p.pk for p in Project.objects.filter(pk__in=ids) if any(user.has_perm(perm, p) for perm in perms)]


def narrow_to_projects(queryset: QuerySet[Any], projects: list[int] | None, *, shared: bool = False) -> QuerySet[Any]:
    """Return the rows of `queryset` (an owned model's) in `projects` (None: all).

    `shared`: also the rows without an owner of a model that has them (installation-wide suppressions), which
    every project reads.
    """
    if projects is None:
        return queryset
    model = queryset.model
    path = owner_path_of(model)
    if path is None:
        raise ValueError(f"{model._meta.label} is not owned by a project environment")
    # By environment ids rather than a join to the projects: the delivery log is filtered on its own column.
    environments = list(Environment.objects.filter(project_id__in=projects).values_list("id", flat=True))
    condition = Q(**{f"{path}__in": environments})
    if shared and getattr(model._default_manager, "shared_null", False):
        condition |= Q(**{f"{path}__isnull": True})
    return queryset.filter(condition)


class OwnedAdmin(admin.ModelAdmin):
    """The admin of an owned model: each member sees and changes what their role allows in each of their projects.

    - Lists, search, autocomplete and actions read `get_queryset`: the rows of the projects where the user may
      view (or change) this model. Another project's object answers 404 on its pages (superusers keep Django's
      "does not exist" redirect for a missing one).
    - An object's pages and buttons ask the permission with the object (its project's role decides).
    - A list action runs on the selected rows of the projects where the user holds each of the action's
      permissions (`action_permissions` names the custom ones: {"resend": "deliveries.resend_delivery"}).
    - A form's environment field offers the environments of the projects where the user may add this model
      (fixed once the object exists); other owned foreign keys offer the rows of the user's projects.
    - Saving checks the object's project again and runs inside its environment's scope, so the services it
      calls look rows up by name in that environment and inline rows it makes get that owner.
    """

    action_permissions: dict[str, str] = {}

    def perm_name(self, action: str) -> str:
        """Return the Django permission ("app.codename") of an admin action name (view, change, resend...)."""
        if action in self.action_permissions:
            return self.action_permissions[action]
        return f"{self.opts.app_label}.{get_permission_codename(action, self.opts)}"

    def projects_where(self, request: HttpRequest, *actions: str) -> list[int] | None:
        """Return the projects where the user may do any of `actions` on this model (None: all; once a request)."""
        cache: dict[tuple[Any, ...], list[int] | None] = request.__dict__.setdefault("_owned_projects", {})
        key = (self.model, actions)
        if key not in cache:
            cache[key] = member_project_ids(request.user, *(self.perm_name(a) for a in actions))
        return cache[key]

    def may(self, request: HttpRequest, action: str, obj: Any = None) -> bool:
        """Return whether the user may do `action` on `obj` (in its project), or on some object without one."""
        return bool(request.user.has_perm(self.perm_name(action), obj))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        return narrow_to_projects(queryset, self.projects_where(request, "view", "change"), shared=True)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is None and not request.user.is_superuser:
            # Whether it exists in another project or not at all is not the member's to learn.
            raise Http404(f"No {self.opts.verbose_name} with the id {object_id!r} in your projects.")
        return obj

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_view_permission(request, obj)
        if not allowed or obj is None:
            return allowed
        return self.may(request, "view", obj) or self.may(request, "change", obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_change_permission(request, obj)
        return allowed if not allowed or obj is None else self.may(request, "change", obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed = super().has_delete_permission(request, obj)
        return allowed if not allowed or obj is None else self.may(request, "delete", obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        return {
            name: (self._narrowed(entry[0]), name, entry[2]) for name, entry in actions.items() if entry is not None
        }

    def _narrowed(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a list action so it receives only the rows of the projects where the user holds its permissions."""
        needed = tuple(getattr(func, "allowed_permissions", ()))

        @functools.wraps(func)
        def run(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
            for action in needed:
                queryset = narrow_to_projects(queryset, self.projects_where(request, action))
            return func(modeladmin, request, queryset)

        return run

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        related = db_field.remote_field.model
        if related is Environment and "queryset" not in kwargs:
            projects = self.projects_where(request, "add")
            environments = Environment.objects.select_related("project").order_by("project__slug", "name")
            if projects is not None:
                environments = environments.filter(project_id__in=projects)
                kwargs["required"] = True  # only superusers make installation-wide rows
            kwargs["queryset"] = environments
        elif owner_path_of(related) is not None and "queryset" not in kwargs:
            rows = related._default_manager.all()
            kwargs["queryset"] = narrow_to_projects(rows, self.projects_where(request, "add", "change"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        has_column = any(f.name == "environment" for f in self.model._meta.fields)
        if obj is not None and has_column and "environment" not in fields:
            fields.append("environment")
        return fields

    @contextmanager
    def owned(self, request: HttpRequest, obj: Any, *, change: bool) -> Iterator[None]:
        """Check that the user may add (or change) `obj` in its project, then run the block in its environment."""
        if not request.user.is_superuser:
            _, project = project_id_of(obj)
            allowed = self.projects_where(request, "change" if change else "add") or []
            if project is None or project not in allowed:
                raise PermissionDenied
        with owner_scope(environment_id_of(obj)):
            yield

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        with self.owned(request, obj, change=change):
            super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # Inline rows made here (a recipient's devices) belong to their parent's environment.
        with owner_scope(environment_id_of(form.instance)):
            super().save_related(request, form, formsets, change)


class EnvironmentInline(admin.TabularInline):
    """A project's two environments and their daily quotas."""

    model = Environment
    extra = 0
    max_num = 2
    can_delete = False
    fields = ("name", "quotas")
    readonly_fields = ("name",)


class MembershipInline(admin.TabularInline):
    """The staff users of a project and their roles."""

    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    """Projects: settings, environments and members (create new ones with `manage.py create_project` or here)."""

    list_display = ("slug", "name", "promotion", "weight", "created_at")
    search_fields = ("slug", "name")
    inlines = (EnvironmentInline, MembershipInline)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # A project made here gets its two environments, as create_project gives them.
        project = form.instance
        for name in Environment.Name.values:
            Environment.objects.get_or_create(project=project, name=name)
