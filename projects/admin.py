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

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from rest_framework.exceptions import ValidationError

from core.errors import ApiError
from projects.forms import ProjectForm
from projects.models import Environment, Membership, Project
from projects.promotion import Reader, promotion_candidates, version_diff
from projects.quotas import quotas_validate
from projects.scoping import owner_scope
from projects.selectors import (
    default_project_id,
    environment_id_of,
    owner_path_of,
    project_environment_ids,
    project_id_of,
)


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


class EnvironmentForm(forms.ModelForm):
    """An environment's daily quotas: known channels, whole numbers of messages a day."""

    class Meta:
        model = Environment
        fields = ("quotas",)
        help_texts = {"quotas": 'Daily limits per channel (UTC days), e.g. {"email": 10000, "sms": 500}.'}

    def clean_quotas(self) -> dict[str, int]:
        try:
            return quotas_validate(self.cleaned_data.get("quotas"))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


class EnvironmentInline(admin.TabularInline):
    """A project's two environments and their daily quotas."""

    model = Environment
    form = EnvironmentForm
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

    form = ProjectForm
    list_display = ("slug", "name", "promotion", "rate_limit", "weight", "created_at")
    search_fields = ("slug", "name")
    inlines = (EnvironmentInline, MembershipInline)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # A project made here gets its two environments, as create_project gives them.
        project = form.instance
        for name in Environment.Name.values:
            Environment.objects.get_or_create(project=project, name=name)


