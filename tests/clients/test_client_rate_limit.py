"""The per-client API rate limit: 429 rate_limited with Retry-After, per client or by default, shared by every
API process through Redis (two real gunicorn processes), per process while Redis is down."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command

from core.ratelimit import RateLimiter
from core.scopes import SCOPES
from notifier.clients import rate_limit
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from tests.factories import make_staff_user

URL = "/api/v1/notifications"


def limited(api_client_factory: Any, rate: str) -> Any:
    client, http = api_client_factory()
    client.rate_limit = rate
    client.save(update_fields=["rate_limit"])
    return http


@pytest.mark.django_db
def test_over_its_rate_a_client_gets_429_with_retry_after(api_client_factory: Any) -> None:
    http = limited(api_client_factory, "3/h")
    assert [http.get(URL).status_code for _ in range(3)] == [200, 200, 200]
    refused = http.get(URL)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused["Retry-After"]) >= 1000  # one token per 1,200 s
    # Another client has its own bucket.
    assert api_client_factory()[1].get(URL).status_code == 200


@pytest.mark.django_db
def test_the_default_applies_to_clients_without_their_own(api_client_factory: Any, settings: Any) -> None:
    settings.API_CLIENT_RATE_LIMIT = "2/h"
    _, http = api_client_factory()
    assert [http.get(URL).status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.django_db
def test_redis_down_falls_back_to_a_per_process_share(
    api_client_factory: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.RESILIENCE_ASSUMED_WORKERS = 4
    monkeypatch.setattr(rate_limit, "_limiter", RateLimiter(redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.2)))
    http = limited(api_client_factory, "8/h")  # this process's share: 2
    assert [http.get(URL).status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.pure
def test_parse_rate() -> None:
    assert rate_limit.parse_rate("200/s") == (200.0, 200.0)
    assert rate_limit.parse_rate("60/m") == (1.0, 60.0)
    assert rate_limit.parse_rate("3600 / hour") == (1.0, 3600.0)
    for bad in ("", "fast", "0/s", "10/d", "-1/s"):
        with pytest.raises(ValueError, match="rate"):
            rate_limit.parse_rate(bad)


@pytest.mark.django_db
def test_create_api_client_rate_limit(capsys: pytest.CaptureFixture[str]) -> None:
    call_command("create_api_client", "limited", "--rate-limit", "50/s")
    assert ApiClient.objects.get(name="limited").rate_limit == "50/s"
    with pytest.raises(CommandError, match="rate"):
        call_command("create_api_client", "bad", "--rate-limit", "lots")
    assert not ApiClient.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_the_admin_validates_the_rate(client: Any) -> None:

    client.force_login(make_staff_user("ops", superuser=True))
    form = {"name": "svc", "scopes": ["send"], "is_active": "on"}
    bad = client.post("/admin/clients/apiclient/add/", {**form, "rate_limit": "lots"})
    assert bad.status_code == 200 and "not a rate" in bad.content.decode()
    client.post("/admin/clients/apiclient/add/", {**form, "rate_limit": "20/m"})
    assert ApiClient.objects.get(name="svc").rate_limit == "20/m"


@pytest.mark.django_db(transaction=True)
def test_the_limit_is_shared_by_two_api_processes(two_api_processes: list[str]) -> None:
    client, key = api_client_create(name="shared", scopes=list(SCOPES))
    client.rate_limit = "4/h"
    client.save(update_fields=["rate_limit"])
    answers: list[tuple[int, int, str | None]] = []
    for i in range(12):
        url = two_api_processes[i % 2]
        request = urllib.request.Request(f"{url}{URL}", headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answers.append((i % 2, response.status, None))
        except urllib.error.HTTPError as exc:
            assert json.loads(exc.read())["error"]["code"] == "rate_limited"
            answers.append((i % 2, exc.code, exc.headers.get("Retry-After")))
    # Four tokens in all, not four per process: per-process buckets would have let eight through.
    assert sum(1 for _, code, _ in answers if code == 200) == 4
    assert {proc for proc, code, _ in answers if code == 429} == {0, 1}
    assert all(code == 429 and int(retry or 0) >= 1 for _, code, retry in answers[4:])
