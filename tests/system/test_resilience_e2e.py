"""Resilience end to end: shared rate limits, AIMD, circuit breaker, priority reserve, Redis down, dead letters.

Real Celery workers, PostgreSQL, RabbitMQ and Redis; the provider is a local webhook receiver that records
when each request arrived, which delivery it carried (the `webhook-id` header is `dlv_<delivery id>`) and what
it answered. Limits and windows are set small through PROVIDER_RATE_LIMITS / PROVIDER_CIRCUIT_BREAKERS in the
workers' environment. Assertions are on counts, statuses and events, and on how many calls the receiver saw
per second against the configured limit, never on how fast our own code is.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from django.db.models import Count

from channels_app import breaker
from core import ratelimit
from core.redis_guard import get_redis
from notifier.accepting.services import notification_accept
from notifier.clients.models import ApiClient
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery, DeliveryEvent
from preferences.services import recipient_upsert
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.redis_server import RedisServer
from tests.stubs.webhook import TimedReceiver

CONTENT = {"en": {"webhook": {"body": {"event": "notice", "ref": "{{ ref }}"}}}}
TEMPLATES = {"tx": "transactional", "sec": "security", "mkt": "marketing"}


def _worker_env(webhook_env: dict[str, str], *, limits: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
    breakers = extra.pop("breakers", None)
    env = {
        **webhook_env,
        "WEBHOOK_PROVIDERS": "webhook",
        "RETRY_BACKOFF_BASE_SECONDS": "0.5",
        "RETRY_BACKOFF_MAX_SECONDS": "4",
        "PROVIDER_RATE_LIMITS": json.dumps(limits or {}),
        # Breakers are never in the way of a test about something else.
        "PROVIDER_CIRCUIT_BREAKERS": breakers or json.dumps({"webhook": {"min_calls": 100_000}}),
        **extra,
    }
    return env


def _setup(receiver: TimedReceiver, api_client_factory: Callable[..., tuple[Any, Any]]) -> tuple[ApiClient, Any]:
    """Create the templates, one recipient whose webhook is the receiver, and an API client."""
    for key, category in TEMPLATES.items():
        template_put(key=key, category=category, default_locale="en", content=CONTENT)
    recipient_upsert(user_id="hook-1", webhook_url=f"{receiver.url}/hooks")
    return api_client_factory(name="resilience")


def _accept(client: ApiClient, template: str = "tx", ref: object = "") -> int:
    """Accept one notification to the receiver in-process; return its delivery id."""
    result = notification_accept(
        client=client,
        data={
            "recipient": {"user_id": "hook-1"},
            "category": TEMPLATES[template],
            "template": template,
            "channels": ["webhook"],
            "payload": {"ref": str(ref)},
        },
    )
    [delivery] = result.deliveries
    assert delivery.status == "queued"
    return int(delivery.pk)


def _count(ids: list[int], status: str) -> int:
    return Delivery.objects.filter(pk__in=ids, status=status).count()


def _assert_sent_exactly_once(receiver: TimedReceiver, ids: list[int]) -> None:
    """Assert every delivery is `sent`, got exactly one 2xx from the receiver and has exactly one `sent` event."""
    statuses = Counter(Delivery.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == {"sent": len(ids)}, statuses
    ok = receiver.ok_per_delivery()
    assert set(ok) == set(ids), f"accepted by the receiver but not ours, or ours never accepted: {set(ok) ^ set(ids)}"
    doubles = {i: n for i, n in ok.items() if n != 1}
    assert not doubles, f"deliveries the receiver accepted more than once: {doubles}"
    events = DeliveryEvent.objects.filter(delivery_id__in=ids, status="sent").values("delivery_id")
    per_delivery = events.annotate(n=Count("id"))
    assert len(per_delivery) == len(ids) and all(row["n"] == 1 for row in per_delivery)


def _deferred_details(ids: list[int]) -> list[str]:
    return list(DeliveryEvent.objects.filter(delivery_id__in=ids, status="deferred").values_list("detail", flat=True))


def _max_in_window(times: list[float], window: float) -> int:
    """Return the most timestamps that fall in any half-open interval [t, t + window)."""
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while times[start] <= t - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def _sent_by(worker: Any) -> int:
    """Return how many deliveries a worker logged as sent (one "delivery sent" line each)."""
    return len(re.findall(r'"event": "delivery sent"', worker.log()))


# --- 1. the limit holds across two worker processes ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_shared_limit_holds_across_two_workers_and_each_delivery_is_sent_once(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], api_client_factory: Any
) -> None:
    """Send 120 deliveries through two workers against a 10/s limit; the receiver never sees more than that."""
    rate, burst, total = 10.0, 5.0, 120
    client, _ = _setup(receiver, api_client_factory)
    env = _worker_env(webhook_env, limits={"webhook": {"rate": rate, "burst": burst, "high_reserve": 0}})
    workers = [start_worker(queues=["webhook.high", "webhook.low"], env=env, concurrency=2) for _ in range(2)]
    ids = [_accept(client, ref=i) for i in range(total)]

    wait_for(lambda: _count(ids, "sent") == total, timeout=50, interval=0.5)

    _assert_sent_exactly_once(receiver, ids)
    times = [h.at for h in receiver.snapshot()]
    assert len(times) == total  # no request other than the one successful call per delivery
    # A token bucket admits at most burst + rate * T calls in any interval of T seconds. The receiver sees the
    # calls a little after the tokens were granted, with some jitter: allow 2 calls of it.
    tolerance = 2
    for window in (1.0, 3.0):
        worst = _max_in_window(times, window)
        print(f"most calls in any {window:.0f}s: {worst} (limit {burst + rate * window:.0f} + {tolerance})")
        assert worst <= burst + rate * window + tolerance, f"{worst} calls in {window:.0f}s, limit {rate}/s + {burst}"
    span = times[-1] - times[0]
    assert total <= burst + rate * span + tolerance
    # The limit was really in the way (the test could fail), and both processes shared it.
    assert any(d.startswith("rate_limited:webhook") for d in _deferred_details(ids))
    sent_per_worker = [_sent_by(w) for w in workers]
    assert sum(sent_per_worker) == total and all(n > 0 for n in sent_per_worker), sent_per_worker


# --- 2. throttling: 429 + Retry-After cuts the shared rate; nothing fails -------------------------------------


@pytest.mark.django_db(transaction=True)
def test_throttled_provider_defers_and_retries_then_everything_is_sent(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], api_client_factory: Any, settings: Any
) -> None:
    """Answer 429 with Retry-After for a while: the shared rate halves, deliveries wait, then all are sent once."""
    # A floor of 5/s and a quick additive recovery keep the test short once the provider recovers.
    limits = {"webhook": {"rate": 20.0, "burst": 5.0, "high_reserve": 0, "min_rate": 5.0, "increase": 0.5}}
    settings.PROVIDER_RATE_LIMITS = limits  # the test process reads the same configuration as the workers
    client, _ = _setup(receiver, api_client_factory)
    start_worker(queues=["webhook.high", "webhook.low"], env=_worker_env(webhook_env, limits=limits), concurrency=2)
    assert ratelimit.snapshot("webhook")["rate"] == 20.0

    receiver.retry_after = "1"
    receiver.throttling.set()
    ids = [_accept(client, ref=i) for i in range(30)]
    wait_for(lambda: sum(1 for h in receiver.snapshot() if h.status == 429) >= 5, timeout=30)
    throttled = ratelimit.snapshot("webhook")
    receiver.throttling.clear()

    wait_for(lambda: _count(ids, "sent") == len(ids), timeout=50, interval=0.5)

    _assert_sent_exactly_once(receiver, ids)
    assert throttled["configured_rate"] == 20.0
    assert throttled["rate"] <= 10.0, throttled  # halved (at least once) by the shared AIMD
    assert not DeadLetter.objects.filter(delivery_id__in=ids).exists()
    assert not DeliveryEvent.objects.filter(delivery_id__in=ids, status="failed").exists()
    hits = receiver.snapshot()
    # Each throttled delivery came back no sooner than the Retry-After it was given (the broker delays whole
    # seconds, rounded up; 0.1 s allows for the clocks of two processes).
    for i, hit in enumerate(hits):
        if hit.status != 429:
            continue
        later = next(h for h in hits[i + 1 :] if h.delivery_id == hit.delivery_id)
        assert later.at - hit.at >= 1.0 - 0.1, (hit, later)
    retried = DeliveryEvent.objects.filter(delivery_id__in=ids, status="queued", detail__contains="rate limited")
    assert retried.count() == sum(1 for h in hits if h.status == 429)
    # While the bucket was paused the others waited on the limiter instead of calling the provider.
    assert any(d.startswith("rate_limited:webhook") for d in _deferred_details(ids))


# --- 3. a provider that is down: the breaker opens, fails fast, probes, closes ---------------------------------


@pytest.mark.django_db(transaction=True)
def test_breaker_opens_on_503s_keeps_calls_away_then_probes_and_closes(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], api_client_factory: Any
) -> None:
    """Answer 503: the shared breaker opens after min_calls failures, no call goes out while open, probes close it."""
    conf = {
        "window_seconds": 10,
        "bucket_seconds": 1,
        "min_calls": 6,
        "failure_threshold": 0.5,
        "cooldown_seconds": 3,
        "half_open_probes": 2,
    }
    client, _ = _setup(receiver, api_client_factory)
    # Singles waiting on the queue travel together (channels_app/gather.py), and the breaker is asked once per
    # batch: before it opens, each of the two processes may have one batch of up to `gather` calls out.
    gather = 4
    env = _worker_env(webhook_env, breakers=json.dumps({"webhook": conf}), SEND_GATHER_MAX=str(gather))
    worker = start_worker(queues=["webhook.high", "webhook.low"], env=env, concurrency=2)
    assert breaker.state("webhook") == "closed"

    receiver.down.set()
    ids = [_accept(client, ref=i) for i in range(20)]
    wait_for(lambda: breaker.state("webhook") == "open", timeout=20, interval=0.05)
    until = float(cast(str, get_redis().hget(breaker.breaker_key("webhook"), "until")))  # a decoding client
    opened_at = until - conf["cooldown_seconds"]
    receiver.down.clear()  # the provider is healthy again; only the breaker keeps the calls away

    # After the cool-down, half_open_probes successful probes must close it (a few cool-downs of slack).
    closed = _poll(lambda: breaker.state("webhook") == "closed", timeout=5 * conf["cooldown_seconds"])
    assert closed, (
        f"breaker stuck in {breaker.state('webhook')!r}: {breaker_fields()} after "
        f"{sum(1 for h in receiver.snapshot() if h.status == 200)} successful calls"
    )
    wait_for(lambda: _count(ids, "sent") == len(ids), timeout=30, interval=0.5)

    _assert_sent_exactly_once(receiver, ids)
    hits = receiver.snapshot()
    failures_before_open = [h for h in hits if h.status == 503 and h.at < opened_at + 0.25]
    during_open = [h for h in hits if opened_at + 0.25 <= h.at < until]
    print(f"503s before the breaker opened: {len(failures_before_open)}; calls while open: {len(during_open)}")
    assert conf["min_calls"] <= len(failures_before_open) <= conf["min_calls"] + 2 * gather, len(failures_before_open)
    assert all(h.status != 503 for h in hits if h.at >= opened_at + 0.25)
    # A call admitted just before the breaker opened may still be on the wire; after that, nothing until the
    # cool-down ends.
    assert during_open == []
    details = _deferred_details(ids)
    assert any(d == "breaker_open" for d in details)
    log = worker.log()
    transitions = [
        log.find("circuit breaker webhook: closed -> open"),
        log.find("circuit breaker webhook: open -> half_open"),
        log.find("circuit breaker webhook: half_open -> closed"),
    ]
    assert -1 not in transitions and transitions == sorted(transitions), transitions
    assert breaker.state("webhook") == "closed"
    # Between half-open and closed only the probes reached the provider, however many deliveries were waiting.
    half_open_at = _logged_at(worker, "circuit breaker webhook: open -> half_open")
    closed_at = _logged_at(worker, "circuit breaker webhook: half_open -> closed")
    probes = [h for h in hits if half_open_at - 0.05 <= h.at < closed_at]
    print(f"calls while half-open: {len(probes)}")
    assert 1 <= len(probes) <= conf["half_open_probes"], probes
    # Deliveries that met a 503 were retried on the same provider, not failed.
    assert not DeadLetter.objects.filter(delivery_id__in=ids).exists()


def _logged_at(worker: Any, event: str) -> float:
    """Return the wall-clock time of the first JSON log line of `worker` whose event is `event`."""
    for line in worker.log().splitlines():
        if line.startswith("{") and f'"event": "{event}"' in line:
            return datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp()
    raise AssertionError(f"the worker never logged {event!r}")


def _poll(predicate: Callable[[], bool], timeout: float) -> bool:
    """Return True as soon as `predicate` holds, False if it never did within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


