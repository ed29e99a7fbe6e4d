"""App configuration."""

from __future__ import annotations

from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    """Configure the Campaigns app."""

    name = "notifier.campaigns"
    label = "campaigns"
    verbose_name = "Campaigns"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: the fan-out sits below this app and cannot import it; it calls what registers here.
        from notifier.campaigns import status
        from notifier.dispatch.fanout import register_campaign_gate

        register_campaign_gate(status)
