"""The project form of the admin: sender identities, default layout, accounts and rate limit checked before saving.

What the send workers read from a project must be usable by every provider, so a bad value is a form error here,
never a failed delivery later: an email address (with or without a display name) for From and Reply-To, a phone
number, an alphanumeric sender id or a Twilio Messaging Service SID for SMS, a layout key, and provider accounts
chosen among those configured in the environment (PROVIDER_ACCOUNTS; the credentials never reach the database).
"""

from __future__ import annotations

import re
from email.utils import parseaddr
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from core import provider_accounts
from core.keys import KEY_PATTERN, KEY_RULE
from core.ratelimit import clean_rate_text
from projects.models import Project

# The channels a project may choose accounts for (core.provider_accounts.ACCOUNT_PROVIDERS), and each one's field.
ACCOUNT_FIELDS = {
    "email": "email_account",
    "sms": "sms_account",
    "slack": "slack_account",
    "telegram": "telegram_account",
    "whatsapp": "whatsapp_account",
}
E164 = re.compile(r"^\+[1-9]\d{6,14}$")
# Carriers accept 1-11 letters, digits and spaces, at least one letter.
ALPHANUMERIC_SENDER = re.compile(r"^(?=.*[A-Za-z])[A-Za-z0-9 ]{1,11}$")
MESSAGING_SERVICE_SID = re.compile(r"^MG[0-9a-fA-F]{32}$")


def clean_sender_address(value: str) -> str:
    """Return a From / Reply-To value ("addr@example.com" or "Name <addr@example.com>"), or raise ValidationError."""
    value = value.strip()
    if not value:
        return ""
    if any(c in value for c in "\r\n\0"):
        raise ValidationError("Must be one line.")
    _, address = parseaddr(value)
    if not address or "<" in address or ">" in address:
        raise ValidationError("Enter an email address, optionally with a name: Shop <no-reply@shop.example>.")
    try:
        validate_email(address)
    except ValidationError:
        raise ValidationError(f"'{address}' is not a valid email address.") from None
    if "<" not in value and value != address:
        raise ValidationError("Put the address in angle brackets after the name: Shop <no-reply@shop.example>.")
    return value


def clean_sms_sender(value: str) -> str:
    """Return an SMS sender (+E.164, an alphanumeric id of up to 11, or a Messaging Service SID) or raise."""
    value = value.strip()
    if not value or E164.match(value) or ALPHANUMERIC_SENDER.match(value) or MESSAGING_SERVICE_SID.match(value):
        return value
    raise ValidationError(
        "Enter a phone number in E.164 (+14155550100), an alphanumeric sender id of 1-11 letters, digits and"
        " spaces, or a Twilio Messaging Service SID (MG…)."
    )


def account_field(label: str, channel: str) -> forms.ChoiceField:
    """Return the choice of a channel's provider account (the choices are the configured names, set per form)."""
    return forms.ChoiceField(
        required=False,
        label=f"{label} provider account",
        help_text=f"A name of PROVIDER_ACCOUNTS; empty: the installation's {channel} providers.",
    )


class ProjectForm(forms.ModelForm):
    """A project's settings; its provider accounts are chosen per channel among the configured names."""

    email_account = account_field("Email", "email")
    sms_account = account_field("SMS", "SMS")
    slack_account = account_field("Slack", "Slack")
    telegram_account = account_field("Telegram", "Telegram")
    whatsapp_account = account_field("WhatsApp", "WhatsApp")

    class Meta:
        model = Project
        # Every editable field but `provider_accounts`, which the per-channel choices above write.
        fields = tuple(
            f.name
            for f in Project._meta.concrete_fields
            if f.editable and not f.primary_key and f.name != "provider_accounts"
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        chosen = self.instance.provider_accounts or {}
        for channel, name in ACCOUNT_FIELDS.items():
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            names = provider_accounts.names_for(channel)
            current = chosen.get(channel)
            current = current if isinstance(current, str) else ""
            choices = [("", "(the installation's)"), *((n, n) for n in names)]
            if current and current not in names:
                # Shown, so that saving the project unchanged says why it cannot be sent through any more.
                choices.append((current, f"{current} (not configured)"))
            field.choices = choices
            field.initial = current

    def _clean_account(self, channel: str) -> str:
        name = str(self.cleaned_data.get(ACCOUNT_FIELDS[channel]) or "")
        names = provider_accounts.names_for(channel)
        if name and name not in names:
            raise ValidationError(
                f"'{name}' is not a {channel} account of PROVIDER_ACCOUNTS"
                f" (configured: {', '.join(names) if names else 'none'})."
            )
        return name

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        for channel, name in ACCOUNT_FIELDS.items():
            if name in cleaned:  # absent: the field itself refused the value (not one of its choices)
                try:
                    cleaned[name] = self._clean_account(channel)
                except ValidationError as exc:
                    self.add_error(name, exc)
        return cleaned

    def clean_email_from(self) -> str:
        return clean_sender_address(self.cleaned_data.get("email_from") or "")

    def clean_email_reply_to(self) -> str:
        return clean_sender_address(self.cleaned_data.get("email_reply_to") or "")

    def clean_sms_sender(self) -> str:
        return clean_sms_sender(self.cleaned_data.get("sms_sender") or "")

    def clean_rate_limit(self) -> str:
        # A rate the API reads for all of the project's keys ("1000/s").
        return clean_rate_text(self.cleaned_data.get("rate_limit"))

    def clean_default_layout(self) -> str:
        value = (self.cleaned_data.get("default_layout") or "").strip()
        if value and not KEY_PATTERN.match(value):
            raise ValidationError(f"A layout key {KEY_RULE}.")
        return value

    def save(self, commit: bool = True) -> Any:
        """Write the chosen accounts into `provider_accounts` (a channel left empty uses the installation's)."""
        accounts = {k: v for k, v in (self.instance.provider_accounts or {}).items() if k not in ACCOUNT_FIELDS}
        for channel, name in ACCOUNT_FIELDS.items():
            if self.cleaned_data.get(name):
                accounts[channel] = self.cleaned_data[name]
        self.instance.provider_accounts = accounts
        return super().save(commit=commit)
