"""Amazon SES v2 email provider (boto3 `sesv2` SendEmail with Simple content).

The client is built once per worker process (botocore pools connections, keep-alive). botocore's retries
are off (one attempt): the pipeline owns retries, and botocore would otherwise sleep inside the worker on
throttling. `SES_ENDPOINT_URL` points the real SDK at a stand-in (moto's server in tests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from django.conf import settings

from channels_app.providers.base import (
    AccountOptions,
    ConfigurationError,
    OutboundMessage,
    PermanentError,
    Provider,
    ProviderError,
    RetriableError,
    SendResult,
    parse_retry_after,
)

THROTTLE_CODES = {"Throttling", "TooManyRequests", "Throttled", "LimitExceeded", "RequestLimitExceeded"}
RETRIABLE_CODES = {"InternalFailure", "InternalError", "ServiceUnavailable", "RequestTimeout"}
# Our credentials or permissions are wrong: not this message's fault, fixable by an operator.
CREDENTIAL_CODES = {
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "UnrecognizedClient",
    "AccessDenied",
    "AuthorizationError",
}


def aws_client(
    service: str,
    *,
    region: str,
    endpoint_url: str = "",
    access_key_id: str = "",
    secret_access_key: str = "",
    session_token: str = "",
    connect_timeout: float = 3.0,
    read_timeout: float = 10.0,
    pool_size: int = 16,
) -> Any:
    """Build a boto3 client with one attempt per call, bounded timeouts and a connection pool."""
    session = boto3.session.Session(
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        aws_session_token=session_token or None,
        region_name=region,
    )
    config = Config(
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        max_pool_connections=pool_size,
        tcp_keepalive=True,
    )
    return session.client(service, endpoint_url=endpoint_url or None, config=config)


def aws_client_from_settings(service: str, *, region: str, endpoint_url: str) -> Any:
    """Build a boto3 client from the shared AWS_* settings."""
    return aws_client(
        service,
        region=region,
        endpoint_url=endpoint_url,
        access_key_id=settings.AWS_ACCESS_KEY_ID,
        secret_access_key=settings.AWS_SECRET_ACCESS_KEY,
        session_token=settings.AWS_SESSION_TOKEN,
        connect_timeout=settings.AWS_CONNECT_TIMEOUT_SECONDS,
        read_timeout=settings.AWS_READ_TIMEOUT_SECONDS,
        pool_size=settings.PROVIDER_CONCURRENCY,
    )


# What an AWS account (SES or SNS) may set; what it leaves out is the installation's AWS_* setting.
AWS_ACCOUNT_KEYS = ("region", "endpoint_url", "access_key_id", "secret_access_key", "session_token")


def aws_client_from_account(service: str, options: AccountOptions, *, region: str, endpoint_url: str) -> Any:
    """Build a boto3 client from an account's settings, the installation's AWS_* settings for what it leaves out."""
    return aws_client(
        service,
        region=options.text("region", region),
        endpoint_url=options.text("endpoint_url", endpoint_url),
        access_key_id=options.text("access_key_id", settings.AWS_ACCESS_KEY_ID),
        secret_access_key=options.text("secret_access_key", settings.AWS_SECRET_ACCESS_KEY),
        session_token=options.text("session_token", settings.AWS_SESSION_TOKEN),
        connect_timeout=settings.AWS_CONNECT_TIMEOUT_SECONDS,
        read_timeout=settings.AWS_READ_TIMEOUT_SECONDS,
        pool_size=settings.PROVIDER_CONCURRENCY,
    )


def error_code(exc: ClientError) -> str:
    """Return the AWS error code without the "Exception" suffix the JSON protocols add."""
    code = str(exc.response.get("Error", {}).get("Code", "") or "Unknown")
    return code.removesuffix("Exception")


def transport_error(exc: BotoCoreError) -> ProviderError:
    """Sort a botocore transport error: refused before sending, or possibly sent."""
    if isinstance(exc, ConnectTimeoutError | EndpointConnectionError):
        return RetriableError("connection failed", code="connection_error")
    if isinstance(exc, ReadTimeoutError):
        return RetriableError("read timeout", code="read_timeout", maybe_sent=True)
    if isinstance(exc, ConnectionClosedError):
        return RetriableError("connection lost", code="connection_error", maybe_sent=True)
    if isinstance(exc, NoCredentialsError):
        return RetriableError("no AWS credentials found", code="no_credentials")
    return RetriableError(f"AWS client error: {type(exc).__name__}", code="client_error", maybe_sent=True)


def aws_send(
    call: Callable[..., dict[str, Any]], classify: Callable[[ClientError], ProviderError], args: dict[str, Any]
) -> SendResult:
    """Make one AWS send call (SES send_email, SNS publish); sort its errors; return its MessageId."""
    try:
        response = call(**args)
    except ClientError as exc:
        raise classify(exc) from None
    except BotoCoreError as exc:
        raise transport_error(exc) from None
    return SendResult(provider_message_id=str(response["MessageId"]))


def common_classification(exc: ClientError, code: str) -> ProviderError | None:
    """Classify what SES and SNS share: throttling, server errors, credential trouble."""
    meta = exc.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode") or 0)
    headers = {k.lower(): v for k, v in (meta.get("HTTPHeaders") or {}).items()}
    retry_after = parse_retry_after(headers.get("retry-after"))
    text = f"{code} (HTTP {status})"
    if code in THROTTLE_CODES or status == 429:
        return RetriableError(text, code=code, retry_after=retry_after, throttled=True)
    if code in RETRIABLE_CODES or status >= 500:
        return RetriableError(text, code=code, retry_after=retry_after)
    if code in CREDENTIAL_CODES:
        return RetriableError(text, code=code)
    return None


def list_unsubscribe_value(value: str) -> str:
    """Return a List-Unsubscribe header value: each URI in angle brackets."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return ", ".join(p if p.startswith("<") else f"<{p}>" for p in parts)


