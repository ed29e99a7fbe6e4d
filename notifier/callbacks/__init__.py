"""Provider status callbacks (Amazon SES over SNS, Twilio): verified, then applied to deliveries."""

from __future__ import annotations
