"""Local stand-in servers for the real provider SDKs (FCM, Twilio, webhook receivers, SMTP, SES/SNS)."""

from __future__ import annotations
