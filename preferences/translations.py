"""The few strings recipients read (preference center, email footer), in English and German.

A table in code, not gettext catalogs: two languages and some forty strings do not justify compiling .mo
files in every build and image (see docs/decisions/0019-preference-center-strings-and-tokens.md).
"""

from __future__ import annotations

import functools

DEFAULT_LANGUAGE = "en"

STRINGS: dict[str, dict[str, str]] = {
    "en": {
        "title": "Notification preferences",
        "intro": "Choose which messages you receive, how and when.",
        "saved": "Your preferences are saved.",
        "errors": "Please correct the marked fields.",
        "general_legend": "All optional messages",
        "opted_out": "Pause all optional messages",
        "opted_out_help": "Account and security messages are still sent.",
        "channels_legend": "Channels",
        "channels_help": "A channel switched off gets no optional messages.",
        "channel_email": "Email",
        "channel_sms": "Text message (SMS)",
        "channel_push": "Push notifications",
        "channel_inapp": "Inbox in the app",
        "channel_webhook": "Webhook",
        "channel_slack": "Slack",
        "channel_teams": "Microsoft Teams",
        "channel_discord": "Discord",
        "channel_telegram": "Telegram",
        "channel_whatsapp": "WhatsApp",
        "categories_legend": "Categories",
        "category_security": "Security",
        "category_transactional": "Account and orders",
        "category_social": "Social",
        "category_marketing": "News and offers",
        "receive": "Receive",
        "locked": "Always sent: needed for your account and its security.",
        "frequency": "How often",
        "send_by": "Send by",
        "frequency_immediate": "Right away",
        "frequency_hourly_digest": "Hourly summary",
        "frequency_daily_digest": "Daily summary",
        "quiet_legend": "Quiet hours",
        "quiet_help": "Optional messages wait until quiet hours end. Leave both empty for none.",
        "quiet_start": "From",
        "quiet_end": "Until",
        "timezone": "Time zone",
        "timezone_none": "Not set (UTC)",
        "save": "Save preferences",
        "err_time": "Enter a time as HH:MM, for example 22:00.",
        "err_both": "Enter both times, or neither.",
        "err_same": "Must differ from the start.",
        "err_timezone": "Choose a time zone from the list.",
        "err_other": "This value cannot be saved.",
        "invalid_title": "This link is not valid",
        "invalid_body": "The link is incomplete or was changed. Please use the link from your latest message.",
        "expired_title": "This link has expired",
        "expired_body": "Links to your preferences expire for your security. Please use the link from a newer message.",
        "footer_manage": "Manage your notification preferences",
        "footer_unsubscribe": "Unsubscribe",
    },
    "de": {
        "title": "Benachrichtigungseinstellungen",
        "intro": "Wählen Sie, welche Nachrichten Sie erhalten, wie und wann.",
        "saved": "Ihre Einstellungen sind gespeichert.",
        "errors": "Bitte korrigieren Sie die markierten Felder.",
        "general_legend": "Alle optionalen Nachrichten",
        "opted_out": "Alle optionalen Nachrichten pausieren",
        "opted_out_help": "Konto- und Sicherheitsnachrichten werden weiterhin gesendet.",
        "channels_legend": "Kanäle",
        "channels_help": "Über einen abgeschalteten Kanal kommen keine optionalen Nachrichten.",
        "channel_email": "E-Mail",
        "channel_sms": "SMS",
        "channel_push": "Push-Benachrichtigungen",
        "channel_inapp": "Posteingang in der App",
        "channel_webhook": "Webhook",
        "channel_slack": "Slack",
        "channel_teams": "Microsoft Teams",
        "channel_discord": "Discord",
        "channel_telegram": "Telegram",
        "channel_whatsapp": "WhatsApp",
        "categories_legend": "Kategorien",
        "category_security": "Sicherheit",
        "category_transactional": "Konto und Bestellungen",
        "category_social": "Soziales",
        "category_marketing": "Neuigkeiten und Angebote",
        "receive": "Erhalten",
        "locked": "Wird immer gesendet: nötig für Ihr Konto und seine Sicherheit.",
        "frequency": "Wie oft",
        "send_by": "Senden per",
        "frequency_immediate": "Sofort",
        "frequency_hourly_digest": "Stündliche Zusammenfassung",
        "frequency_daily_digest": "Tägliche Zusammenfassung",
        "quiet_legend": "Ruhezeiten",
        "quiet_help": "Optionale Nachrichten warten bis zum Ende der Ruhezeit. Beide Felder leer lassen für keine.",
        "quiet_start": "Von",
        "quiet_end": "Bis",
        "timezone": "Zeitzone",
        "timezone_none": "Nicht gesetzt (UTC)",
        "save": "Einstellungen speichern",
        "err_time": "Geben Sie eine Uhrzeit als HH:MM ein, zum Beispiel 22:00.",
        "err_both": "Geben Sie beide Uhrzeiten an oder keine.",
        "err_same": "Muss sich vom Beginn unterscheiden.",
        "err_timezone": "Wählen Sie eine Zeitzone aus der Liste.",
        "err_other": "Dieser Wert kann nicht gespeichert werden.",
        "invalid_title": "Dieser Link ist ungültig",
        "invalid_body": "Der Link ist unvollständig oder wurde verändert. Bitte nutzen Sie den Link aus Ihrer "
        "neuesten Nachricht.",
        "expired_title": "Dieser Link ist abgelaufen",
        "expired_body": "Links zu Ihren Einstellungen laufen zu Ihrer Sicherheit ab. Bitte nutzen Sie den Link aus "
        "einer neueren Nachricht.",
        "footer_manage": "Benachrichtigungseinstellungen verwalten",
        "footer_unsubscribe": "Abmelden",
    },
}


def language_for(locale: str | None) -> str:
    """Return the supported language for a locale such as "de-DE" or "de_AT", English when unsupported."""
    language = (locale or "").replace("_", "-").split("-", 1)[0].lower()
    return language if language in STRINGS else DEFAULT_LANGUAGE


@functools.cache
def strings(language: str) -> dict[str, str]:
    """Return the strings of a language, falling back to English for any key it lacks (do not modify it)."""
    return {**STRINGS[DEFAULT_LANGUAGE], **STRINGS.get(language, {})}


def label(language: str, key: str) -> str:
    """Return one string; an unknown key (a category configured without a label) shows as its own name."""
    _, _, name = key.partition("_")
    return strings(language).get(key) or name.replace("_", " ").capitalize() or key
