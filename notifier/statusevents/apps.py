"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class StatuseventsConfig(AppConfig):
    """Configure the Status events app."""

    name = "notifier.statusevents"
    label = "statusevents"
    verbose_name = "Status events"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: models need the app registry ready. The status writer sits below this app: it calls the
        # recorder registered here with every batch of status changes.
        from core.config_cache import invalidate_on_change
        from notifier.deliveries.status import on_events_recorded
        from notifier.statusevents.models import EventEndpoint
        from notifier.statusevents.record import reach_record
        from notifier.statusevents.services import status_events_forget_recipient
        from preferences.signals import recipient_erased

        invalidate_on_change(EventEndpoint)
        on_events_recorded(lambda events, at: reach_record(events, at=at))
        recipient_erased.connect(status_events_forget_recipient, dispatch_uid="notifier.statusevents.erasure")
