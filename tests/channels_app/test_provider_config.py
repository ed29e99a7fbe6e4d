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
