"""SMTP email provider (Django's SMTP backend and EmailMultiAlternatives).

A worker process keeps a small pool of open SMTP connections (one message at a time on each) and reuses
them across messages; a connection idle for a while is checked with NOOP first, because servers drop idle
clients. Reply codes decide the outcome: 4xx retriable, 5xx permanent, and 550/551/553 on the recipient
also suppress the address (mailbox unknown, hard bounce).
"""

from __future__ import annotations

import queue
import re
import smtplib
import time
from email.utils import make_msgid, parseaddr
from typing import ClassVar

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.core.mail.backends.smtp import EmailBackend

from channels_app.providers.base import (
    AccountOptions,
    ConfigurationError,
    OutboundMessage,
    PermanentError,
    Provider,
    ProviderError,
    RetriableError,
    SendResult,
)
from channels_app.providers.ses import list_unsubscribe_value

# Replies to RCPT that say the mailbox does not exist or may not receive mail: a hard bounce.
SUPPRESS_RCPT_CODES = {550, 551, 553}
_ENHANCED = re.compile(rb"^\s*([245]\.\d{1,3}\.\d{1,3})")


def _enhanced_status(reply: bytes | str) -> str:
    """Return the enhanced status code (5.1.1) of a server reply; the rest may quote the address."""
    raw = reply.encode() if isinstance(reply, str) else reply
    match = _ENHANCED.match(raw or b"")
    return match.group(1).decode() if match else ""


def _reply_error(code: int, reply: bytes | str, *, stage: str, recipient: bool = False) -> ProviderError:
    enhanced = _enhanced_status(reply)
    label = f"smtp_{code}"
    text = f"{stage} refused ({code}{' ' + enhanced if enhanced else ''})"
    if 400 <= code < 500:
        return RetriableError(text, code=label)
    return PermanentError(text, code=label, suppress=recipient and code in SUPPRESS_RCPT_CODES)


class _Connection:
    """One pooled SMTP backend and when it was last used."""

    def __init__(self, backend: EmailBackend) -> None:
        self.backend = backend
        self.last_used = 0.0


