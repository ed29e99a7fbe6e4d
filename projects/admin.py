"""Projects in the admin, and what every owned model's admin shares: staff see the projects they are members of."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from projects.models import DEFAULT_PROJECT_SLUG, Environment, Membership, Project


def member_project_ids(user: Any) -> list[int] | None:
    """Return the ids of the projects a staff user may see, or None for all (a superuser).

    A staff user who is a member of no project sees the project `default`: before projects every staff user saw
    everything, which an upgrade put there (docs/projects.md).
    """
    if user.is_superuser:
        return None
    ids = list(Membership.objects.filter(user=user).values_list("project_id", flat=True))
    if ids:
        return ids
    return list(Project.objects.filter(slug=DEFAULT_PROJECT_SLUG).values_list("id", flat=True))


class OwnedAdmin(admin.ModelAdmin):
    """The admin of an owned model: lists only the member's projects; an object's owner never changes."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        projects = member_project_ids(request.user)
        if projects is None:
            return queryset
        path = getattr(self.model._default_manager, "owner_path", "environment_id")
        return queryset.filter(**{path.removesuffix("_id") + "__project_id__in": projects})

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        has_column = any(f.name == "environment" for f in self.model._meta.fields)
        if obj is not None and has_column and "environment" not in fields:
            fields.append("environment")
        return fields


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
