"""Dead letters: list, replay and discard deliveries that exhausted their attempts."""

from __future__ import annotations
