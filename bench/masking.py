"""Log masking time per field against the field's length: it must grow linearly, then stay flat (bounded input).

    .venv/bin/python bench/masking.py

Prints, for runs of characters that defeated the old email pattern (quadratic: 3.3 s for 40,000 characters),
the time `mask_text` takes for 10k, 40k and 400k characters.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from core.logs import mask_text


def main() -> None:
    """Print the time of mask_text per input shape and length."""
    for name, unit in (("letters", "a"), ("letters+digits", "a1"), ("dots", "a."), ("at-signs", "a@")):
        for length in (10_000, 40_000, 400_000):
            text = unit * (length // len(unit))
            start = time.perf_counter()
            mask_text(text)
            print(f"{name:16} {length:>8} chars  {1000 * (time.perf_counter() - start):8.2f} ms")


if __name__ == "__main__":
    main()