def breaker_fields() -> dict[str, str]:
    """Return the webhook breaker's Redis hash without its window counters (for failure messages)."""
    fields = cast(dict[str, str], get_redis().hgetall(breaker.breaker_key("webhook")))  # a decoding client
    return {k: v for k, v in fields.items() if not k.startswith(("c:", "f:"))}


# --- 4. priority share: a marketing flood does not hold back security messages --------------------------------


@pytest.mark.django_db(transaction=True)
def test_high_priority_is_never_rate_limited_by_a_low_priority_flood(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], api_client_factory: Any
) -> None:
    """Flood marketing at a 10/s provider, then send security messages: they use the reserve and go first."""
    limits = {"webhook": {"rate": 10.0, "burst": 10.0, "high_reserve": 0.5}}
    client, _ = _setup(receiver, api_client_factory)
    env = _worker_env(webhook_env, limits=limits)
    # Separate queues and worker processes per priority, as deployed.
    start_worker(queues=["webhook.low"], env=env, concurrency=2)
    start_worker(queues=["webhook.high"], env=env, concurrency=1)

    low = [_accept(client, "mkt", ref=i) for i in range(100)]
    assert set(Delivery.objects.filter(pk__in=low).values_list("priority", flat=True)) == {"low"}
    wait_for(lambda: _count(low, "sent") >= 15, timeout=30)
    assert any(d.startswith("rate_limited:webhook") for d in _deferred_details(low)), "the flood was not limited"

    high = []
    for i in range(6):
        high.append(_accept(client, "sec", ref=f"otp-{i}"))
        time.sleep(0.2)  # spread out like real sign-ins, while the flood keeps the bucket at its reserve
    wait_for(lambda: _count(high, "sent") == len(high), timeout=30)
    low_unsent_when_high_done = len(low) - _count(low, "sent")

    wait_for(lambda: _count(low, "sent") == len(low), timeout=50, interval=0.5)

    _assert_sent_exactly_once(receiver, low + high)
    assert set(Delivery.objects.filter(pk__in=high).values_list("priority", flat=True)) == {"high"}
    assert _deferred_details(high) == [], "a security message waited on the limiter behind marketing"
    assert list(Delivery.objects.filter(pk__in=high).values_list("attempts", flat=True)) == [1] * len(high)
    assert low_unsent_when_high_done > 0, "the low backlog drained first: the test proved nothing"
    last_low = max(h.at for h in receiver.snapshot() if h.delivery_id in set(low))
    assert max(h.at for h in receiver.snapshot() if h.delivery_id in set(high)) < last_low


