"""Workflows at topic scale: runs created per second by the fan-out, and the wake rate of a delay step.

    .venv/bin/python bench/workflows.py [--subscribers 100000] [--workers 2] [--keep]

A workflow of two steps (a delay, then a throttle: the run proceeds past the wait and does real work) is
triggered for a topic. Printed:

- runs created per second: from accept until the fan-out has written one run per subscriber (pages of
  FANOUT_PAGE_SIZE, one INSERT each), against the fan-out's target of 5,000/s;
- runs advanced to their wait per second (the first advance messages, WORKFLOW_ADVANCE_BATCH ids each);
- the wake rate: once every run's delay is due, how fast the wake relay (called here as beat would) and the
  workers take every run through the wait and the next step, and how the advance messages were shared
  between the worker processes (a large wake-up must not pile up on one);
- the empty-Celery-task rate on the same broker in the same run (the floor).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Worker, cleanup, empty_task_rate, log, make_topic, parser, prepare, workers

DELAY_SECONDS = 1


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--subscribers", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2, help="worker processes on the fanout queue (1 process each)")
    args = p.parse_args()
    prepare()
    try:
        run(args.subscribers, args.workers, args.timeout)
    finally:
        cleanup(args.keep)


def run(subscribers: int, count: int, timeout: float) -> None:
    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Notification
    from notifier.workflows.models import WorkflowRun
    from notifier.workflows.services import runs_wake, workflow_put, workflow_trigger

    noop = empty_task_rate()
    log(f"empty task: publish {noop['publish_per_s']:.0f}/s, publish+consume {noop['end_to_end_per_s']:.0f}/s")
    make_topic("watchers", subscribers)
    client = api_client_create(name="bench-workflows", scopes=["send", "topics", "templates"])[0]
    workflow_put(key="bench_wait", category="transactional", steps=[
        {"id": "wait", "type": "delay", "seconds": DELAY_SECONDS},
        {"id": "cap", "type": "throttle", "max": 1000, "per_seconds": 3600},
    ])  # fmt: skip
    started = [
        # Each worker's "succeeded" lines count its advance messages.
        Worker(
            f"wf-{i}",
            ["fanout"],
            concurrency=1,
            FANOUT_LANES="2",
            WORKFLOW_ADVANCE_BATCH="200",
            CELERY_TASK_LOGS="true",
        )
        for i in range(count)
    ]
    with workers(*started):
        t0 = time.monotonic()
        data = {"topic": "watchers", "workflow": "bench_wait", "payload": {"n": 1}}
        notification = workflow_trigger(client=client, data=data).notification
        runs = WorkflowRun.objects.filter(notification_id=notification.pk)
        created_s = _wait(lambda: Notification.objects.get(pk=notification.pk).status == "done", t0, timeout)
        created = runs.count()
        waiting_s = _wait(lambda: not runs.filter(status="running").exists(), t0, timeout)
        waiting = runs.filter(status="waiting").count()
        time.sleep(DELAY_SECONDS + 0.5)  # every delay is due now
        before = [_advances(w) for w in started]
        t1 = time.monotonic()
        while runs.filter(status__in=["running", "waiting"]).exists() and time.monotonic() - t1 < timeout:
            runs_wake()  # what beat does every WORKFLOW_WAKE_INTERVAL_SECONDS
            time.sleep(0.5)
        woken_s = time.monotonic() - t1
        done = runs.filter(status="done").count()
        shares = [_advances(w) - b for w, b in zip(started, before, strict=True)]
    print("\n=== bench/workflows.py ===")
    print(f"topic subscribers            {subscribers}   (workers {count} x 1 process)")
    rate = created / created_s
    print(f"runs created                 {created} in {created_s:.1f} s   ({rate:.0f} runs/s; target >= 5000)")
    print(f"runs advanced to the delay   {waiting} after {waiting_s:.1f} s   ({waiting / waiting_s:.0f} runs/s)")
    print(f"wake: due -> done            {done} in {woken_s:.1f} s   ({done / woken_s:.0f} runs/s)")
    print(f"advance messages per worker  {shares}   (each {200} run ids at most)")
    print(
        f"empty Celery task            publish {noop['publish_per_s']:.0f}/s, publish+consume "
        f"{noop['end_to_end_per_s']:.0f}/s"
    )
    print(f"runs created vs empty task   {created / created_s / noop['end_to_end_per_s']:.1f}x")


def _wait(predicate: object, t0: float, timeout: float) -> float:
    while time.monotonic() - t0 < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(0.2)
    raise TimeoutError("bench timed out")


def _advances(worker: Worker) -> int:
    return len(re.findall(r"workflows\.advance\[[^\]]+\] succeeded", worker.log_path.read_text()))


if __name__ == "__main__":
    main()
