"""Singles against the stack as `make run` ships it, from outside: only its HTTP API and its database are used.

    API_CLIENT_RATE_LIMIT=5000/s make run          # in one shell (the default 200/s per client caps one caller)
    .venv/bin/python bench/make_run.py [--singles 4000] [--clients 16] [--url http://127.0.0.1:8000]

The other benchmarks start their own API (DEBUG off, WARNING logs) and workers (INFO, as deployed); this one
measures what a newcomer runs: gunicorn, every worker, beat and the inbox streams under honcho, with what
`make run` sets (DEBUG off, INFO logs, Flower only with FLOWER=1). With the demo API key (var/demo-api-key) it
creates --singles recipients with an email address, sends each one email single from --clients concurrent HTTP
clients, and prints the accepts per second with their latency, the time from the first accept to the last
delivery recorded `sent` (polling the database), the CPU seconds of each process group on the box in that
time, and then the time until every notification also reads `sent` over the API (GET
/api/v1/notifications/{id}, which makes load of its own).

    .venv/bin/python bench/make_run.py --singles 0 --topic 100000 [--otps 60]

With --topic N it also sends one email notification (category social) to a topic of N subscribers, made in the
database with set-based SQL, and prints deliveries per second from the accept to the last `sent`, as the
stack's own fan-out and send workers drain it. With --otps K, K one-time codes (category security, high
priority) are sent one every --otp-interval seconds while the singles run and again while the topic drains;
their latency is each one's `sent_at` minus its `created_at`, as the database recorded them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    add_recipients,
    group_cpu,
    in_parallel,
    key_environment,
    log,
    percentile,
    print_cpu,
    psql,
)

# The database `make run` serves from.
DATABASE = "notifier"


class Api:
    """A keep-alive HTTP client per thread for the running API, with the demo key."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.key = key
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def in_parallel(self, clients: int, n: int, call: Callable[[http.client.HTTPConnection, int], Any]) -> list[Any]:
        """Run `call(connection, i)` for i in range(n) from `clients` threads; return the results in order."""
        return in_parallel(self.host, self.port, clients, n, call)

    def request(self, conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request; wait and retry while the API answers 429; return the status and the parsed body."""
        while True:
            conn.request(method, path, None if body is None else json.dumps(body), self.headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 429:
                return response.status, json.loads(data) if data else None
            time.sleep(float(response.getheader("Retry-After") or 1))


def sent_count(prefix: str) -> int:
    """Return how many deliveries to this run's recipients (their addresses start with `prefix`) are sent."""
    return int(
        psql(
            DATABASE,
            # One table: a join with the notifications, planned on statistics from before the run, looped over
            # both for minutes and took a core from what was measured. The prefix is ours, no caller's text.
            f"SELECT count(*) FROM notifier_delivery WHERE address LIKE '{prefix}%' AND status = 'sent'",
        )
        or 0
    )


class OtpProbe:
    """One-time codes sent one every `interval` seconds from a thread of their own, while something else runs."""

    def __init__(self, api: Api, user_id: str, count: int, interval: float) -> None:
        self.api, self.user_id, self.count, self.interval = api, user_id, count, interval
        self.ids: list[str] = []
        self.thread = threading.Thread(target=self._send, daemon=True)

    def __enter__(self) -> OtpProbe:
        if self.count:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.count:
            self.thread.join()

    def _send(self) -> None:
        conn = http.client.HTTPConnection(self.api.host, self.api.port, timeout=60)
        for i in range(self.count):
            started = time.monotonic()
            body = {"recipient": {"user_id": self.user_id}, "template": "bench_otp", "category": "security"}
            body |= {"channels": ["email"], "payload": {"n": i}}
            status, answer = self.api.request(conn, "POST", "/api/v1/notifications", body)
            if status == 202:
                self.ids.append(answer["id"])
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        conn.close()

    def report(self, during: str, timeout: float) -> None:
        """Wait until every OTP is sent; print their accept -> sent latency from the database."""
        if not self.count:
            return
        if not self.ids:
            print(f"OTPs during {during}: none of {self.count} accepted")
            return
        listed = ",".join(f"'{i}'" for i in self.ids)  # ids the API gave, uuids
        of_otps = (
            "FROM notifier_delivery d JOIN notifier_notification n ON n.id = d.notification_id "
            f"WHERE n.id IN ({listed})"
        )
        deadline = time.monotonic() + timeout
        while int(psql(DATABASE, f"SELECT count(*) {of_otps} AND d.status = 'sent'") or 0) < len(self.ids):
            if time.monotonic() > deadline:
                print(f"OTPs during {during}: not all sent within {timeout:.0f} s")
                return
            time.sleep(0.5)
        rows = psql(DATABASE, f"SELECT extract(epoch FROM d.sent_at - n.created_at) * 1000 {of_otps}").split()
        latencies = [float(r) for r in rows]
        print(
            f"OTPs during {during:<18} p50 {percentile(latencies, 50):.0f} ms, p99 {percentile(latencies, 99):.0f} ms,"
            f" max {max(latencies):.0f} ms (n={len(latencies)}, {len(self.ids)} of {self.count} accepted)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--singles", type=int, default=4000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--topic", type=int, default=0, help="subscribers of a topic sent to after the singles (0: none)")
    p.add_argument("--otps", type=int, default=0, help="OTPs sent during the singles and during the topic")
    p.add_argument("--otp-interval", type=float, default=0.5, help="seconds between two OTPs")
    args = p.parse_args()
    key_file = ROOT / "var" / "demo-api-key"
    if not key_file.exists():
        sys.exit("no var/demo-api-key: start the stack with `make run` first")
    api = Api(args.url, key_file.read_text().strip())
    conn = http.client.HTTPConnection(api.host, api.port, timeout=60)
    for key, category in (("bench_otp", "security"), ("bench_news", "social")):
        content = {"en": {"email": {"subject": "n {{ n }}", "text": "t"}}}
        api.request(conn, "PUT", f"/api/v1/templates/{key}", {"category": category, "content": content})
    api.request(conn, "PUT", "/api/v1/recipients/bench-otp-user", {"email": "otp@example.com"})
    conn.close()
    print(f"\n=== bench/make_run.py: the stack as `make run` ships it ({args.url}) ===")
    if args.singles:
        singles(api, args)
    if args.topic:
        topic(api, args)


def singles(api: Api, args: argparse.Namespace) -> None:
    """Send --singles email singles from --clients clients (OTPs beside them); print their rates and CPU."""
    n, prefix = args.singles, f"mr{int(time.time())}-"
    log(f"creating {n} recipients")
    api.in_parallel(
        args.clients,
        n,
        lambda conn, i: api.request(
            conn, "PUT", f"/api/v1/recipients/{prefix}{i}", {"email": f"{prefix}{i}@example.com"}
        ),
    )

    def send(conn: http.client.HTTPConnection, i: int) -> tuple[int, float, str]:
        body = {"recipient": {"user_id": f"{prefix}{i}"}, "template": "order_shipped", "channels": ["email"]}
        body["payload"] = {"order_id": f"B-{i}"}
        started = time.monotonic()
        status, answer = api.request(conn, "POST", "/api/v1/notifications", body)
        return status, (time.monotonic() - started) * 1000, (answer or {}).get("id", "")

    log(f"sending {n} singles from {args.clients} clients")
    cpu0, t0 = group_cpu(), time.monotonic()
    # As many OTPs as fit in the singles' run at about 140/s, so that they are sent beside the load, not after it.
    otp_count = min(args.otps, max(1, int(n / 140 / args.otp_interval))) if args.otps else 0
    with OtpProbe(api, "bench-otp-user", otp_count, args.otp_interval) as otps:
        results = api.in_parallel(args.clients, n, send)
    accept_wall = time.monotonic() - t0
    deadline = t0 + args.timeout
    while sent_count(prefix) < n and time.monotonic() < deadline:
        time.sleep(0.5)
    cpu1, to_sent = group_cpu(), time.monotonic() - t0
    ids = [r[2] for r in results]

    def reads_sent(conn: http.client.HTTPConnection, i: int) -> bool:
        status, answer = api.request(conn, "GET", f"/api/v1/notifications/{ids[i]}")
        return status == 200 and bool(answer["deliveries"]) and all(d["status"] == "sent" for d in answer["deliveries"])

    while not all(api.in_parallel(args.clients, n, reads_sent)) and time.monotonic() < deadline:
        time.sleep(1)
    to_read = time.monotonic() - t0

    latencies = [r[1] for r in results]
    print(f"single accepts            {n / accept_wall:.0f} req/s with {args.clients} clients")
    print(f"  latency                 p50 {percentile(latencies, 50):.0f} ms, p99 {percentile(latencies, 99):.0f} ms")
    print(f"  non-202 answers         {sum(1 for r in results if r[0] != 202)}")
    print(f"accept -> sent            {n / to_sent:.0f} deliveries/s ({n} singles in {to_sent:.1f} s, database polled)")
    print(f"every one read sent       {to_read:.1f} s after the first accept (GET /api/v1/notifications/{{id}})")
    otps.report("the singles", timeout=args.timeout)
    print(f"CPU seconds from the first accept to the last sent ({to_sent:.1f} s wall, 2 cores = {2 * to_sent:.0f}):")
    print_cpu(cpu0, cpu1, n)


def topic(api: Api, args: argparse.Namespace) -> None:
    """Send one notification to a topic of --topic subscribers (OTPs beside it); print deliveries/s to `sent`."""
    n, key = args.topic, f"mrt{int(time.time())}"
    log(f"creating the topic {key} of {n} subscribers")
    # In the demo key's environment: the API finds only its own topics and recipients.
    environment = key_environment(DATABASE, api.key)
    add_recipients(DATABASE, f"{key}-", n, environment_id=environment)
    psql(
        DATABASE,
        "INSERT INTO preferences_topic (environment_id, key, name, created_at)"
        f" VALUES ({environment}, '{key}', '{key}', now());"
        "INSERT INTO preferences_subscription (topic_id, recipient_id, created_at) "
        f"SELECT t.id, r.id, now() FROM preferences_topic t, preferences_recipient r WHERE t.key = '{key}' "
        f"AND t.environment_id = {environment} AND r.user_id LIKE '{key}-%' ORDER BY r.id;"
        "ANALYZE preferences_recipient; ANALYZE preferences_subscription",
    )  # the key is ours, no caller's text
    body = {"topic": key, "template": "bench_news", "channels": ["email"], "payload": {"n": 1}}
    log(f"sending to the topic {key}")
    cpu0, t0 = group_cpu(), time.monotonic()
    conn = http.client.HTTPConnection(api.host, api.port, timeout=60)
    status, answer = api.request(conn, "POST", "/api/v1/notifications", body)
    conn.close()
    if status != 202:
        sys.exit(f"the topic send was answered {status}: {answer}")
    of_topic = f"FROM notifier_delivery WHERE notification_id = '{answer['id']}'"
    # OTPs for as long as the topic takes at about 3,000/s, so that they are sent while it drains.
    otp_count = min(args.otps, max(1, int(n / 3000 / args.otp_interval))) if args.otps else 0
    with OtpProbe(api, "bench-otp-user", otp_count, args.otp_interval) as otps:
        deadline = t0 + args.timeout
        while int(psql(DATABASE, f"SELECT count(*) {of_topic} AND status = 'sent'") or 0) < n:
            if time.monotonic() > deadline:
                sys.exit(f"the topic was not sent within {args.timeout:.0f} s")
            time.sleep(0.5)
    cpu1 = group_cpu()
    span = float(
        psql(
            DATABASE,
            "SELECT extract(epoch FROM max(d.sent_at) - n.created_at) FROM notifier_delivery d "
            f"JOIN notifier_notification n ON n.id = d.notification_id WHERE n.id = '{answer['id']}' "
            "GROUP BY n.created_at",
        )
    )
    print(f"topic accept -> sent      {n / span:.0f} deliveries/s ({n} subscribers, the last sent {span:.1f} s after "
          "the accept)")  # fmt: skip
    otps.report("the topic", timeout=args.timeout)
    print(f"CPU seconds while the topic drained (2 cores = {2 * span:.0f}):")
    print_cpu(cpu0, cpu1, n, per="delivery")


if __name__ == "__main__":
    main()
