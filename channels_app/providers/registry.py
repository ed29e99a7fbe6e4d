"""Which providers serve which channel, in failover order, built once per process from settings."""

from __future__ import annotations

import functools
from importlib import import_module

from django.conf import settings

from channels_app.providers.base import ConfigurationError, Provider

PROVIDER_CLASSES: dict[str, str] = {
    "sandbox": "channels_app.providers.sandbox.SandboxProvider",
    "inapp": "channels_app.providers.inapp.InAppProvider",
    "fcm": "channels_app.providers.fcm.FcmProvider",
    "ses": "channels_app.providers.ses.SesProvider",
    "smtp": "channels_app.providers.smtp.SmtpProvider",
    "twilio": "channels_app.providers.twilio_sms.TwilioProvider",
    "sns": "channels_app.providers.sns_sms.SnsProvider",
    "webhook": "channels_app.providers.webhook.WebhookProvider",
    "slack": "channels_app.providers.slack.SlackProvider",
    "teams": "channels_app.providers.chat_webhooks.TeamsProvider",
    "discord": "channels_app.providers.chat_webhooks.DiscordProvider",
    "telegram": "channels_app.providers.telegram.TelegramProvider",
    "twilio_whatsapp": "channels_app.providers.twilio_sms.TwilioWhatsAppProvider",
}


@functools.cache
def get_provider(name: str) -> Provider:
    """Return the process-wide adapter named `name`, built from settings (connections are reused)."""
    if name not in PROVIDER_CLASSES:
        raise ConfigurationError(f"Unknown provider '{name}'. Known: {', '.join(sorted(PROVIDER_CLASSES))}.")
    module_name, _, class_name = PROVIDER_CLASSES[name].rpartition(".")
    cls: type[Provider] = getattr(import_module(module_name), class_name)
    provider = cls.from_settings()
    # One total deadline per call for every adapter (the webhook adapter also aborts its socket at it).
    provider.call_deadline = settings.PROVIDER_CALL_DEADLINE_SECONDS
    return provider


def chain(channel: str) -> list[str]:
    """Return the provider names configured for `channel`, first choice first."""
    names = settings.CHANNEL_PROVIDERS.get(channel) or []
    if not names:
        raise ConfigurationError(f"No provider configured for channel '{channel}' ({channel.upper()}_PROVIDERS).")
    return list(names)


def validate_all() -> list[str]:
    """Build every configured provider; return one clear message per provider that is misconfigured."""
    problems = []
    for channel in settings.CHANNELS:
        try:
            names = chain(channel)
        except ConfigurationError as exc:
            problems.append(str(exc))
            continue
        for name in names:
            try:
                provider = get_provider(name)
            except ConfigurationError as exc:
                problems.append(f"{channel}: provider '{name}': {exc}")
                continue
            except ImportError as exc:
                problems.append(f"{channel}: provider '{name}' cannot be loaded: {exc}")
                continue
            if channel not in provider.channels:
                problems.append(f"{channel}: provider '{name}' does not serve this channel.")
    return problems
