"""Fair shares: one project's broadcast against another project's singles, and three broadcasts at once.

    BENCH_NS=me .venv/bin/python bench/fair_shares.py [--recipients 100000] [--singles 60] [--three 20000]
        [--workflow 20000] [--rate 1000] [--skip alone,contended,broadcast,three,workflow]

The worker classes as the Procfile runs them (the low worker prefork 2, the fan-out worker prefork 2) and the API
under gunicorn, on their own database and vhost, with the in-app provider limited to --rate deliveries a second
(PROVIDER_RATE_LIMITS={"inapp": {"rate": …, "burst": …}}), so in-app sends go through `inapp.low` and the
provider's limit. All traffic is category `social` (normal priority, the low queues), in-app.

1. **alone**: project B sends --singles singles one at a time (the next when the last is sent, at most one a
   second): accept -> sent p50/p99 (the delivery's sent_at minus its notification's created_at).
2. **contended**: project A sends one notification to a topic of --recipients; while it drains, B sends its
   singles as in 1: their p50/p99 (the target: p99 < 1 s), and how long A's broadcast took.
3. **broadcast**: A's broadcast alone: its drain time and deliveries a second, accept -> last sent.
4. **three**: projects A, B and C (weight 1 each) each send to a topic of --three at once: what each had sent
   when the first finished, as a share of the total (about a third each when shared), each one's drain time, and
   B's singles sent meanwhile as in 1 (behind none of the three, its own included).
5. **workflow**: A triggers a one-step workflow (an in-app send of a template that takes the workers about
   10 ms to render) for a topic of --workflow; while its runs send, B sends its singles as in 1: their p50/p99,
   and how long A's runs took (the wake relay called here every second, as beat would).

Run it on main too for the before figures (the script uses nothing the fair shares added).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ApiServer, Worker, cleanup, log, parser, percentile, prepare, wait_until, workers

CONTENT = {"en": {"inapp": {"title": "News {{ n }}", "body": "Hello {{ n }}"}}}
# Three thousand loop turns of arithmetic: a rendering of about 10 ms on this box.
SLOW = {"en": {"inapp": {"title": "News {{ n }}", "body": "{% for i in range(3000) %}{{ (i * n) % 7 }}{% endfor %}"}}}


class Project:
    """A project with a live key, the `news` template and topics of its own."""

    def __init__(self, slug: str) -> None:
        from core.scopes import SCOPES
        from notifier.clients.services import api_client_create
        from projects.scoping import owner_scope
        from projects.services import project_create
        from templates_app.services import template_put

        self.slug = slug
        project_create(slug=slug, name=slug)
        client, self.key = api_client_create(name=f"bench-{slug}", scopes=list(SCOPES), project=slug)
        client.rate_limit = "1000000/s"
        client.save(update_fields=["rate_limit"])
        self.client = client
        self.environment_id = client.environment_id
        with owner_scope(self.environment_id):
            template_put(key="news", category="social", default_locale="en", content=CONTENT)
            template_put(key="slow_news", category="social", default_locale="en", content=SLOW)

    def topic(self, key: str, n: int) -> None:
        """Create topic `key` of n subscribers in this project's environment (set-based SQL)."""
        from django.db import connection

        from preferences.models import Topic
        from projects.scoping import owner_scope

        with owner_scope(self.environment_id):
            topic = Topic.objects.create(key=key, name=key)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO preferences_recipient (environment_id, user_id, email, phone, locale, timezone, "
                "webhook_url, opted_out, channel_prefs, category_prefs, created_at, updated_at) "
                "SELECT %s, %s || g, '', '', '', '', '', false, '{}', '{}', now(), now() FROM generate_series(1, %s) g",
                [self.environment_id, f"{key}-", n],
            )
            cursor.execute(
                "INSERT INTO preferences_subscription (topic_id, recipient_id, created_at) SELECT %s, id, now() "
                "FROM preferences_recipient WHERE environment_id = %s AND user_id LIKE %s ORDER BY id",
                [topic.pk, self.environment_id, f"{key}-%"],
            )
            cursor.execute("ANALYZE preferences_recipient; ANALYZE preferences_subscription")

    def send(self, url: str, body: dict[str, Any]) -> str:
        """POST a notification (in-app, social) and return its id."""
        body = {"template": "news", "category": "social", "channels": ["inapp"], "payload": {"n": 1}, **body}
        request = urllib.request.Request(
            f"{url}/api/v1/notifications",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        return str(json.loads(urllib.request.urlopen(request, timeout=30).read())["id"])


def singles(project: Project, url: str, n: int, stop: threading.Event | None = None) -> list[float]:
    """Send n singles one at a time (the next once the last is sent, at most one a second); return ms each."""
    from notifier.deliveries.models import Delivery

    latencies: list[float] = []
    for i in range(n):
        if stop is not None and stop.is_set():
            break
        started = time.monotonic()
        nid = project.send(url, {"recipient": {"user_id": f"{project.slug}-single"}, "payload": {"n": i}})
        sent = Delivery.objects.filter(notification_id=nid, status="sent")
        wait_until(sent.exists, timeout=300, interval=0.02, what="a single sent")
        row = sent.select_related("notification").values_list("notification__created_at", "sent_at").first()
        assert row is not None and row[1] is not None
        latencies.append((row[1] - row[0]).total_seconds() * 1000)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return latencies


def drained(nid: str) -> int:
    from notifier.deliveries.models import Delivery

    return Delivery.objects.filter(notification_id=nid, status="sent").count()


def broadcast(project: Project, url: str, topic: str, total: int) -> tuple[str, float]:
    """Send to a topic; return its id and its accept time (monotonic)."""
    started = time.monotonic()
    return project.send(url, {"topic": topic}), started


def wait_drained(nid: str, total: int, started: float) -> float:
    wait_until(lambda: drained(nid) >= total, timeout=3600, interval=0.5, what="the broadcast drained")
    return time.monotonic() - started


def workflow_drain(project: Project, topic: str, total: int, stop: threading.Event) -> tuple[int, float]:
    """Trigger a one-send workflow for `topic`; relay held runs each second until all are done; (done, seconds)."""
    from notifier.workflows.models import WorkflowRun
    from notifier.workflows.services import runs_wake, workflow_put, workflow_trigger
    from projects.scoping import owner_scope

    with owner_scope(project.environment_id):
        workflow_put(
            key="bench_fair", category="social",
            steps=[{"id": "note", "type": "send", "channel": "inapp", "template": "slow_news"}],
        )  # fmt: skip
    started = time.monotonic()
    data = {"topic": topic, "workflow": "bench_fair", "payload": {"n": 3}}
    trigger = workflow_trigger(client=project.client, data=data).notification
    runs = WorkflowRun.objects.filter(notification_id=trigger.pk)
    while time.monotonic() - started < 3600:
        runs_wake()  # what beat does every WORKFLOW_WAKE_INTERVAL_SECONDS
        if runs.filter(status="done").count() >= total:
            break
        time.sleep(1)
    stop.set()
    return runs.filter(status="done").count(), time.monotonic() - started


def line(name: str, values: list[float]) -> str:
    p50, p99, top = percentile(values, 50), percentile(values, 99), max(values, default=0)
    return f"{name}: n {len(values)}, p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {top:.0f} ms"


def rate_line(name: str, total: int, seconds: float) -> str:
    return f"{name}{total} in {seconds:.1f} s ({total / seconds:.0f}/s)"


def run(args: argparse.Namespace) -> None:
    from preferences.models import Recipient
    from projects.scoping import owner_scope

    skip = set(filter(None, args.skip.split(",")))
    a, b, c = Project("proj-a"), Project("proj-b"), Project("proj-c")
    for p in (a, b):
        with owner_scope(p.environment_id):
            Recipient.objects.create(user_id=f"{p.slug}-single")
    a.topic("a-everyone", args.recipients)
    a.topic("a-broadcast", args.recipients)
    for p in (a, b, c):
        p.topic(f"{p.slug}-three", args.three)
    if "workflow" not in skip:
        a.topic("a-workflow", args.workflow)
    server = ApiServer()
    low = Worker("fair-low", ["push.low", "email.low", "sms.low", "inapp.low", "webhook.low"], concurrency=2)
    fan = Worker("fair-fanout", ["fanout"], concurrency=2)
    out: list[str] = []
    try:
        server.wait_ready()
        with workers(low, fan):
            if "alone" not in skip:
                log("B's singles alone")
                out.append(line("B's singles alone            ", singles(b, server.url, args.singles)))
            if "contended" not in skip:
                log("A's broadcast with B's singles")
                nid, started = broadcast(a, server.url, "a-everyone", args.recipients)
                time.sleep(2)  # the fan-out is under way
                stop = threading.Event()
                during: list[float] = []
                while drained(nid) < args.recipients * 0.9 and len(during) < args.singles:
                    during += singles(b, server.url, 1, stop)
                seconds = wait_drained(nid, args.recipients, started)
                out.append(line("B's singles while A drains   ", during))
                out.append(rate_line("A's broadcast (with B)        ", args.recipients, seconds))
            if "broadcast" not in skip:
                log("A's broadcast alone")
                nid, started = broadcast(a, server.url, "a-broadcast", args.recipients)
                seconds = wait_drained(nid, args.recipients, started)
                out.append(rate_line("A's broadcast alone           ", args.recipients, seconds))
            if "three" not in skip:
                log("three broadcasts at once")
                sent = [broadcast(p, server.url, f"{p.slug}-three", args.three) for p in (a, b, c)]
                ids = [nid for nid, _ in sent]
                time.sleep(2)  # the fan-outs are under way
                during = []
                while max(drained(i) for i in ids) < args.three * 0.9 and len(during) < args.singles:
                    during += singles(b, server.url, 1)
                wait_until(
                    lambda: max(drained(i) for i in ids) >= args.three, timeout=3600, interval=0.2, what="one drained"
                )
                counts = [drained(i) for i in ids]
                total = sum(counts) or 1
                shares = ", ".join(f"{p.slug} {n} ({n / total:.0%})" for p, n in zip((a, b, c), counts, strict=True))
                out.append(f"three at once, when the first finished: {shares}")
                times = [wait_drained(i, args.three, started) for i, started in sent]
                out.append("three at once, drain times     " + ", ".join(f"{t:.1f} s" for t in times))
                out.append(line("B's singles while all three drain", during))
            if "workflow" not in skip:
                log("A's topic workflow (a slow template) with B's singles")
                stop = threading.Event()
                result: list[tuple[int, float]] = []
                drain = threading.Thread(
                    target=lambda: result.append(workflow_drain(a, "a-workflow", args.workflow, stop)), daemon=True
                )
                drain.start()
                time.sleep(3)  # the runs are written and sending
                during = []
                while not stop.is_set() and len(during) < args.singles:
                    during += singles(b, server.url, 1, stop)
                drain.join()
                done, seconds = result[0] if result else (0, 0.0)
                out.append(line("B's singles while A's workflow runs", during))
                out.append(rate_line("A's workflow runs done (with B)  ", done, seconds))
    finally:
        server.stop()
    print("\n=== bench/fair_shares.py ===")
    print(f"in-app provider limited to {args.rate}/s; topics of {args.recipients} (three: {args.three} each)")
    for text in out:
        print(text)


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--recipients", type=int, default=100_000)
    p.add_argument("--three", type=int, default=20_000)
    p.add_argument("--singles", type=int, default=60)
    p.add_argument("--workflow", type=int, default=20_000)
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--skip", default="", help="phases to leave out: alone,contended,broadcast,three,workflow")
    args = p.parse_args()
    # Every process (API, workers) reads the provider's limit from the environment.
    os.environ["PROVIDER_RATE_LIMITS"] = json.dumps({"inapp": {"rate": args.rate, "burst": args.rate}})
    prepare()
    try:
        run(args)
    finally:
        cleanup(args.keep)


if __name__ == "__main__":
    main()
