"""What the preference link adds to each optional email on the send path, in µs per delivery.

    .venv/bin/python bench/preference_links.py [--n 20000]

No database or broker: signs links for unsaved recipients and personalizes a rendered email, as the send
path (`channels_app.services._build_message`) does for every email of an optional category.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEVELOPMENT", "true")  # a local benchmark: the built-in SECRET_KEY signs as well as any


def main() -> None:
    """Print µs per call of each step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()

    import django

    django.setup()
    from preferences.emails import personalize
    from preferences.models import Recipient
    from preferences.services import preference_link, preference_token_read, unsubscribe_url

    recipients = [Recipient(user_id=f"user-{i:08d}") for i in range(args.n)]
    parts = {"subject": "Spring sale", "text": "Everything -20%\n" * 20, "html": "<p>Everything -20%</p>" * 20}

    def timed(label: str, fn: Callable[[Recipient], T]) -> list[T]:
        started = time.perf_counter()
        out = [fn(r) for r in recipients]
        print(f"{label:<44} {(time.perf_counter() - started) / args.n * 1e6:8.1f} µs")
        return out

    print(f"{args.n} recipients")
    timed("unsubscribe_url (existing, for comparison)", lambda r: unsubscribe_url(recipient=r, category="marketing"))
    links = timed("preference_link (sign)", lambda r: preference_link(recipient=r, ttl_seconds=86400)[0])
    timed(
        "personalize with footer (text + html)",
        lambda r: personalize(
            parts, preferences_url=links[0], unsubscribe_url=links[0], locale="de", footer=True, marker=""
        ),
    )
    tokens = iter([link.rsplit("/", 1)[1] for link in links])
    timed("preference_token_read (page view)", lambda r: preference_token_read(next(tokens)))


if __name__ == "__main__":
    main()
