"""The support console: notifications and deliveries with their history, and the actions on one delivery."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from notifier.accepting.services import CANCELLABLE
from notifier.clients.admin import mode_badge
from notifier.deliveries.models import Delivery, Notification
from notifier.deliveries.selectors import delivery_compliance, delivery_rendered, delivery_search, delivery_timeline
from notifier.dispatch.models import FanoutLane
from notifier.staff.admin_scale import (
    CategoryFilter,
    ChannelFilter,
    CreatedDayFilter,
    CreatedRangeFilter,
    EstimatedCountPaginator,
    NotificationCreatedDayFilter,
    NotificationCreatedRangeFilter,
    PriorityFilter,
    ProviderFilter,
)
from notifier.staff.support import (
    RESENDABLE,
    SupportActionError,
    delivery_address_suppress,
    delivery_address_unsuppress,
    delivery_cancel,
    delivery_resend,
)
from preferences.models import Suppression
from projects.admin import OwnedAdmin
from projects.scoping import owner_id


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that can look but not touch: history is written only by the pipeline."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class FanoutLaneInline(admin.TabularInline):
    """Where each lane of a topic fan-out stands: its range, checkpoint and count (docs/fanout.md)."""

    model = FanoutLane
    fields = ("lane", "cursor", "upper", "processed", "done", "updated_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("lane",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Notification)
class NotificationAdmin(OwnedAdmin, ReadOnlyAdmin):
    """Accepted notifications; a topic notification shows its fan-out lanes."""

    list_display = (
        "id", "client", "mode_badge", "category", "template_key", "template_version", "user_id", "topic", "status"
    )  # fmt: skip
    # As the deliveries' list: two days unless asked, an estimated count, no SELECT DISTINCT for a filter.
    list_filter = (
        NotificationCreatedRangeFilter, NotificationCreatedDayFilter, "status",
        ("client__mode", admin.ChoicesFieldListFilter), CategoryFilter, "priority",
    )  # fmt: skip
    search_fields = ("=id", "=user_id", "=dedup_key", "template_key")
    list_select_related = ("client", "topic")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50
    inlines = (FanoutLaneInline,)

    @admin.display(description="mode", ordering="client__mode")
    def mode_badge(self, obj: Notification) -> str:
        """Mark the notifications of test clients (their deliveries all went to the sandbox)."""
        return mode_badge(obj.client.mode)


@admin.register(Delivery)
class DeliveryAdmin(OwnedAdmin, ReadOnlyAdmin):
    """Deliveries: find a customer's message, read its whole story, resend, cancel, suppress its address."""

    change_form_template = "admin/deliveries/delivery/change_form.html"
    list_display = ("id", "channel", "address", "status", "provider", "attempts", "version_used", "created_at")
    # A fortnight is tens of millions of rows: the list shows today and yesterday unless asked for more, counts
    # by estimate, and offers fixed filter choices (notifier/staff/admin_scale.py).
    list_filter = (
        CreatedRangeFilter,
        CreatedDayFilter,
        "status",
        ChannelFilter,
        ProviderFilter,
        PriorityFilter,
    )
    paginator = EstimatedCountPaginator
    # Rendering a row costs about a millisecond whatever the table's size (the admin's cell machinery): fifty
    # keep a page well under its budget on a busy host; a search finds a few rows, not a hundred.
    list_per_page = 50
    # The search box runs notifier.deliveries.selectors.delivery_search (get_search_results), not these fields.
    search_fields = ("=address",)
    search_help_text = (
        "Exact email, phone, user id, provider message id, notification id, dedup key or delivery id, within the "
        "dates chosen on the right (Any date: every day kept)."
    )
    raw_id_fields = ("notification", "recipient", "template_version", "resent_from")
    list_select_related = ("template_version__template",)
    show_full_result_count = False
    readonly_fields = ("version_used",)
    actions = ("resend_selected", "cancel_selected")
    action_permissions = {
        "resend": "deliveries.resend_delivery",
        "cancel": "deliveries.cancel_delivery",
        "suppress": "preferences.add_suppression",
        "unsuppress": "preferences.delete_suppression",
    }

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Delivery], search_term: str
    ) -> tuple[QuerySet[Delivery], bool]:
        """Search with the indexed lookups of delivery_search (exact terms, never a LIKE over millions)."""
        if not search_term.strip():
            return queryset, False
        found = delivery_search(query=search_term)
        return queryset.filter(pk__in=found.values("pk")), False

    @admin.display(description="template version")
    def version_used(self, obj: Delivery) -> str:
        """Link to the preview of the template version this delivery was rendered from."""
        if obj.template_version_id is None:
            return "-"
        url = reverse("admin:templates_app_templateversion_preview", args=[obj.template_version_id])
        return format_html('<a href="{}">{}</a>', url, obj.template_version)

    # With a delivery: in its project (the member's role there); without: in any of the user's projects (what
    # the list offers; a list action then runs on the selected deliveries of the projects that allow it).
    def has_resend_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return self.may(request, "resend", obj)

    def has_cancel_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return self.may(request, "cancel", obj)

    def has_suppress_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return self.may(request, "suppress", obj)

    def has_unsuppress_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return self.may(request, "unsuppress", obj)

    @admin.action(description="Resend the selected deliveries", permissions=["resend"])
    def resend_selected(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        """Resend each selected delivery as a new one (compliance checked again)."""
        for delivery in queryset.select_related("notification__client", "recipient")[:100]:
            self._resend(request, delivery)

    @admin.action(description="Cancel the selected deliveries (those not yet sent)", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        """Cancel each selected delivery that is still waiting."""
        cancelled = sum(delivery_cancel(delivery=d, actor=request.user) for d in queryset[:1000])
        self.message_user(request, f"{cancelled} deliveries cancelled (those already sent are left alone).")

    def _resend(self, request: HttpRequest, delivery: Delivery) -> Delivery | None:
        try:
            new = delivery_resend(delivery=delivery, actor=request.user)
        except SupportActionError as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return None
        self.message_user(request, f"Delivery #{delivery.pk} resent as #{new.pk} ({new.status}).", messages.SUCCESS)
        return new

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(require_POST(self.act_view)),
                {"action": name},
                name=f"{self.opts.app_label}_{self.opts.model_name}_{name}",
            )
            for name in ("resend", "cancel", "suppress", "unsuppress")
        ]
        return own + super().get_urls()

    def act_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """Apply one action to one delivery from its page, then show the page (or the new delivery's)."""
        check = {
            "resend": self.has_resend_permission,
            "cancel": self.has_cancel_permission,
            "suppress": self.has_suppress_permission,
            "unsuppress": self.has_unsuppress_permission,
        }[action]
        if not check(request):
            raise PermissionDenied  # in none of the user's projects
        delivery = get_object_or_404(
            self.get_queryset(request).select_related("notification__client", "recipient"), pk=object_id
        )
        if not check(request, delivery):
            raise PermissionDenied  # not in this delivery's project
        target = delivery.pk
        try:
            if action == "resend":
                new = self._resend(request, delivery)
                target = new.pk if new is not None else target
            elif action == "cancel":
                done = delivery_cancel(delivery=delivery, actor=request.user)
                self.message_user(
                    request,
                    "Cancelled." if done else f"Not cancelled: the delivery is {delivery.status}.",
                    messages.SUCCESS if done else messages.WARNING,
                )
            elif action == "suppress":
                delivery_address_suppress(delivery=delivery, actor=request.user)
                self.message_user(request, f"The address is now suppressed on {delivery.channel}.", messages.SUCCESS)
            else:
                removed = delivery_address_unsuppress(delivery=delivery, actor=request.user)
                self.message_user(
                    request, "The address is no longer suppressed." if removed else "The address was not suppressed."
                )
        except SupportActionError as exc:
            self.message_user(request, str(exc), messages.WARNING)
        return HttpResponseRedirect(reverse("admin:deliveries_delivery_change", args=[target]))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Add the story of the delivery: timeline, content as sent, compliance, and what can be done."""
        delivery = (
            self.get_queryset(request)
            .select_related("notification__client", "recipient", "template_version__template")
            .filter(pk=object_id)
            .first()
        )
        context = dict(extra_context or {})
        if delivery is not None and self.has_view_permission(request, delivery):
            # The delivery's environment's entries and the installation-wide ones; only the former may be removed.
            entries = Suppression.objects.filter(
                Q(environment_id=owner_id(delivery)) | Q(environment__isnull=True),
                channel=delivery.channel,
                address=delivery.address,
            )
            owned = bool(delivery.address) and entries.filter(environment_id=owner_id(delivery)).exists()
            suppressed = owned or (bool(delivery.address) and entries.exists())
            context.update(
                {
                    "delivery": delivery,
                    "timeline": delivery_timeline(delivery=delivery),
                    "rendered": delivery_rendered(delivery=delivery),
                    "compliance": delivery_compliance(delivery=delivery),
                    "resends": list(delivery.resends.order_by("id").values_list("pk", "status")),
                    "address_suppressed": suppressed,
                    "can_resend": self.has_resend_permission(request, delivery) and delivery.status in RESENDABLE,
                    "can_cancel": self.has_cancel_permission(request, delivery) and delivery.status in CANCELLABLE,
                    "can_suppress": self.has_suppress_permission(request, delivery)
                    and bool(delivery.address)
                    and not suppressed,
                    "can_unsuppress": self.has_unsuppress_permission(request, delivery) and owned,
                }
            )
        return super().change_view(request, object_id, form_url, context)
