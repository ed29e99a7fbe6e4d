"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class DispatchConfig(AppConfig):
    """Configure the Dispatch app."""

    name = "notifier.dispatch"
    label = "dispatch"
    verbose_name = "Dispatch"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from notifier.deliveries.partitions import Dependent, register_dependent
        from notifier.dispatch import checks  # noqa: F401 - registers the start-up checks
        from notifier.dispatch.fanout import fanout_lanes_forget_dropped

        # The delivery log sits below this app; a dropped day's fan-out lanes go through this.
        register_dependent(Dependent(forget_notifications=fanout_lanes_forget_dropped))
