"""Workflows: versioned, durable multi-step notifications (send, delay, digest, throttle, conditions) per recipient."""

from __future__ import annotations
