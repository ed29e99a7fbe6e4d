"""A deploy under load: the API processes, then the send workers, restarted one by one while callers keep sending.

What Kubernetes does on a rollout, done with real processes: a pod leaves the Service's endpoints (its preStop
pause), gets SIGTERM, drains, and a new one takes its place once it answers. Here the callers pick a backend per
request from the set "in rotation" (the load balancer), an API process leaves the rotation, gets SIGTERM after a
pause, and gunicorn finishes what it holds (`graceful_timeout`); a replacement joins the rotation once
`/healthz` answers. The send workers get SIGTERM one at a time (Celery's warm shutdown: finish the batch in hand,
hand back what was prefetched) and a new one starts. Every request must be answered 202, and every accepted
notification sent exactly once.
"""

from __future__ import annotations

import functools
import itertools
import signal
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable

import httpx
import pytest
from django.db.models import Count

from channels_app.models import SandboxMessage
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery, DeliveryEvent
from notifier.deliveries.outbox import relay
from preferences.models import Recipient
from templates_app.services import template_put
from tests.conftest import ServerProcess, free_port, wait_for

CALLERS = 4
RECIPIENTS = 50
EMAIL_QUEUES = ["email.high", "email.low"]


class Rotation:
    """The backends a load balancer sends to: callers pick one per request, round robin."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = list(urls)
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def pick(self) -> str:
        with self._lock:
            return self._urls[next(self._turn) % len(self._urls)]

    def remove(self, url: str) -> None:
        with self._lock:
            self._urls.remove(url)

    def add(self, url: str) -> None:
        with self._lock:
            self._urls.append(url)


def _answers(url: str) -> bool:
    try:
        return bool(urllib.request.urlopen(f"{url}/healthz", timeout=1).status == 200)
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)  # eight process starts; on a busy 2-core box each takes seconds
@pytest.mark.django_db(transaction=True)
def test_rolling_restart_of_api_and_workers_answers_every_request_and_sends_each_once(
    start_process: Callable[..., ServerProcess], start_worker: Callable[..., ServerProcess]
) -> None:
    template_put(
        key="receipt", category="transactional", default_locale="en",
        content={"en": {"email": {"subject": "Receipt {{ n }}", "text": "Order {{ n }}"}}},
    )  # fmt: skip
    Recipient.objects.bulk_create([Recipient(user_id=f"r-{i}", email=f"r{i}@example.com") for i in range(RECIPIENTS)])
    client, raw_key = api_client_create(name="rollout")
    ApiClient.objects.filter(pk=client.pk).update(rate_limit="100000/s")

    def api_process(port: int) -> ServerProcess:
        # The shipped server settings (gunicorn.conf.py: graceful_timeout, threads), one worker to keep it small.
        env = {"GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_WORKERS": "1", "WEB_THREADS": "4", "LOG_LEVEL": "WARNING"}
        return start_process("api", ["gunicorn", "-c", "gunicorn.conf.py", "config.wsgi:application"], env)

    ports = [free_port(), free_port()]
    apis = {port: api_process(port) for port in ports}
    urls = {port: f"http://127.0.0.1:{port}" for port in ports}
    for url in urls.values():
        wait_for(functools.partial(_answers, url), timeout=60)
    worker_env = {"SANDBOX_BEHAVIOUR": "slow:20"}
    workers = [start_worker(EMAIL_QUEUES, env=worker_env, concurrency=2) for _ in range(2)]

    rotation = Rotation(list(urls.values()))
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    accepted: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def caller(index: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {raw_key}"}, timeout=60) as http:
            for n in itertools.count():
                if stop.is_set():
                    return
                key = f"c{index}-{n}"
                body = {
                    "recipient": {"user_id": f"r-{n % RECIPIENTS}"}, "template": "receipt",
                    "payload": {"n": n}, "dedup_key": key,
                }  # fmt: skip
                try:
                    answer = http.post(f"{rotation.pick()}/api/v1/notifications", json=body)
                except httpx.HTTPError as error:
                    with lock:
                        failures.append(f"{key}: {error!r}")
                    continue
                with lock:
                    statuses[answer.status_code] += 1
                    if answer.status_code == 202:
                        accepted.append(key)
                time.sleep(0.05)  # a steady stream, not a flood: what is measured is the restarts

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(CALLERS)]
    for thread in threads:
        thread.start()
    started = time.monotonic()

    def phase(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s {what}: {sum(statuses.values())} answered")

    try:
        time.sleep(2)
        for port in ports:  # the API, one process at a time
            url = urls[port]
            rotation.remove(url)
            time.sleep(0.5)  # preStop: the endpoints update before the process hears of it
            apis[port].proc.send_signal(signal.SIGTERM)  # to the main process, as a container's PID 1 gets it
            apis[port].proc.wait(timeout=45)
            apis[port] = api_process(port)
            wait_for(functools.partial(_answers, url), timeout=60)
            rotation.add(url)
            phase(f"API on {port} replaced")
            time.sleep(1)
        for i, worker in enumerate(workers):  # then the send workers
            worker.proc.send_signal(signal.SIGTERM)  # the main process: a child killed directly loses its task
            worker.proc.wait(timeout=120)
            workers[i] = start_worker(EMAIL_QUEUES, env=worker_env, concurrency=2)
            phase(f"send worker {i + 1} replaced")
            time.sleep(1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=90)

    assert not failures, f"requests not answered: {failures[:5]}"
    assert set(statuses) == {202}, f"answers other than 202: {statuses}"
    total = len(accepted)
    assert total > 100, "the load was too small to prove anything"

    relayed = Counter[str]()

    def all_sent() -> bool:
        # What a process took with it would be found by the relay: counted and printed, not hidden.
        relayed.update(relay())
        return Delivery.objects.filter(status="sent").count() >= total

    try:
        wait_for(all_sent, timeout=120, interval=1)
    except AssertionError as timed_out:
        by_status = Counter(dict(Delivery.objects.values_list("status").annotate(n=Count("id"))))
        message = f"not all sent: {total} accepted, deliveries {dict(by_status)}, relayed {dict(relayed)}"
        raise AssertionError(message) from timed_out
    assert Delivery.objects.count() == total, "one delivery per accepted request"
    assert Delivery.objects.filter(status="sent").count() == total
    assert SandboxMessage.objects.count() == total
    twice = SandboxMessage.objects.filter(send_count__gt=1).count()
    sent_events = DeliveryEvent.objects.filter(status="sent").values("delivery_id").annotate(n=Count("id"))
    assert len(sent_events) == total and all(row["n"] == 1 for row in sent_events)
    print(f"accepted {total}, answers {dict(statuses)}, sent {total}, twice {twice}, relayed {dict(relayed)}")
    assert twice == 0, "a warm shutdown hands back what it has not sent; nothing reaches the provider twice"
