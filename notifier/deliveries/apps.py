"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class DeliveriesConfig(AppConfig):
    """Configure the Deliveries app."""

    name = "notifier.deliveries"
    label = "deliveries"
    verbose_name = "Deliveries"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: these modules read models, which need the app registry ready.
        from notifier.deliveries import fallback  # noqa: F401 - registers its transition listener (status)
        from notifier.deliveries.erasure import deliveries_forget_recipient
        from preferences.signals import recipient_erased

        recipient_erased.connect(deliveries_forget_recipient, dispatch_uid="notifier.deliveries.erasure")
