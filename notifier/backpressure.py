"""Shed low-priority load at the API while the low-priority backlog is too deep.

High-priority requests always pass: shedding exists so that a flood of marketing never slows an OTP.
"""

from __future__ import annotations


def check_backpressure(*, category: str, priority: str | None) -> None:
    """Raise a 429 ApiError for a low-priority request while the backlog is over its limit."""
    return None
