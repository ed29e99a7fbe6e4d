"""Standard Webhooks signing secrets ("whsec_<base64>"): their format, shared by the webhook adapter
(channels_app.providers.webhook), which signs with them, and the admin of event endpoints, which checks them.
"""

from __future__ import annotations

import base64

SECRET_PREFIX = "whsec_"


def decode_secret(secret: str) -> bytes:
    """Return the raw key of a "whsec_<base64>" secret (a bare base64 string is accepted too); ValueError if not."""
    raw = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    return base64.b64decode(raw, validate=True)
