"""Fair shares at the seed's scale: a broadcast to millions drains while another project's singles and OTPs go.

    BENCH_NS=me .venv/bin/python bench/fair_scale.py [--recipients 1000000] [--window 90] [--rate 1000]

The stack of bench/fair_shares.py (the API under gunicorn, the low and fan-out workers as the Procfile runs them,
the in-app provider limited to --rate a second) plus a worker for the high queues. Project A's topic of
--recipients subscribers is made with set-based SQL (its time is printed); then A sends one `social` in-app
notification to it, and for --window seconds, while it drains, project B sends its `social` singles one at a
time (the next once the last is sent, at most one a second) and an OTP (`security`, high priority) every
--otp-interval seconds. Printed:

- the broadcast's accept (the POST's time) and its first delivery sent, from the accept;
- B's singles and the OTPs, accept -> sent (the delivery's sent_at minus its notification's created_at), p50/p99;
- A's deliveries sent in the window and their rate (the provider's limit less B's share), and how many
  deliveries exist (the rest of the topic waits in PostgreSQL as subscribers not yet paged);
- the fan-out worker's RSS sampled every half second (start, peak, end): flat memory is a peak that does not
  grow with the topic;
- then the broadcast cancelled over the API (`POST /notifications/{id}/cancel`): deliveries cancelled, and none
  sent after the answer but those already claimed.

A 10,000,000-recipient topic takes some minutes to make and about 3 GB of disk; the drain itself is not waited
for (10,000 s at 1,000/s): the window shows the rate, the bound and the memory, which do not change with the
part of the topic left.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ApiServer, Worker, cleanup, log, parser, percentile, prepare, wait_until, workers
from bench.fair_shares import Project, line, singles

OTP = {"en": {"inapp": {"title": "Code", "body": "Your code is {{ code }}"}}}


def otps(project: Project, url: str, interval: float, stop: threading.Event) -> list[str]:
    """Send an OTP every `interval` seconds until stopped; return their notification ids."""
    ids = []
    while not stop.is_set():
        started = time.monotonic()
        body = {"recipient": {"user_id": f"{project.slug}-single"}, "template": "otp", "category": "security"}
        ids.append(project.send(url, {**body, "payload": {"code": "123456"}}))
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    return ids


def latencies(ids: list[str]) -> list[float]:
    """Return accept -> sent in ms of each notification's delivery, waiting up to a minute for the last."""
    from notifier.deliveries.models import Delivery

    rows = Delivery.objects.filter(notification_id__in=ids, status="sent")
    wait_until(lambda: rows.count() >= len(ids), timeout=60, interval=0.2, what="every OTP sent")
    pairs = rows.values_list("notification__created_at", "sent_at")
    return [(sent - created).total_seconds() * 1000 for created, sent in pairs if sent is not None]


def cancel(project: Project, url: str, nid: str) -> int:
    """Cancel a notification over the API; return the deliveries it cancelled."""
    request = urllib.request.Request(
        f"{url}/api/v1/notifications/{nid}/cancel", method="POST", headers={"Authorization": f"Bearer {project.key}"}
    )
    return int(json.loads(urllib.request.urlopen(request, timeout=60).read())["cancelled"])


