"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class InboxConfig(AppConfig):
    """Configure the Inbox app."""

    name = "notifier.inbox"
    label = "inbox"
    verbose_name = "Inbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: the fan-out sits below this app and cannot import it; it calls what registers here.
        from notifier.dispatch.fanout import register_stored_channel
        from notifier.inbox import (
            checks,  # noqa: F401 - registers the start-up checks
            fanout,
        )

        register_stored_channel(fanout)