# --- 5. Redis stopped mid-run ---------------------------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path: Path, settings: Any) -> Iterator[RedisServer]:
    """Run a private redis-server and point this process at it; restore the shared one afterwards."""
    shared_url = settings.REDIS_URL
    server = RedisServer(tmp_path).start()
    settings.REDIS_URL = server.url
    get_redis.cache_clear()
    try:
        yield server
    finally:
        server.stop()
        settings.REDIS_URL = shared_url
        get_redis.cache_clear()


@pytest.mark.django_db(transaction=True)
def test_redis_killed_mid_run_degrades_loses_nothing_and_sends_nothing_twice(
    start_worker: Any,
    receiver: TimedReceiver,
    webhook_env: dict[str, str],
    api_client_factory: Any,
    own_redis: RedisServer,
) -> None:
    """Kill the workers' Redis mid-run, keep sending through the API, restart it: all sent, once each."""
    limits = {"webhook": {"rate": 40.0, "burst": 10.0, "high_reserve": 0.2}}
    _, http = _setup(receiver, api_client_factory)
    env = _worker_env(webhook_env, limits=limits, REDIS_URL=own_redis.url, RESILIENCE_ASSUMED_WORKERS="2")
    worker = start_worker(queues=["webhook.high", "webhook.low"], env=env, concurrency=2)
    seq = iter(range(10_000))

    def post(n: int) -> None:
        for _ in range(n):
            i = next(seq)
            response = http.post(
                "/api/v1/notifications",
                {
                    "recipient": {"user_id": "hook-1"},
                    "category": "transactional",
                    "template": "tx",
                    "channels": ["webhook"],
                    "payload": {"ref": str(i)},
                    "dedup_key": f"redis-down-{i}",
                },
                format="json",
            )
            assert response.status_code == 202, response.content

    post(30)
    wait_for(lambda: Delivery.objects.filter(status="sent").count() >= 10, timeout=30)
    assert redis.Redis.from_url(own_redis.url).keys("*"), "the workers never used the private Redis"

    own_redis.kill()
    sent_at_kill = Delivery.objects.filter(status="sent").count()
    post(30)  # the API keeps accepting (idempotency falls back to the database)
    wait_for(lambda: "Redis unavailable" in worker.log(), timeout=20)
    wait_for(lambda: Delivery.objects.filter(status="sent").count() >= sent_at_kill + 20, timeout=30)
    time.sleep(6)  # outlast the 5 s Redis retry period, so the workers try Redis again after the restart

    own_redis.start()
    deadline = time.monotonic() + 30
    while "Redis reachable again" not in worker.log() and time.monotonic() < deadline:
        post(1)
        time.sleep(0.5)
    total = next(seq)

    wait_for(lambda: Delivery.objects.filter(status="sent").count() == total, timeout=40, interval=0.5)

    ids = list(Delivery.objects.values_list("pk", flat=True))
    assert len(ids) == total
    _assert_sent_exactly_once(receiver, ids)
    log = worker.log()
    assert "degraded to per-process in-memory state" in log
    assert "Redis reachable again" in log
    assert Delivery.objects.filter(status="sent").count() > sent_at_kill + 20