def run(recipients: int, window: float, otp_interval: float) -> list[str]:
    """Run the scenario and return the lines to print."""
    from notifier.deliveries.models import Delivery
    from preferences.models import Recipient
    from projects.scoping import owner_scope
    from templates_app.services import template_put

    a, b = Project("proj-a"), Project("proj-b")
    with owner_scope(b.environment_id):
        Recipient.objects.create(user_id="proj-b-single")
        template_put(key="otp", category="security", default_locale="en", content=OTP)
    started = time.monotonic()
    a.topic("a-huge", recipients)
    made = time.monotonic() - started
    log(f"topic of {recipients:,} made in {made:.0f} s")

    server = ApiServer()
    low = Worker("scale-low", ["push.low", "email.low", "sms.low", "inapp.low", "webhook.low"], concurrency=2)
    high = Worker("scale-high", ["push.high", "email.high", "sms.high", "inapp.high", "webhook.high"], concurrency=1)
    fan = Worker("scale-fanout", ["fanout"], concurrency=2)
    out = [f"topic of {recipients:,} subscribers made in {made:.0f} s (set-based SQL)"]
    try:
        server.wait_ready()
        with workers(low, high, fan):
            samples: list[int] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    samples.append(fan.rss_bytes())
                    stop.wait(0.5)

            threading.Thread(target=sample, daemon=True).start()
            # Warm the workers as a running deployment's are (a first task opens connections, loads templates): one
            # OTP and one single of B before the clock starts.
            latencies([b.send(server.url, {"recipient": {"user_id": "proj-b-single"}, "template": "otp",
                                           "category": "security", "payload": {"code": "0"}})])  # fmt: skip
            singles(b, server.url, 1)
            t0 = time.monotonic()
            nid = a.send(server.url, {"topic": "a-huge"})
            accepted = time.monotonic() - t0
            sent = Delivery.objects.filter(notification_id=nid, status="sent")
            first = wait_until(sent.exists, timeout=120, interval=0.05, what="the first delivery sent")
            log(f"accepted in {accepted * 1000:.0f} ms, first delivery sent {first:.1f} s after")
            otp_ids: list[str] = []
            otp_thread = threading.Thread(target=lambda: otp_ids.extend(otps(b, server.url, otp_interval, stop)))
            window_start, sent_before = time.monotonic(), sent.count()
            otp_thread.start()
            during: list[float] = []
            while time.monotonic() - window_start < window:
                during += singles(b, server.url, 1)
            stop.set()
            otp_thread.join()
            elapsed, drained = time.monotonic() - window_start, sent.count() - sent_before
            created = Delivery.objects.filter(notification_id=nid).count()
            otp_ms = latencies(otp_ids)
            answered = time.monotonic()
            cancelled = cancel(a, server.url, nid)
            after_cancel, at_answer = time.monotonic() - answered, sent.count()
            time.sleep(5)
            sent_total = sent.count()
            late = sent_total - at_answer
    finally:
        server.stop()
    mb = [s / 2**20 for s in samples if s]
    out += [
        f"A's broadcast accepted in {accepted * 1000:.0f} ms; its first delivery sent {first:.1f} s after the accept",
        line("B's singles while A drains   ", during),
        line("OTPs while A drains          ", otp_ms),
        f"OTP p99 {percentile(otp_ms, 99):.0f} ms (target < 250)",
        f"A's deliveries sent in the {elapsed:.0f} s window: {drained:,} ({drained / elapsed:.0f}/s); "
        f"deliveries that exist: {created:,} of {recipients:,} (the rest wait as subscribers not yet paged)",
        f"fan-out worker RSS (MiB): start {mb[0]:.0f}, peak {max(mb):.0f}, end {mb[-1]:.0f}",
        f"cancel: {cancelled:,} deliveries cancelled (answered in {after_cancel * 1000:.0f} ms); sent in all "
        f"{sent_total:,}, {late} more in the 5 s after the answer",
    ]
    return out


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--recipients", type=int, default=1_000_000)
    p.add_argument("--window", type=float, default=90, help="seconds of B's singles and OTPs while A drains")
    p.add_argument("--otp-interval", type=float, default=0.5)
    p.add_argument("--rate", type=int, default=1000)
    args = p.parse_args()
    # Every process (API, workers) reads the provider's limit from the environment.
    os.environ["PROVIDER_RATE_LIMITS"] = json.dumps({"inapp": {"rate": args.rate, "burst": args.rate}})
    prepare()
    try:
        lines = run(args.recipients, args.window, args.otp_interval)
    finally:
        cleanup(args.keep)
    print("\n=== bench/fair_scale.py ===")
    print(f"in-app provider limited to {args.rate}/s")
    for text in lines:
        print(text)


if __name__ == "__main__":
    main()
