"""Provider credentials and endpoints, one documented group of environment variables per provider."""

from __future__ import annotations
