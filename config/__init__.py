"""Project configuration: settings, the Celery app, URLs and the WSGI entry point."""

from __future__ import annotations

from config.celery import app as celery_app

__all__ = ["celery_app"]