class SmtpProvider(Provider):
    """Send email over SMTP."""

    name: ClassVar[str] = "smtp"
    channels: ClassVar[tuple[str, ...]] = ("email",)
    account_keys: ClassVar[tuple[str, ...]] = (
        "host",
        "port",
        "username",
        "password",
        "use_tls",
        "use_ssl",
        "timeout_seconds",
        "pool_size",
        "from_email",
        "reply_to",
    )

    def __init__(
        self,
        *,
        host: str,
        port: int,
        from_email: str,
        username: str = "",
        password: str = "",
        use_tls: bool = False,
        use_ssl: bool = False,
        timeout: float = 10.0,
        reply_to: str = "",
        pool_size: int = 4,
        idle_check_seconds: float = 15.0,
    ) -> None:
        if use_tls and use_ssl:
            raise ConfigurationError("SMTP_USE_TLS and SMTP_USE_SSL are mutually exclusive")
        self.from_email = from_email
        self.reply_to = reply_to
        self.idle_check_seconds = idle_check_seconds
        self.max_concurrency = pool_size
        self._pool: queue.LifoQueue[_Connection] = queue.LifoQueue()
        for _ in range(pool_size):
            backend = EmailBackend(
                host=host,
                port=port,
                username=username or None,
                password=password or None,
                use_tls=use_tls,
                use_ssl=use_ssl,
                timeout=timeout,
                fail_silently=False,
            )
            self._pool.put(_Connection(backend))

    @classmethod
    def from_settings(cls) -> SmtpProvider:
        """Build the provider from SMTP_* and EMAIL_* settings; name the first missing variable."""
        if not settings.SMTP_HOST:
            raise ConfigurationError("SMTP_HOST is not set")
        if not settings.EMAIL_FROM:
            raise ConfigurationError("EMAIL_FROM is not set (the From address of every email)")
        return cls(
            host=settings.SMTP_HOST,
            port=settings.SMTP_PORT,
            from_email=settings.EMAIL_FROM,
            username=settings.SMTP_USERNAME,
            password=settings.SMTP_PASSWORD,
            use_tls=settings.SMTP_USE_TLS,
            use_ssl=settings.SMTP_USE_SSL,
            timeout=settings.SMTP_TIMEOUT_SECONDS,
            reply_to=settings.EMAIL_REPLY_TO,
            pool_size=settings.SMTP_POOL_SIZE,
            idle_check_seconds=settings.SMTP_IDLE_CHECK_SECONDS,
        )

    @classmethod
    def from_account(cls, options: AccountOptions) -> SmtpProvider:
        """Build a named account's SMTP sender: its server and login, the installation's From unless it sets one."""
        host = options.text("host")
        if not host:
            raise ConfigurationError("host is not set")
        from_email = options.text("from_email", settings.EMAIL_FROM)
        if not from_email:
            raise ConfigurationError("from_email is not set, nor EMAIL_FROM (the From address of every email)")
        return cls(
            host=host,
            port=int(options.number("port", 587)),
            from_email=from_email,
            username=options.text("username"),
            password=options.text("password"),
            use_tls=options.flag("use_tls"),
            use_ssl=options.flag("use_ssl"),
            timeout=options.number("timeout_seconds", settings.SMTP_TIMEOUT_SECONDS),
            reply_to=options.text("reply_to", settings.EMAIL_REPLY_TO),
            pool_size=max(1, int(options.number("pool_size", settings.SMTP_POOL_SIZE))),
            idle_check_seconds=settings.SMTP_IDLE_CHECK_SECONDS,
        )

    def close(self) -> None:
        """Close every pooled connection."""
        while True:
            try:
                conn = self._pool.get_nowait()
            except queue.Empty:
                return
            self._drop(conn)

    def build(self, message: OutboundMessage, backend: EmailBackend | None = None) -> EmailMultiAlternatives:
        """Build the email for one message (multipart/alternative when there is HTML)."""
        content = message.content
        from_email = message.meta.get("from_email") or self.from_email
        domain = parseaddr(from_email)[1].rpartition("@")[2] or "localhost"
        # Our own Message-ID: it is the provider message id, and Django's default would look up the FQDN.
        headers = {"Message-ID": make_msgid(domain=domain)}
        if message.meta.get("list_unsubscribe"):
            headers["List-Unsubscribe"] = list_unsubscribe_value(message.meta["list_unsubscribe"])
            headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        reply_to = message.meta.get("reply_to") or self.reply_to
        email = EmailMultiAlternatives(
            subject=content.get("subject", ""),
            body=content.get("text", ""),
            from_email=from_email,
            to=[message.address],
            reply_to=[reply_to] if reply_to else None,
            headers=headers,
            connection=backend,
        )
        if content.get("html"):
            email.attach_alternative(content["html"], "text/html")
        return email

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one email over a pooled connection; return its Message-ID."""
        conn = self._pool.get()
        try:
            email = self.build(message, conn.backend)
            self._connect(conn)
            self._deliver(conn, email)
            return SendResult(provider_message_id=email.extra_headers["Message-ID"])
        finally:
            conn.last_used = time.monotonic()
            self._pool.put(conn)

    def _connect(self, conn: _Connection) -> None:
        """Make sure `conn` holds a live connection; nothing has been sent if this fails."""
        backend = conn.backend
        if backend.connection is not None and time.monotonic() - conn.last_used > self.idle_check_seconds:
            try:
                alive = backend.connection.noop()[0] == 250
            except (smtplib.SMTPException, OSError):
                alive = False
            if not alive:
                self._drop(conn)
        try:
            backend.open()
        except smtplib.SMTPAuthenticationError as exc:
            self._drop(conn)
            raise RetriableError(f"SMTP authentication failed ({exc.smtp_code})", code="smtp_auth") from None
        except smtplib.SMTPResponseException as exc:
            self._drop(conn)
            raise RetriableError(
                f"SMTP server refused the session ({exc.smtp_code})", code=f"smtp_{exc.smtp_code}"
            ) from None
        except (smtplib.SMTPException, OSError) as exc:
            self._drop(conn)
            raise RetriableError(
                f"cannot connect to the SMTP server ({type(exc).__name__})", code="connection_error"
            ) from None

    def _deliver(self, conn: _Connection, email: EmailMultiAlternatives) -> None:
        try:
            conn.backend.send_messages([email])
        except smtplib.SMTPRecipientsRefused as exc:
            code, reply = next(iter(exc.recipients.values()))
            raise _reply_error(code, reply, stage="recipient", recipient=True) from None
        except smtplib.SMTPSenderRefused as exc:
            raise _reply_error(exc.smtp_code, exc.smtp_error, stage="sender") from None
        except smtplib.SMTPDataError as exc:
            raise _reply_error(exc.smtp_code, exc.smtp_error, stage="message") from None
        except smtplib.SMTPServerDisconnected:
            self._drop(conn)
            # The server may have dropped us after accepting the message.
            raise RetriableError("SMTP server disconnected", code="disconnected", maybe_sent=True) from None
        except smtplib.SMTPResponseException as exc:
            self._drop(conn)
            raise _reply_error(exc.smtp_code, exc.smtp_error, stage="server") from None
        except (smtplib.SMTPException, OSError) as exc:
            # Timeouts and resets mid-transaction: the server may have the message.
            self._drop(conn)
            raise RetriableError(
                f"SMTP transport error ({type(exc).__name__})", code="transport_error", maybe_sent=True
            ) from None

    @staticmethod
    def _drop(conn: _Connection) -> None:
        """Forget the connection without waiting on a server that may be gone."""
        backend = conn.backend
        if backend.connection is not None:
            try:
                backend.connection.close()
            except OSError:
                pass
            backend.connection = None
