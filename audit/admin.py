"""The audit log in the admin: read-only for everyone, superusers included."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.forms import BaseFormSet, ModelForm
from django.http import HttpRequest

from audit.models import AuditEntry
from audit.services import audit_record, diff


def _plain(value: Any) -> Any:
    """Return a JSON-friendly form of a form value (model instances by their text, times as ISO text)."""
    if isinstance(value, Model):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


class AuditedAdminMixin:
    """Write an audit entry, with the staff user as actor, for every add, change and delete made in this admin.

    Set `audit_target_type` ("recipient") and, if the id to show is not the primary key, override
    `audit_target_id`. Only the fields the form changed are recorded, masked like every audit entry; inline
    rows (a recipient's devices) are recorded under the parent object.
    """

    audit_target_type = ""

    def audit_target_id(self, obj: Any) -> str:
        return str(obj.pk)

    def _audit(self, request: HttpRequest, action: str, obj: Any, changes: dict[str, Any]) -> None:
        audit_record(
            actor=request.user,
            action=f"{self.audit_target_type}.{action}",
            target_type=self.audit_target_type,
            target_id=self.audit_target_id(obj),
            changes=changes,
        )

    def save_model(self, request: HttpRequest, obj: Any, form: ModelForm, change: bool) -> None:
        names = list(form.changed_data)
        before = {name: _plain(form.initial.get(name)) for name in names} if change else {}
        super().save_model(request, obj, form, change)  # type: ignore[misc]  # mixin: ModelAdmin's, next in the MRO
        after = {name: _plain(form.cleaned_data.get(name)) for name in names}
        changes = diff(before, after)
        if changes or not change:
            self._audit(request, "update" if change else "create", obj, changes)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        target = self.audit_target_id(obj)
        super().delete_model(request, obj)  # type: ignore[misc]  # mixin: ModelAdmin's, next in the MRO
        audit_record(
            actor=request.user, action=f"{self.audit_target_type}.delete", target_type=self.audit_target_type,
            target_id=target,
        )  # fmt: skip

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        targets = [self.audit_target_id(obj) for obj in queryset]
        super().delete_queryset(request, queryset)  # type: ignore[misc]  # mixin: ModelAdmin's, next in the MRO
        for target in targets:
            audit_record(
                actor=request.user, action=f"{self.audit_target_type}.delete", target_type=self.audit_target_type,
                target_id=target,
            )  # fmt: skip

    def save_formset(self, request: HttpRequest, form: ModelForm, formset: BaseFormSet, change: bool) -> None:
        model = getattr(formset, "model", None)
        kind = model._meta.model_name if model is not None else "row"
        records: list[tuple[str, dict[str, Any]]] = []
        for inline in formset.forms:
            if not inline.has_changed() and inline not in getattr(formset, "deleted_forms", []):
                continue
            names = list(inline.changed_data)
            if inline in getattr(formset, "deleted_forms", []):
                records.append((f"{kind}.remove", {n: [_plain(inline.initial.get(n)), None] for n in inline.initial}))
            elif inline.instance.pk is None:
                records.append((f"{kind}.add", {n: [None, _plain(inline.cleaned_data.get(n))] for n in names}))
            else:
                before = {n: _plain(inline.initial.get(n)) for n in names}
                records.append((f"{kind}.update", diff(before, {n: _plain(inline.cleaned_data.get(n)) for n in names})))
        super().save_formset(request, form, formset, change)  # type: ignore[misc]  # mixin: ModelAdmin's, next in the MRO
        for action, changes in records:
            audit_record(
                actor=request.user, action=action, target_type=self.audit_target_type,
                target_id=self.audit_target_id(form.instance), changes=changes,
            )  # fmt: skip


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Browse who changed what; nothing here can be added, edited or deleted."""

    list_display = ("at", "actor_type", "actor_name", "action", "target_type", "target_id")
    list_filter = ("actor_type", "action", "target_type")
    search_fields = ("target_id", "actor_name", "action")
    date_hierarchy = "at"
    readonly_fields = ("at", "actor_type", "actor_id", "actor_name", "action", "target_type", "target_id", "changes")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
