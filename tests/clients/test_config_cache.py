"""The accept's per-process caches (notifier/lookup_cache.py): hit without a query, invalidated by any change.

Other processes are stood for by the Redis generation: what another process's save does is bump it, which is
done here directly after changing rows behind the signals' back.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from channels_app.services import deliver
from core import config_cache
from core.redis_guard import get_redis, rkey
from notifier.clients import lookup_cache
from notifier.clients.auth import hash_key
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_rotate_key
from notifier.deliveries.models import Delivery, Notification
from templates_app.selectors import template_version_cached
from templates_app.services import template_put
from tests.factories import make_recipient

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}}}


def body() -> dict[str, Any]:
    return {"recipient": {"user_id": "u-1"}, "template": "welcome", "payload": {"name": "Ada"}}


def _queries(fn: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        fn()
    return len(captured)


@pytest.mark.django_db(transaction=True)
def test_a_cached_client_is_read_without_a_query_until_another_process_changes_any_client(
    api_client_factory: Any,
) -> None:
    client, _ = api_client_factory()
    raw_key = api_client_rotate_key(client=client)
    key_hash = hash_key(raw_key)
    assert lookup_cache.api_client(key_hash).pk == client.pk
    assert _queries(lambda: lookup_cache.api_client(key_hash)) == 0
    # Revoked by another process: the row changes without this process's signals, the generation moves.
    ApiClient.objects.filter(pk=client.pk).update(is_active=False)
    get_redis().incr(rkey("config", "generation"))
    assert lookup_cache.api_client(key_hash) is None


@pytest.mark.django_db(transaction=True)
def test_one_request_reads_the_generation_once_and_the_next_request_sees_a_change(api_client_factory: Any) -> None:
    """Inside one_generation() (one request) the lookups share the first generation read; the next one re-reads."""
    client, _ = api_client_factory()
    key_hash = hash_key(api_client_rotate_key(client=client))
    assert lookup_cache.api_client(key_hash) is not None
    with config_cache.one_generation():
        assert lookup_cache.api_client(key_hash) is not None
        ApiClient.objects.filter(pk=client.pk).update(is_active=False)
        get_redis().incr(rkey("config", "generation"))
        # Still the generation this request started with: its lookups agree with each other.
        assert _queries(lambda: lookup_cache.api_client(key_hash)) == 0
    with config_cache.one_generation():
        assert lookup_cache.api_client(key_hash) is None


@pytest.mark.django_db(transaction=True)
def test_a_revoked_key_is_refused_at_the_next_request(api_client_factory: Any) -> None:
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    client, http = api_client_factory()
    assert http.post("/api/v1/notifications", body(), format="json").status_code == 202
    client.is_active = False
    client.save(update_fields=["is_active"])
    assert http.post("/api/v1/notifications", body(), format="json").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_each_client_gets_its_own_copy(api_client_factory: Any) -> None:
    client, _ = api_client_factory()
    raw_key = api_client_rotate_key(client=client)
    first = lookup_cache.api_client(hash_key(raw_key))
    first.rate_limit = "1/s"
    assert lookup_cache.api_client(hash_key(raw_key)).rate_limit == ""


@pytest.mark.django_db(transaction=True)
def test_a_published_template_version_is_used_by_the_next_accept(api: Any) -> None:
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    first = api.post("/api/v1/notifications", body(), format="json")
    assert first.status_code == 202
    again = api.post("/api/v1/notifications", body(), format="json")
    assert again.status_code == 202
    changed = {"en": {"email": {"subject": "Hello {{ name }}", "text": "Hi there {{ name }}"}}}
    template_put(key="welcome", category="transactional", default_locale="en", content=changed)
    third = api.post("/api/v1/notifications", body(), format="json")
    assert third.status_code == 202
    versions = [Notification.objects.get(pk=r.json()["id"]).template_version for r in (first, again, third)]
    assert versions == [1, 1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_template_resolution_is_cached(api: Any) -> None:

    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    assert template_version_cached("welcome", environment_id=1).version == 1
    assert _queries(lambda: template_version_cached("welcome", environment_id=1)) == 0


def _generation_reads(fn: Any) -> int:
    """Run fn() and return how many times Redis was asked for the configuration generation meanwhile (MONITOR)."""
    generation = rkey("config", "generation")
    return sum(1 for words in _commands_naming(generation, fn) if words[:2] == ["GET", generation])


def _commands_naming(key: str, fn: Any) -> list[list[str]]:
    """Run fn() and return the words of each command sent to Redis meanwhile that names `key` (MONITOR).

    The commands a script runs inside Redis are not counted: they cost no round trip.
    """
    stop = rkey("test", "monitor-stop")
    reads: list[list[str]] = []
    watching = threading.Event()

    def watch() -> None:
        with get_redis().monitor() as monitor:
            watching.set()
            for command in monitor.listen():
                words = str(command["command"]).split()
                if stop in words:
                    return
                if key in words and command.get("client_address") != "lua":
                    reads.append(words)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert watching.wait(5)
    fn()
    get_redis().get(stop)
    watcher.join(10)
    assert not watcher.is_alive()
    return reads


@pytest.mark.django_db(transaction=True)
def test_a_known_key_is_checked_and_rate_limited_in_one_redis_call(api_client_factory: Any) -> None:
    """The generation is read in the rate limit's script, not by a GET of its own, once this process knows the key."""
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    client, http = api_client_factory()
    assert http.post("/api/v1/notifications", body(), format="json").status_code == 202  # the key is now cached
    generation, bucket = rkey("config", "generation"), rkey("api-rl", str(client.pk))
    answers: list[Any] = []
    commands = _commands_naming(
        generation, lambda: answers.append(http.post("/api/v1/notifications", body(), format="json"))
    )
    assert answers[0].status_code == 202, answers[0].content
    # One command named the generation: the script that took the client's token.
    assert len(commands) == 1 and commands[0][0] == "EVALSHA" and bucket in commands[0], commands
    # A key revoked by another process: the generation moves, the one call sees it and the key is refused.
    ApiClient.objects.filter(pk=client.pk).update(is_active=False)
    get_redis().incr(generation)
    assert http.post("/api/v1/notifications", body(), format="json").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_send_batch_reads_the_generation_once(api_client_factory: Any) -> None:
    """A worker's batch is one unit as a request is: its cached lookups (templates, endpoints) share one read."""
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)
    template_put(key="other", category="transactional", default_locale="en", content=CONTENT)
    make_recipient(user_id="u-1", email="u1@example.com")
    for template in ("welcome", "other"):
        _, api = api_client_factory()  # two clients: an event-endpoint lookup each, a template lookup each
        answer = api.post("/api/v1/notifications", {**body(), "template": template, "channels": ["email"]},
                          format="json")  # fmt: skip
        assert answer.status_code == 202
    ids = list(Delivery.objects.order_by("id").values_list("id", flat=True))
    assert len(ids) == 2
    report: list[Any] = []
    assert _generation_reads(lambda: report.append(deliver(ids))) == 1
    assert report[0].sent == 2
