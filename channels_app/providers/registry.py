"""Which providers serve which channel, in failover order, built once per process from settings.

A name is one of the installation's providers (PROVIDER_CLASSES) or a named account of PROVIDER_ACCOUNTS
(core.provider_accounts): an account is an adapter of its own, with its own connections, breaker and rate
limit, all keyed by its name.
"""

from __future__ import annotations

import functools
from importlib import import_module

from django.conf import settings

from channels_app.providers.base import AccountOptions, ConfigurationError, Provider
from core import provider_accounts

PROVIDER_CLASSES: dict[str, str] = {
    "sandbox": "channels_app.providers.sandbox.SandboxProvider",
    "inapp": "channels_app.providers.inapp.InAppProvider",
    "fcm": "channels_app.providers.fcm.FcmProvider",
    "ses": "channels_app.providers.ses.SesProvider",
    "smtp": "channels_app.providers.smtp.SmtpProvider",
    "twilio": "channels_app.providers.twilio_sms.TwilioProvider",
    "sns": "channels_app.providers.sns_sms.SnsProvider",
    "webhook": "channels_app.providers.webhook.WebhookProvider",
}


def _provider_class(kind: str) -> type[Provider]:
    module_name, _, class_name = PROVIDER_CLASSES[kind].rpartition(".")
    cls: type[Provider] = getattr(import_module(module_name), class_name)
    return cls


@functools.cache
def get_provider(name: str) -> Provider:
    """Return the process-wide adapter named `name` (a provider or a named account), built from settings."""
    if name in PROVIDER_CLASSES:
        provider = _provider_class(name).from_settings()
    else:
        try:
            account = provider_accounts.configured().get(name)
        except provider_accounts.AccountError as exc:
            raise ConfigurationError(str(exc)) from None
        if account is None:
            raise ConfigurationError(
                f"Unknown provider '{name}'. Known: {', '.join(sorted(PROVIDER_CLASSES))}, and the accounts"
                " of PROVIDER_ACCOUNTS."
            )
        cls = _provider_class(account.provider)
        try:
            provider = cls.from_account(AccountOptions(account.options, cls.account_keys))
        except ConfigurationError as exc:
            raise ConfigurationError(f"PROVIDER_ACCOUNTS: account '{name}': {exc}") from None
    # One total deadline per call for every adapter (the webhook adapter also aborts its socket at it).
    provider.call_deadline = settings.PROVIDER_CALL_DEADLINE_SECONDS
    return provider


def chain(channel: str, accounts: dict[str, list[str]] | None = None) -> list[str]:
    """Return the provider names for `channel`, first choice first: a project's accounts, else the installation's.

    `accounts` is a project's choice by channel (names of PROVIDER_ACCOUNTS); a channel it names goes through
    those accounts only, never on to the installation's providers (another sender, another bill).
    """
    if accounts and accounts.get(channel):
        return list(accounts[channel])
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
    try:
        accounts = provider_accounts.configured()
    except provider_accounts.AccountError as exc:
        return [*problems, str(exc)]
    for name in accounts:
        try:
            get_provider(name)
        except ConfigurationError as exc:
            problems.append(str(exc))
        except ImportError as exc:
            problems.append(f"PROVIDER_ACCOUNTS: account '{name}' cannot be loaded: {exc}")
    return problems
