"""Stand-in SMTP server (aiosmtpd) that captures messages and answers as each test programs it."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class CapturedMail:
    """One message the server accepted."""

    mail_from: str
    rcpt_tos: list[str]
    data: bytes

    @property
    def message(self) -> EmailMessage:
        """Return the message parsed with the modern email policy."""
        return message_from_bytes(self.data, policy=policy.default)


class _Handler:
    def __init__(self, server: SmtpStub) -> None:
        self.server = server

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: list[str]) -> str:
        reply = self.server.rcpt_replies.get(address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.server.data_delay:
            await asyncio.sleep(self.server.data_delay)
        if self.server.data_reply:
            return self.server.data_reply
        self.server.messages.append(CapturedMail(envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 2.0.0 Message accepted for delivery"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SmtpStub:
    """An aiosmtpd server on 127.0.0.1 with a random port.

    `rcpt_replies` maps a recipient to the reply its RCPT gets ("550 5.1.1 User unknown");
    `data_reply` overrides the reply to DATA; `data_delay` holds DATA (a hang past the client's timeout).
    """

    def __init__(self) -> None:
        self.messages: list[CapturedMail] = []
        self.rcpt_replies: dict[str, str] = {}
        self.data_reply: str | None = None
        self.data_delay: float = 0.0
        self.port = free_port()
        self.host = "127.0.0.1"
        self.controller = Controller(_Handler(self), hostname=self.host, port=self.port)

    def start(self) -> SmtpStub:
        """Start serving in aiosmtpd's thread."""
        self.controller.start()
        return self

    def stop(self) -> None:
        """Stop the server."""
        self.controller.stop()

    def reset(self) -> None:
        """Forget captured mail and programmed replies."""
        self.messages.clear()
        self.rcpt_replies.clear()
        self.data_reply = None
        self.data_delay = 0.0
