"""Skew this process's clock by NOTIFIER_TEST_CLOCK_SKEW seconds (tests only: put this folder on PYTHONPATH).

Patches `time.time` and Django's `timezone.now`, the clocks our code reads, before anything else is imported:
a worker started this way believes it is that many seconds ahead of the database and the broker.
"""

from __future__ import annotations

import os

_SKEW = float(os.environ.get("NOTIFIER_TEST_CLOCK_SKEW") or 0)

if _SKEW:
    import datetime
    import time

    from django.utils import timezone

    _real_time = time.time

    def _skewed_time() -> float:
        return _real_time() + _SKEW

    _real_now = timezone.now

    def _skewed_now() -> datetime.datetime:
        return _real_now() + datetime.timedelta(seconds=_SKEW)

    time.time = _skewed_time
    timezone.now = _skewed_now
