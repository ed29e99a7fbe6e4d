"""The in-app inbox: in-app deliveries listed per recipient, marked read (which moves them to `opened`)."""

from __future__ import annotations