class PromotionAdmin(OwnedAdmin):
    """The admin of what a project promotes from test to live (templates, layouts, workflows), by `key`.

    A subclass names its `promotion_kind` and implements the hooks: the reader of what an environment uses, the
    promotion itself and, for kinds whose rollback lives here, the versions and the rollback. An object of a test
    environment gets a "Promote to live" link (the `promotion` read-only field) to a page that shows the diff
    from live's version and promotes on confirmation; the rollback page shows the diff from the version in use.
    Both write through the kind's services, which audit.
    """

    promotion_kind = ""
    # False where the model's admin rolls back its own way (templates: publishing an earlier version again).
    rollback_here = True

    def promotion_reader(self) -> Reader:
        """Return the reader of what an environment uses of this kind (by key)."""
        raise NotImplementedError

    def promotion_allowed(self, request: HttpRequest, obj: Any) -> bool:
        """Say whether the user may promote `obj` (change live's object) or roll it back."""
        return self.has_change_permission(request, obj)

    def promotion_run(self, request: HttpRequest, obj: Any) -> int:
        """Promote `obj` to live through the kind's service; return live's new version."""
        raise NotImplementedError

    def rollback_versions(self, obj: Any) -> tuple[dict[int, dict[str, Any]], int | None]:
        """Return the content of each version of `obj` (by number) and the number of the one in use."""
        raise NotImplementedError

    def rollback_run(self, request: HttpRequest, obj: Any, version: int) -> int:
        """Roll `obj` back to `version` through the kind's service (in its environment); return the new version."""
        raise NotImplementedError

    def _url_name(self, action: str) -> str:
        return f"{self.model._meta.app_label}_{self.model._meta.model_name}_{action}"

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<path:object_id>/promote/",
                self.admin_site.admin_view(self.promote_view),
                name=self._url_name("promote"),
            )
        ]
        if self.rollback_here:
            own.append(
                path(
                    "<path:object_id>/rollback/<int:version>/",
                    self.admin_site.admin_view(self.rollback_view),
                    name=self._url_name("rollback"),
                )
            )
        return own + super().get_urls()

    @admin.display(description="promotion")
    def promotion(self, obj: Any) -> str:
        """Link an object of a test environment to its promotion page."""
        if obj is None or obj.pk is None:
            return "—"
        environment = Environment.objects.get(pk=obj.environment_id)
        if environment.name != Environment.Name.TEST:
            return "changed in live by promotion from test (or directly unless the project requires promotion)"
        url = reverse(f"admin:{self._url_name('promote')}", args=[obj.pk])
        return format_html('<a class="button" href="{}" id="promote-to-live">Promote to live</a>', url)

    def _live_url(self, obj: Any, live_id: int) -> str | None:
        live = self.model._default_manager.filter(environment_id=live_id, key=obj.key).first()
        return reverse(f"admin:{self._url_name('change')}", args=[live.pk]) if live is not None else None

    def promote_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show the diff from live's version to test's (GET), promote on confirmation (POST)."""
        obj = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not self.promotion_allowed(request, obj):
            raise PermissionDenied
        object_url = reverse(f"admin:{self._url_name('change')}", args=[obj.pk])
        environment = Environment.objects.select_related("project").get(pk=obj.environment_id)
        if environment.name != Environment.Name.TEST:
            self.message_user(request, "Only what is in a test environment is promoted to live.", messages.ERROR)
            return HttpResponseRedirect(object_url)
        _, live_id = project_environment_ids(environment_id=environment.pk)
        if request.method == "POST":
            try:
                version = self.promotion_run(request, obj)
            except (ApiError, ValidationError) as exc:
                self.message_user(request, f"Not promoted: {_reasons(exc)}", messages.ERROR)
                return HttpResponseRedirect(object_url)
            self.message_user(
                request, f"{self.promotion_kind} '{obj.key}' promoted: live version {version}.", messages.SUCCESS
            )
            return HttpResponseRedirect(self._live_url(obj, live_id) or object_url)
        candidates = promotion_candidates(
            environment_id=environment.pk, readers={self.promotion_kind: self.promotion_reader()}, keys=[obj.key]
        )
        candidate = candidates[0] if candidates else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Promote {self.promotion_kind} '{obj.key}' of {environment.project.slug} to live?",
            "obj": obj,
            "candidate": candidate,
            "diff_lines": _diff_lines(candidate.diff) if candidate else [],
            "object_url": object_url,
            "live_url": self._live_url(obj, live_id),
        }
        return TemplateResponse(request, "admin/projects/promote_confirm.html", context)

    def rollback_view(self, request: HttpRequest, object_id: str, version: int) -> HttpResponse:
        """Show the diff from the version in use to an earlier one (GET), roll back to it on confirmation (POST)."""
        obj = get_object_or_404(self.get_queryset(request), pk=object_id)
        if not self.promotion_allowed(request, obj):
            raise PermissionDenied
        object_url = reverse(f"admin:{self._url_name('change')}", args=[obj.pk])
        versions, current = self.rollback_versions(obj)
        if version not in versions:
            raise Http404(f"{self.promotion_kind} '{obj.key}' has no version {version}")
        if request.method == "POST":
            try:
                made = self.rollback_run(request, obj, version)
            except (ApiError, ValidationError) as exc:
                self.message_user(request, f"Not rolled back: {_reasons(exc)}", messages.ERROR)
            else:
                self.message_user(request, f"Version {version} is in use again, as version {made}.", messages.SUCCESS)
            return HttpResponseRedirect(object_url)
        diff = version_diff(
            versions.get(current) if current is not None else None,
            versions[version],
            old_label=f"{obj.key}@{current} (in use)",
            new_label=f"{obj.key}@{version}",
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Roll {self.promotion_kind} '{obj.key}' back to version {version}?",
            "obj": obj,
            "version": version,
            "current": current,
            "diff_lines": _diff_lines(diff) if version != current else [],
            "object_url": object_url,
        }
        return TemplateResponse(request, "admin/projects/rollback_confirm.html", context)


def _reasons(exc: Exception) -> str:
    """Say why a promotion or rollback was refused, in one line."""
    if isinstance(exc, ApiError):
        return exc.message
    detail = getattr(exc, "detail", exc)
    if isinstance(detail, dict):
        return "; ".join(f"{field}: {', '.join(map(str, why if isinstance(why, list) else [why]))}"
                         for field, why in detail.items())  # fmt: skip
    return str(detail)


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    """Return the lines of a unified diff with the class that colours them: added, removed, a hunk's header."""
    kinds = {"+": "diff-add", "-": "diff-sub", "@": "diff-hunk"}
    return [(kinds.get(line[:1], "") if not line.startswith(("+++", "---")) else "diff-file", line)
            for line in diff.splitlines()]  # fmt: skip


def version_rollback_link(parent: Any, version: int, *, current: int | None) -> str:
    """Return the "Roll back to this" link of one version of `parent` (a PromotionAdmin's object), or "in use"."""
    if version == current:
        return "in use"
    opts = parent._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_rollback", args=[parent.pk, version])
    return format_html('<a href="{}">Roll back to this</a>', url)