class SesProvider(Provider):
    """Send email through Amazon SES v2."""

    name: ClassVar[str] = "ses"
    channels: ClassVar[tuple[str, ...]] = ("email",)
    account_keys: ClassVar[tuple[str, ...]] = (*AWS_ACCOUNT_KEYS, "configuration_set", "from_email", "reply_to")

    def __init__(self, *, client: Any, from_email: str, reply_to: str = "", configuration_set: str = "") -> None:
        self.client = client
        self.from_email = from_email
        self.reply_to = reply_to
        self.configuration_set = configuration_set

    @classmethod
    def from_settings(cls) -> SesProvider:
        """Build the provider from EMAIL_*, AWS_* and SES_* settings; name the first missing variable."""
        if not settings.EMAIL_FROM:
            raise ConfigurationError("EMAIL_FROM is not set (the From address of every email)")
        if not settings.SES_REGION:
            raise ConfigurationError("SES_REGION (or AWS_REGION) is not set")
        client = aws_client_from_settings("sesv2", region=settings.SES_REGION, endpoint_url=settings.SES_ENDPOINT_URL)
        return cls(
            client=client,
            from_email=settings.EMAIL_FROM,
            reply_to=settings.EMAIL_REPLY_TO,
            configuration_set=settings.SES_CONFIGURATION_SET,
        )

    @classmethod
    def from_account(cls, options: AccountOptions) -> SesProvider:
        """Build a named account's SES sender: its region, endpoint, credentials, configuration set and From."""
        from_email = options.text("from_email", settings.EMAIL_FROM)
        if not from_email:
            raise ConfigurationError("from_email is not set, nor EMAIL_FROM (the From address of every email)")
        client = aws_client_from_account(
            "sesv2", options, region=settings.SES_REGION, endpoint_url=settings.SES_ENDPOINT_URL
        )
        return cls(
            client=client,
            from_email=from_email,
            reply_to=options.text("reply_to", settings.EMAIL_REPLY_TO),
            configuration_set=options.text("configuration_set", settings.SES_CONFIGURATION_SET),
        )

    def build(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the SendEmail arguments for one message."""
        content = message.content
        body: dict[str, Any] = {}
        if content.get("text"):
            body["Text"] = {"Data": content["text"], "Charset": "UTF-8"}
        if content.get("html"):
            body["Html"] = {"Data": content["html"], "Charset": "UTF-8"}
        simple: dict[str, Any] = {"Subject": {"Data": content.get("subject", ""), "Charset": "UTF-8"}, "Body": body}
        if message.meta.get("list_unsubscribe"):
            simple["Headers"] = [
                {"Name": "List-Unsubscribe", "Value": list_unsubscribe_value(message.meta["list_unsubscribe"])},
                {"Name": "List-Unsubscribe-Post", "Value": "List-Unsubscribe=One-Click"},
            ]
        args: dict[str, Any] = {
            "FromEmailAddress": message.meta.get("from_email") or self.from_email,
            "Destination": {"ToAddresses": [message.address]},
            "Content": {"Simple": simple},
            # Tags come back in SES events, so a bounce can be matched to its delivery without a lookup.
            "EmailTags": [{"Name": "delivery_id", "Value": str(message.delivery_id)}],
        }
        reply_to = message.meta.get("reply_to") or self.reply_to
        if reply_to:
            args["ReplyToAddresses"] = [reply_to]
        if self.configuration_set:
            args["ConfigurationSetName"] = self.configuration_set
        return args

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one email and return SES's MessageId."""
        return aws_send(self.client.send_email, self._classify, self.build(message))

    @staticmethod
    def _classify(exc: ClientError) -> ProviderError:
        code = error_code(exc)
        common = common_classification(exc, code)
        if common is not None:
            return common
        # MessageRejected, MailFromDomainNotVerified, AccountSuspended, SendingPaused, NotFound, BadRequest...
        # (SES's error text can quote the addresses: keep only the code.)
        return PermanentError(f"SES rejected the message ({code})", code=code)
