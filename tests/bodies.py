"""Generated request bodies for the tests that hold a lean validator to its serializer (core/lean.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any


def mixed_bodies(
    seed: int, values: dict[str, list[Any]], count: int, *, valid: float, present: float,
    required: dict[str, Any], rare: frozenset[str] = frozenset(),
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Yield `count` bodies, each field present with chance `present` (a tenth of it for `rare` ones).

    A field present takes its first (valid) value with chance `valid`, else any of its values, so most bodies mix
    valid and invalid fields; four bodies in five get the `required` fields' values where they lack them.
    """
    rng = random.Random(seed)
    for _ in range(count):
        body = {
            name: options[0] if rng.random() < valid else rng.choice(options)
            for name, options in values.items()
            if rng.random() < (present / 4 if name in rare else present)
        }
        if rng.random() < 0.8:
            for name, value in required.items():
                body.setdefault(name, value)
        yield body
