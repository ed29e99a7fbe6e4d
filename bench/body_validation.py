"""What validating a body costs: the lean run of its serializer (core/lean.py) against DRF's own, per body.

    DEVELOPMENT=true .venv/bin/python bench/body_validation.py [--number 20000] [--repeat 5]

No services: Django's settings only. For a common send (NotificationInput: a recipient, a template, a payload, a
dedup key, two channels) and a common recipient batch item (RecipientBatchItemSerializer: a user id, an e-mail, a
locale, a time zone, a topic), prints the best of --repeat rounds of --number calls, in µs per body, for the lean
validator and for `run_validation` of a reused serializer instance, and checks that both return the same.
"""

from __future__ import annotations

import os
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import parser

SEND = {
    "recipient": {"user_id": "u-123"}, "template": "welcome", "payload": {"name": "Ann", "n": 3},
    "dedup_key": "k-123456", "channels": ["email", "sms"],
}  # fmt: skip
ITEM = {
    "user_id": "u-123",
    "email": "ann@example.com",
    "locale": "de-DE",
    "timezone": "Europe/Berlin",
    "topics": ["news"],
}


def main() -> None:
    """Time both ways of validating each body and print µs per body."""
    args = _args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from core.serializers import thread_serializer
    from notifier.accepting.serializers import NotificationInput, send_input_fast
    from preferences.serializers import RecipientBatchItemSerializer, recipient_item_fast

    cases: list[tuple[str, Any, Any, dict[str, Any]]] = [
        ("send (NotificationInput)", send_input_fast, thread_serializer(NotificationInput), SEND),
        ("recipient item (RecipientBatchItemSerializer)", recipient_item_fast,
         thread_serializer(RecipientBatchItemSerializer), ITEM),
    ]  # fmt: skip
    for name, lean, serializer, body in cases:
        expected = dict(serializer.run_validation(body))
        assert lean(body) == expected, f"{name}: the lean answer differs from DRF's"
        lean_us = _best(lambda: lean(body), args.number, args.repeat)  # noqa: B023
        drf_us = _best(lambda: serializer.run_validation(body), args.number, args.repeat)  # noqa: B023
        print(f"{name}: lean {lean_us:.1f} µs, DRF {drf_us:.1f} µs per body ({drf_us / lean_us:.0f} times)")


def _best(call: Any, number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def _args() -> Any:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--number", type=int, default=20000, help="calls per round")
    p.add_argument("--repeat", type=int, default=5, help="rounds; the best is printed")
    return p.parse_args()


if __name__ == "__main__":
    main()