# --- 6. dead letters: exhausted, replayed through the API, delivered once -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_exhausted_deliveries_are_dead_lettered_replayed_via_api_and_sent_once(
    start_worker: Any, receiver: TimedReceiver, webhook_env: dict[str, str], api_client_factory: Any
) -> None:
    """Exhaust attempts against a 503 receiver, replay through the API once it recovers: one more call each."""
    client, http = _setup(receiver, api_client_factory)
    env = _worker_env(webhook_env, DELIVERY_MAX_ATTEMPTS="2")
    start_worker(queues=["webhook.high", "webhook.low"], env=env, concurrency=2)
    receiver.down.set()
    ids = [_accept(client, ref=i) for i in range(4)]

    wait_for(lambda: DeadLetter.objects.filter(delivery_id__in=ids).count() == len(ids), timeout=40)
    assert _count(ids, "failed") == len(ids)
    before = receiver.snapshot()
    assert Counter(h.delivery_id for h in before) == dict.fromkeys(ids, 2)
    assert {h.status for h in before} == {503}

    listed = http.get("/api/v1/dead-letters", {"channel": "webhook", "status": "pending"}).json()["results"]
    dead_ids = sorted(d["id"] for d in listed)
    assert sorted(d["delivery_id"] for d in listed) == sorted(ids)
    receiver.down.clear()
    response = http.post("/api/v1/dead-letters/replay", {"ids": dead_ids}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"replayed": len(ids)}

    wait_for(lambda: _count(ids, "sent") == len(ids), timeout=30)
    # A second replay finds nothing to do; give any stray duplicate message a moment to show up.
    again = http.post("/api/v1/dead-letters/replay", {"ids": dead_ids}, format="json")
    assert again.json() == {"replayed": 0}
    time.sleep(2)

    after = receiver.snapshot()[len(before) :]
    assert Counter(h.delivery_id for h in after) == dict.fromkeys(ids, 1)
    assert {h.status for h in after} == {200}
    _assert_sent_exactly_once(receiver, ids)
    assert set(DeadLetter.objects.filter(delivery_id__in=ids).values_list("status", flat=True)) == {"replayed"}
