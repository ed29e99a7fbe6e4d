"""Signals of the preferences app: what other apps may react to without preferences importing them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent inside recipient_erase's transaction, with `recipient` (already wiped), `at` (the erasure time) and
# `user_id` (the caller's id it had, now replaced by a stand-in). Each app that keeps personal data of the
# recipient forgets it in its receiver (notifier: payloads, user_ids, delivery addresses and content, click
# URLs, status events, the archive, workflow runs and digests; channels_app: the sandbox's record); an error
# rolls the whole erasure back.
recipient_erased = Signal()
