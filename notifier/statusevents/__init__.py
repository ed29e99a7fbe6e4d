"""Status events to the calling service: its event endpoint (API, writes); the sender is channels_app.statusevents."""

from __future__ import annotations
