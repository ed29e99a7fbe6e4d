"""Provider accounts named in the environment (PROVIDER_ACCOUNTS), which projects may send through.

`PROVIDER_ACCOUNTS` is a JSON object, name → account: `{"provider": <a kind of ACCOUNT_PROVIDERS>, ...}` and
that provider's own settings (docs/configuration.md lists them). A project names accounts by channel
(a project's `provider_accounts`, `{"email": "ses-shop"}`); its credentials are only ever read here, from
the environment, never from the database. The channels_app registry builds one adapter per account (its breaker
and rate limit are the account's name), the projects admin offers the names per channel.

Read without Django's app registry (core imports no app): the channel of each provider kind is written here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

# The provider kinds an account may be of, and the channel each serves. Teams and Discord have none: their
# credential is the incoming webhook's URL, which is the address itself.
ACCOUNT_PROVIDERS: dict[str, str] = {
    "ses": "email",
    "smtp": "email",
    "twilio": "sms",
    "sns": "sms",
    "slack": "slack",
    "telegram": "telegram",
    "twilio_whatsapp": "whatsapp",
}
# The installation's own providers' names, which an account may not take (its breaker and limit are by name).
RESERVED_NAMES = frozenset(
    {
        "sandbox",
        "inapp",
        "fcm",
        "ses",
        "smtp",
        "twilio",
        "sns",
        "webhook",
        "slack",
        "teams",
        "discord",
        "telegram",
        "twilio_whatsapp",
        "default",
    }
)
# Short enough for a delivery's `provider` column (32), readable in metrics and events.
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


class AccountError(ValueError):
    """PROVIDER_ACCOUNTS is malformed; the message names the account and what is wrong, never a secret."""


@dataclass(frozen=True)
class Account:
    """One configured provider account: its name, provider kind, channel and settings (credentials included)."""

    name: str
    provider: str
    channel: str
    options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def parse(raw: Any) -> dict[str, Account]:
    """Return the accounts of a PROVIDER_ACCOUNTS value; raise AccountError for the first malformed one."""
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise AccountError("PROVIDER_ACCOUNTS must be a JSON object: account name -> settings")
    accounts = {}
    for name, conf in raw.items():
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise AccountError(
                f"PROVIDER_ACCOUNTS: account name {name!r} must be 1-32 of a-z, 0-9, '-' and '_' (lower case)"
            )
        if name in RESERVED_NAMES:
            raise AccountError(f"PROVIDER_ACCOUNTS: account name '{name}' is a provider's name; choose another")
        if not isinstance(conf, dict):
            raise AccountError(f"PROVIDER_ACCOUNTS: account '{name}' must be a JSON object")
        provider = conf.get("provider")
        if provider not in ACCOUNT_PROVIDERS:
            raise AccountError(
                f"PROVIDER_ACCOUNTS: account '{name}': provider must be one of {', '.join(sorted(ACCOUNT_PROVIDERS))}"
            )
        options = {key: value for key, value in conf.items() if key != "provider"}
        accounts[name] = Account(name=name, provider=provider, channel=ACCOUNT_PROVIDERS[provider], options=options)
    return accounts


def configured() -> dict[str, Account]:
    """Return the accounts of settings.PROVIDER_ACCOUNTS (malformed settings raise AccountError)."""
    return parse(settings.PROVIDER_ACCOUNTS)


def names_for(channel: str) -> list[str]:
    """Return the names of the configured accounts that serve `channel`, sorted ([] when the setting is malformed)."""
    try:
        accounts = configured()
    except AccountError:
        return []
    return sorted(name for name, account in accounts.items() if account.channel == channel)


def account_problem(name: str, channel: str) -> str | None:
    """Return why account `name` cannot carry `channel` (not configured, or another channel's), or None.

    A project's choice is checked where it was made (the admin), but a value written around it, or an account
    removed or changed to another kind since, must cost only the deliveries that name it: the send path and the
    cached load of a project's settings ask this. The text names the account, never a secret.
    """
    try:
        account = configured().get(name)
    except AccountError as exc:
        return str(exc)
    if account is None:
        return f"provider account '{name}' is not in PROVIDER_ACCOUNTS"
    if account.channel != channel:
        return f"provider account '{name}' is a {account.channel} account ({account.provider}), not a {channel} one"
    return None


def names_of_provider(*providers: str) -> list[str]:
    """Return the `providers` and the names of the accounts of those kinds (what a provider callback may have sent)."""
    try:
        accounts = configured()
    except AccountError:
        accounts = {}
    return [*providers, *sorted(name for name, account in accounts.items() if account.provider in providers)]
