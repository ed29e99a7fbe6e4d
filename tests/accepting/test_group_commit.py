"""Group commit of single accepts (core/group_commit.py), and the accept's caches
seen by every API process.

To make concurrent requests meet in one group for certain, a first request is held inside its write by a table
lock the test takes on its own connection; the requests sent meanwhile queue behind it, and the next writer takes
them all into one transaction when the lock goes.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import DataError, connection

from core.errors import ApiError
from core.scopes import SCOPES
from notifier.accepting.services import (
    AcceptRequest,
    AcceptResult,
    accept_group,
    notification_accept,
    notification_accept_grouped,
    notifications_accept_group,
)
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery, Notification
from templates_app.services import template_put
from tests.conftest import bearer_client, test_database_url, wait_for

CONTENT = {"en": {"email": {"subject": "Hi {{ name }}", "text": "Hello {{ name }}"}}}


def body(user: str = "u-1", **extra: Any) -> dict[str, Any]:
    return {"recipient": {"user_id": user}, "template": "welcome", "payload": {"name": "Ada"}, **extra}


def _waiting_on_a_lock() -> bool:
    return _waiting_on_locks() > 0


@contextmanager
def writer_held(table: str) -> Iterator[Callable[[], None]]:
    """Hold `table` locked against writes on a connection of our own; yield the function that releases it."""
    with psycopg.connect(test_database_url(), autocommit=False) as held:
        held.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")  # a constant of this module, not input
        yield held.commit
        held.rollback()


def run_threads(calls: list[Callable[[], Any]]) -> tuple[list[threading.Thread], list[Any]]:
    """Start one thread per call; each stores its return value or exception at its index."""
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            outcomes[index] = calls[index]()
        except Exception as exc:
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    return threads, outcomes


@pytest.fixture
def welcome(transactional_db: None) -> None:
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)


@pytest.mark.usefixtures("welcome")
def test_fifty_concurrent_requests_with_one_key_in_one_shared_transaction_make_one_notification() -> None:
    client, raw_key = api_client_create(name="race", scopes=list(SCOPES))
    groups_before = accept_group().groups

    def post(dedup_key: str) -> Callable[[], tuple[int, str]]:
        def call() -> tuple[int, str]:
            response = bearer_client(raw_key).post("/api/v1/notifications", body(dedup_key=dedup_key), format="json")
            return response.status_code, response.json()["id"]

        return call

    with writer_held("notifier_dedupkey") as release:
        first, first_outcome = run_threads([post("blocker")])
        wait_for(_waiting_on_a_lock, timeout=30, interval=0.05)
        threads, outcomes = run_threads([post("race") for _ in range(50)])
        wait_for(lambda: accept_group().pending() == 50, timeout=30, interval=0.05)
        release()
    for t in first + threads:
        t.join(timeout=60)

    assert first_outcome[0][0] == 202
    assert accept_group().groups == groups_before + 1, "the fifty were not written as one group"
    assert accept_group().largest >= 50
    original = Notification.objects.get(client=client, dedup_key="race")
    assert Notification.objects.filter(client=client, dedup_key="race").count() == 1
    assert sorted(code for code, _ in outcomes) == [200] * 49 + [202]
    assert {notification_id for _, notification_id in outcomes} == {str(original.pk)}
    assert Delivery.objects.filter(notification=original).count() == 1


@pytest.mark.usefixtures("welcome")
@pytest.mark.parametrize("clients", ["one client (no savepoint)", "two clients (a savepoint each)"])
def test_a_request_failing_in_the_shared_transaction_fails_alone(clients: str) -> None:
    client, _ = api_client_create(name="mixed", scopes=list(SCOPES))
    other = client if clients.startswith("one") else api_client_create(name="other", scopes=list(SCOPES))[0]
    groups_before = accept_group().groups

    def accept(who: ApiClient, data: dict[str, Any]) -> Callable[[], AcceptResult]:
        return lambda: notification_accept_grouped(client=who, data=data, trace_id="")

    calls = [
        accept(client, body("u-good-1", dedup_key="g1")),
        # PostgreSQL refuses a NUL character in jsonb: this row fails inside the group's INSERT.
        accept(client, body("u-bad", payload={"name": "A\u0000da"})),
        accept(client, body("u-good-2")),
        accept(client, body("u-bad-template", template="no_such_template")),
        # The same key for another client is its own; for the same client, another key.
        accept(other, body("u-good-3", dedup_key="g1" if other != client else "g2")),
    ]
    with writer_held("notifier_notification") as release:
        first, first_outcome = run_threads([accept(client, body("u-blocker"))])
        wait_for(_waiting_on_a_lock, timeout=30, interval=0.05)
        threads, outcomes = run_threads(calls)
        wait_for(lambda: accept_group().pending() == len(calls), timeout=30, interval=0.05)
        release()
    for t in first + threads:
        t.join(timeout=60)

    assert accept_group().groups == groups_before + 1
    good_1, bad, good_2, bad_template, good_3 = outcomes
    assert isinstance(bad, DataError), bad
    assert isinstance(bad_template, ApiError) and bad_template.status_code == 400, bad_template
    for result, user in ((good_1, "u-good-1"), (good_2, "u-good-2"), (good_3, "u-good-3")):
        assert isinstance(result, AcceptResult), result
        assert not result.duplicate
        stored = Notification.objects.get(pk=result.notification.pk)
        assert stored.user_id == user
        assert Delivery.objects.filter(notification=stored).count() == 1
    assert isinstance(first_outcome[0], AcceptResult)
    assert not Notification.objects.filter(user_id__in=["u-bad", "u-bad-template"]).exists()
    assert Notification.objects.filter(user_id__startswith="u-").count() == 4


def _call(url: str, method: str, path: str, key: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(payload).encode(),
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.django_db(transaction=True)
def test_a_published_template_and_changed_scopes_are_seen_by_the_next_request_of_every_api_process(
    two_api_processes: list[str],
) -> None:
    first, second = two_api_processes
    client, key = api_client_create(name="cached", scopes=["send", "templates", "templates:admin"])
    template_put(key="welcome", category="transactional", default_locale="en", content=CONTENT)

    def version_used(url: str) -> int:
        status, answer = _call(url, "POST", "/api/v1/notifications", key, body())
        assert status == 202, answer
        version = Notification.objects.get(pk=answer["id"]).template_version
        assert version is not None
        return version

    # Both processes have the client and version 1 in their caches.
    assert [version_used(first), version_used(second)] == [1, 1]
    assert _call(second, "POST", "/api/v1/notifications", key, {"topic": "news", "template": "welcome"})[0] == 403

    # Version 2 published through the first process: the second's next accept uses it.
    content = {"en": {"email": {"subject": "Hello {{ name }}", "text": "Hi {{ name }}"}}}
    status, answer = _call(
        first, "PUT", "/api/v1/templates/welcome", key, {"category": "transactional", "content": content}
    )
    assert status in (200, 201), answer
    assert version_used(second) == 2
    assert version_used(first) == 2

    # Scopes changed by a third process (this one, as the admin would): both API processes see it at once.
    client.scopes = ["send", "templates", "templates:admin", "topics"]
    client.save(update_fields=["scopes"])
    for url in (first, second):
        status, answer = _call(url, "POST", "/api/v1/notifications", key, {"topic": "news", "template": "welcome"})
        assert status == 400 and "topic" in answer["error"]["fields"], answer  # allowed now: the topic is unknown


@pytest.mark.usefixtures("welcome")
def test_a_group_losing_a_key_to_a_concurrent_request_gives_its_other_keys_back_and_writes_them_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The group's transaction has no savepoint: the keys it reserved before losing one are given back by hand.

    The replay then writes the other keys within the group's own transaction (had the keys stayed reserved, the
    replay would find them taken, and the whole group would fall back to accepting each alone).
    """
    client, _ = api_client_create(name="racer", scopes=list(SCOPES))
    with writer_held("notifier_notification") as release:
        # The first request reserves "k" and then waits on the table lock, its transaction open.
        first, first_outcome = run_threads(
            [lambda: notification_accept(client=client, data=body("u-first", dedup_key="k"), trace_id="")]
        )
        wait_for(_waiting_on_a_lock, timeout=30, interval=0.05)
        requests = [
            AcceptRequest(client=client, data=body("u-first", dedup_key="k"), trace_id=""),
            AcceptRequest(client=client, data=body("u-second", dedup_key="k2"), trace_id=""),
        ]
        group, group_outcome = run_threads([lambda: notifications_accept_group(requests)])
        wait_for(lambda: _waiting_on_locks() >= 2, timeout=30, interval=0.05)  # the group's reserve waits on "k"
        release()
    for t in first + group:
        t.join(timeout=60)

    winner = first_outcome[0]
    assert isinstance(winner, AcceptResult) and not winner.duplicate, winner
    duplicate, second = group_outcome[0]
    assert isinstance(duplicate, AcceptResult) and duplicate.duplicate, duplicate
    assert duplicate.notification.pk == winner.notification.pk
    assert isinstance(second, AcceptResult) and not second.duplicate, second
    assert Notification.objects.filter(client=client, dedup_key="k2").count() == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT notification_id FROM notifier_dedupkey WHERE client_id = %s AND dedup_key = 'k2'", [client.pk]
        )
        assert [row[0] for row in cursor.fetchall()] == [second.notification.pk]
    assert "accepting each alone" not in caplog.text


def _waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])
