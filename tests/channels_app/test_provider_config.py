"""A provider switched on with settings missing stops the process at start with a clear message."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError


@pytest.mark.pure
def test_manage_check_names_the_missing_variable(settings: Any) -> None:
    from channels_app.providers.registry import get_provider

    settings.CHANNEL_PROVIDERS = {**settings.CHANNEL_PROVIDERS, "sms": ["twilio"]}
    settings.TWILIO_ACCOUNT_SID = ""
    get_provider.cache_clear()
    try:
        with pytest.raises(SystemCheckError, match="TWILIO_ACCOUNT_SID"):
            call_command("check")
    finally:
        get_provider.cache_clear()


def test_worker_refuses_to_start_with_a_misconfigured_provider(start_worker: Any) -> None:
    worker = start_worker(env={"EMAIL_PROVIDERS": "ses", "EMAIL_FROM": ""}, wait=False)
    assert worker.proc.wait(timeout=60) != 0
    assert "EMAIL_FROM is not set" in worker.log()


def test_named_accounts_are_checked_at_start_naming_the_account_and_setting_never_a_secret(settings: Any) -> None:
    from channels_app.providers.registry import get_provider, validate_all
    from channels_app.providers.ses import SesProvider

    get_provider.cache_clear()
    try:
        settings.PROVIDER_ACCOUNTS = {
            "shop-sms": {"provider": "twilio", "account_sid": "AC1", "auth_tokn": "s3cret-value"},
            "shop-mail": {"provider": "smtp", "port": 25},
            "fine-ses": {"provider": "ses", "region": "eu-west-1", "from_email": "Shop <a@shop.example>"},
        }
        problems = validate_all()
        assert any("account 'shop-sms'" in p and "unknown setting(s) auth_tokn" in p for p in problems), problems
        assert any("account 'shop-mail'" in p and "host is not set" in p for p in problems), problems
        assert not any("fine-ses" in p for p in problems), problems
        assert not any("s3cret-value" in p for p in problems)
        # A good account is an adapter of its own, with its own settings.
        ses = get_provider("fine-ses")
        assert isinstance(ses, SesProvider)
        assert (ses.from_email, ses.client.meta.region_name) == ("Shop <a@shop.example>", "eu-west-1")

        for bad, reason in [
            ({"ses": {"provider": "ses"}}, "is a provider's name"),
            ({"Shop Mail": {"provider": "ses"}}, "must be 1-32 of a-z"),
            ({"shop-push": {"provider": "fcm"}}, "provider must be one of ses, slack, smtp, sns, telegram, twilio,"),
            ({"slack": {"provider": "slack", "bot_token": "xoxb-1"}}, "is a provider's name"),
            ({"shop-teams": {"provider": "teams"}}, "provider must be one of"),
            ([1, 2], "must be a JSON object"),
        ]:
            settings.PROVIDER_ACCOUNTS = bad
            get_provider.cache_clear()
            assert any(reason in p for p in validate_all()), (bad, validate_all())
    finally:
        get_provider.cache_clear()


def test_chat_accounts_are_checked_at_start_and_are_bots_of_their_own(settings: Any) -> None:
    from channels_app.providers.registry import get_provider, validate_all
    from channels_app.providers.slack import SlackProvider
    from channels_app.providers.telegram import TelegramProvider
    from channels_app.providers.twilio_sms import TwilioWhatsAppProvider

    settings.SLACK_BASE_URL = "http://127.0.0.1:9/api/"
    get_provider.cache_clear()
    try:
        settings.PROVIDER_ACCOUNTS = {
            "no-token": {"provider": "slack"},
            "typo": {"provider": "telegram", "bot_tokn": "42:s3cret-value"},
            "no-sender": {"provider": "twilio_whatsapp", "account_sid": "AC1", "auth_token": "s3cret-value"},
            "shop-slack": {"provider": "slack", "bot_token": "xoxb-shop", "timeout_seconds": 3},
            "shop-telegram": {"provider": "telegram", "bot_token": "42:shop", "base_url": "http://127.0.0.1:9"},
            "shop-whatsapp": {
                "provider": "twilio_whatsapp",
                "account_sid": "AC1",
                "auth_token": "s3cret-value",
                "from_number": "+15005550088",
            },
        }
        problems = validate_all()
        assert any("account 'no-token'" in p and "bot_token is not set" in p for p in problems), problems
        assert any("account 'typo'" in p and "unknown setting(s) bot_tokn" in p for p in problems), problems
        assert any(
            "account 'no-sender'" in p and "from_number or messaging_service_sid is not set" in p for p in problems
        ), problems
        assert not any("shop-" in p for p in problems), problems
        assert not any("s3cret-value" in p for p in problems)

        slack = get_provider("shop-slack")
        assert isinstance(slack, SlackProvider) and slack.channels == ("slack",)
        # Its own token; the endpoint is the installation's unless the account names one.
        assert (slack.client.token, slack.client.base_url, slack.client.timeout) == (
            "xoxb-shop",
            "http://127.0.0.1:9/api/",
            3,
        )
        telegram = get_provider("shop-telegram")
        assert isinstance(telegram, TelegramProvider)
        assert telegram._url == "http://127.0.0.1:9/bot42:shop/sendMessage"
        whatsapp = get_provider("shop-whatsapp")
        assert isinstance(whatsapp, TwilioWhatsAppProvider) and whatsapp.channels == ("whatsapp",)
        assert (whatsapp.client.username, whatsapp.from_number) == ("AC1", "+15005550088")
        # Each account is an adapter of its own: not the installation's, not another account's.
        assert len({id(get_provider(n)) for n in ("shop-slack", "shop-telegram", "shop-whatsapp")}) == 3
    finally:
        get_provider.cache_clear()


def test_a_project_naming_an_account_sends_only_through_it() -> None:
    from channels_app.providers.registry import chain

    assert chain("email", {"email": ["shop-ses"]}) == ["shop-ses"]
    assert chain("sms", {"email": ["shop-ses"]}) == chain("sms") == chain("sms", {})
    assert chain("slack", {"slack": ["shop-slack"], "email": ["shop-ses"]}) == ["shop-slack"]
