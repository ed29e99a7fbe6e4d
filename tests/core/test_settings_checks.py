"""Start-up checks of the core settings."""

from __future__ import annotations

from typing import Any

import pytest

from core.checks import secret_key_set

pytestmark = pytest.mark.pure


def test_production_without_a_secret_key_is_refused(settings: Any) -> None:
    settings.DEVELOPMENT = False
    settings._SECRET_KEY_FROM_ENV = False
    assert [m.id for m in secret_key_set()] == ["notifier.E001"]
    settings._SECRET_KEY_FROM_ENV = True
    assert secret_key_set() == []
