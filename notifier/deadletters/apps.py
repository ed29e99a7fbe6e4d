"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class DeadlettersConfig(AppConfig):
    """Configure the Dead letters app."""

    name = "notifier.deadletters"
    label = "deadletters"
    verbose_name = "Dead letters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: the delivery log sits below this app; it keeps and forgets dead letters through this.
        from notifier.deadletters.services import KEEPS_DELIVERY, dead_letters_forget_gone
        from notifier.deliveries.partitions import Dependent, register_dependent

        register_dependent(Dependent(keeps_delivery=KEEPS_DELIVERY, forget_deliveries=dead_letters_forget_gone))
