"""Campaigns: a marketer's send of a template to a topic, scheduled by django-celery-beat, at a capped rate."""

from __future__ import annotations
