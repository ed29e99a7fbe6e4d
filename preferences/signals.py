"""Signals of the preferences app: what other apps may react to without preferences importing them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent inside recipient_erase's transaction, with `recipient` (already wiped) and `at` (the erasure time). Each
# app that keeps personal data of the recipient forgets it in its receiver (notifier: delivery addresses and
# content; channels_app: the sandbox's record); an error rolls the whole erasure back.
recipient_erased = Signal()
