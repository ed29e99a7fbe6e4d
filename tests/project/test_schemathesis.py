"""Schemathesis over the whole OpenAPI schema against the running API (gunicorn on the test database).

Every operation, with generated valid and invalid input (a fixed seed, a budget that fits CI), must answer no
5xx, only status codes the schema documents, and bodies and content types that match it. The key has every
scope and no rate limit worth hitting, so the operations are exercised past authentication.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.scopes import SCOPES
from notifier.clients.services import api_client_create
from notifier.inbox.services import inbox_token_create
from preferences.services import recipient_upsert, topic_upsert
from templates_app.services import template_put
from tests.conftest import ROOT, free_port, wait_for

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"
SEED = os.environ.get("SCHEMATHESIS_SEED", "20261201")
MAX_EXAMPLES = os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25")


def _up(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200
    except OSError:
        return False


def _schemathesis(port: int, credential: str, paths: str, name: str) -> subprocess.CompletedProcess[str]:
    """Run schemathesis on the operations whose path matches `paths`, with `credential` as the Bearer token."""
    command = [
        str(Path(sys.executable).parent / "st"), "--config-file", str(ROOT / "tests" / "schemathesis.toml"),
        "run", f"http://127.0.0.1:{port}/api/schema/?format=json",
        "--include-path-regex", paths,
        "--checks", CHECKS, "--seed", SEED, "--max-examples", MAX_EXAMPLES, "--workers", "2",
        "--header", f"Authorization: Bearer {credential}", "--request-timeout", "30", "--no-shrink",
        "--suppress-health-check", "all", "--output-truncate", "false",
        "--report", "junit", "--report-dir", str(ROOT / "var" / f"schemathesis-{name}-{os.getpid()}"),
    ]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.django_db(transaction=True)
def test_the_api_keeps_to_its_schema_under_generated_input(start_process: Callable[..., Any]) -> None:
    client, key = api_client_create(name="schemathesis", scopes=list(SCOPES))
    client.rate_limit = "100000/s"
    client.save(update_fields=["rate_limit"])
    # Objects the generated calls can find: a published template, a topic, a recipient with an inbox token.
    template_put(key="welcome", category="transactional", default_locale="en", content={"en": {"sms": {"text": "Hi"}}})
    topic_upsert(key="all-users", name="All users")
    recipient, _ = recipient_upsert(user_id="u-1", email="u1@example.com")
    inbox_token, _ = inbox_token_create(recipient=recipient, ttl_seconds=3600)
    port = free_port()
    env = {"LOG_LEVEL": "WARNING", "LOG_REQUESTS": "false", "WEB_WORKERS": "1", "WEB_THREADS": "4"}
    start_process("api", ["gunicorn", "-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{port}", "config.wsgi"], env)
    wait_for(functools.partial(_up, port), timeout=90)
    # The sends it makes are published to this namespace's queues; tests that start workers purge them first.
    runs = [
        _schemathesis(port, key, "^/(api|callbacks)/", "api"),
        # The browser inbox authenticates with an inbox token, not an API key.
        _schemathesis(port, inbox_token, "^/inbox/v1/", "inbox"),
    ]
    for done in runs:
        print(done.stdout[-600:])  # the summary: cases generated, time taken (pytest -s shows it)
        assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-4000:]
        assert " passed" in done.stdout, done.stdout[-4000:]
