"""Operations settings: logging, metrics, tracing, health and retention."""

from __future__ import annotations
