"""Operations on top of the apps: health and readiness, scrape-time metric collectors, the operators'

dashboard and retention. May import any app; no app imports it."""

from __future__ import annotations
