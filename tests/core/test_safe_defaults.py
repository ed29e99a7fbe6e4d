"""Safe by default: no start without SECRET_KEY outside development, DEBUG off unless set, `check --deploy`
clean under the production settings of docs/operations.md, proxy and cookie settings from the environment,
/metrics and /readyz's detail behind METRICS_TOKEN."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from django.test import Client

from tests.conftest import ROOT

SNIPPET = (
    "import django, json, sys; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({k: getattr(s, k) for k in sys.argv[1:]}))"
)


def _clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without the variables under test."""
    drop = {"SECRET_KEY", "DEBUG", "DEVELOPMENT", "DJANGO_SETTINGS_MODULE"} | set(extra)
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SECURE_")}
    return {**env, "DJANGO_SETTINGS_MODULE": "config.settings", **extra}


def _settings_of(env: dict[str, str], *keys: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-c", SNIPPET, *keys], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def production_env() -> dict[str, str]:
    """The variables of the production block in docs/operations.md, with sample values for the <...> ones."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("<!-- production-env -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    env = {}
    for line in block.strip().splitlines():
        name, _, value = line.partition("=")
        env[name.strip()] = "x7Gq-" * 12 if value.startswith("<") else value.strip()
    return env


def test_no_start_without_secret_key_outside_development() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=_clean_env(), capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


def test_debug_is_off_unless_set_and_development_is_explicit() -> None:
    assert _settings_of(_clean_env(DEVELOPMENT="true"), "DEBUG", "DEVELOPMENT") == {"DEBUG": False, "DEVELOPMENT": True}
    assert _settings_of(_clean_env(SECRET_KEY="k" * 60), "DEBUG", "DEVELOPMENT", "SESSION_COOKIE_SECURE") == {
        "DEBUG": False,
        "DEVELOPMENT": False,
        "SESSION_COOKIE_SECURE": True,
    }
    assert _settings_of(_clean_env(DEVELOPMENT="true", DEBUG="true"), "DEBUG")["DEBUG"] is True


def test_proxy_csrf_and_hsts_come_from_the_environment() -> None:
    env = _clean_env(
        SECRET_KEY="k" * 60,
        SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https",
        CSRF_TRUSTED_ORIGINS="https://a.example.com,https://b.example.com",
        SECURE_HSTS_SECONDS="600",
    )
    got = _settings_of(env, "SECURE_PROXY_SSL_HEADER", "CSRF_TRUSTED_ORIGINS", "SECURE_HSTS_SECONDS")
    assert got == {
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "CSRF_TRUSTED_ORIGINS": ["https://a.example.com", "https://b.example.com"],
        "SECURE_HSTS_SECONDS": 600,
    }


def test_check_deploy_is_clean_under_the_documented_production_settings() -> None:
    env = _clean_env(**production_env())
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
    # Without the HTTPS settings the same check is not clean: the test can tell.
    bare = _clean_env(SECRET_KEY=production_env()["SECRET_KEY"])
    worse = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=bare, capture_output=True, text=True,
    )  # fmt: skip
    assert worse.returncode != 0 and re.search(r"security\.W00[48]", worse.stdout + worse.stderr)


@pytest.mark.django_db
def test_metrics_and_readyz_detail_need_the_token_when_set(settings: Any) -> None:
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    http = Client()
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    scraped = http.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert scraped.status_code == 200 and b"# TYPE" in scraped.content
    probe = http.get("/readyz")
    assert probe.status_code in (200, 503) and "checks" not in probe.json()
    detail = http.get("/readyz", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").json()
    assert set(detail["checks"]) == {"database", "broker", "redis"}
    assert http.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_without_a_token_they_stay_open(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 200
    assert "checks" in Client().get("/readyz").json()
