"""Amazon SNS SMS provider (boto3 `sns` Publish to a phone number), the second SMS provider.

Built like the SES provider: one client per worker process, one attempt per call, `SNS_ENDPOINT_URL` for a
stand-in. SNS has no batch API for SMS, so the base class's bounded thread pool sends batches.
"""

from __future__ import annotations

from typing import Any, ClassVar

from botocore.exceptions import ClientError
from django.conf import settings

from channels_app.providers.base import (
    AccountOptions,
    ConfigurationError,
    OutboundMessage,
    PermanentError,
    Provider,
    ProviderError,
    SendResult,
)
from channels_app.providers.ses import (
    AWS_ACCOUNT_KEYS,
    aws_client_from_account,
    aws_client_from_settings,
    aws_send,
    common_classification,
    error_code,
)

OPTED_OUT_CODES = {"OptedOut", "OptedOutException"}


class SnsProvider(Provider):
    """Send SMS through Amazon SNS."""

    name: ClassVar[str] = "sns"
    channels: ClassVar[tuple[str, ...]] = ("sms",)
    account_keys: ClassVar[tuple[str, ...]] = (*AWS_ACCOUNT_KEYS, "sms_type", "sender_id", "origination_number")

    def __init__(
        self, *, client: Any, sms_type: str = "Transactional", sender_id: str = "", origination_number: str = ""
    ) -> None:
        self.client = client
        self.sms_type = sms_type
        self.sender_id = sender_id
        self.origination_number = origination_number

    @classmethod
    def from_settings(cls) -> SnsProvider:
        """Build the provider from AWS_* and SNS_* settings; name the first missing or wrong variable."""
        if not settings.SNS_REGION:
            raise ConfigurationError("SNS_REGION (or AWS_REGION) is not set")
        if settings.SNS_SMS_TYPE not in ("Transactional", "Promotional"):
            raise ConfigurationError("SNS_SMS_TYPE must be Transactional or Promotional")
        client = aws_client_from_settings("sns", region=settings.SNS_REGION, endpoint_url=settings.SNS_ENDPOINT_URL)
        return cls(
            client=client,
            sms_type=settings.SNS_SMS_TYPE,
            sender_id=settings.SNS_SENDER_ID,
            origination_number=settings.SNS_ORIGINATION_NUMBER,
        )

    @classmethod
    def from_account(cls, options: AccountOptions) -> SnsProvider:
        """Build a named account's SNS sender: its region, endpoint, credentials, SMS type and sender."""
        sms_type = options.text("sms_type", settings.SNS_SMS_TYPE)
        if sms_type not in ("Transactional", "Promotional"):
            raise ConfigurationError("sms_type must be Transactional or Promotional")
        client = aws_client_from_account(
            "sns", options, region=settings.SNS_REGION, endpoint_url=settings.SNS_ENDPOINT_URL
        )
        return cls(
            client=client,
            sms_type=sms_type,
            sender_id=options.text("sender_id"),
            origination_number=options.text("origination_number"),
        )

    def build(self, message: OutboundMessage) -> dict[str, Any]:
        """Return the Publish arguments for one SMS.

        A project's SMS sender (meta `sms_from`) replaces the configured one: a number (+E.164) as the
        origination number, anything else as the alphanumeric sender id.
        """
        sms_type = self.sms_type if message.category != "marketing" else "Promotional"
        attributes: dict[str, Any] = {"AWS.SNS.SMS.SMSType": {"DataType": "String", "StringValue": sms_type}}
        sender_id, origination_number = self.sender_id, self.origination_number
        sender = message.meta.get("sms_from")
        if sender:
            if sender.startswith("+"):
                sender_id, origination_number = "", sender
            else:
                sender_id, origination_number = sender, ""
        if sender_id:
            attributes["AWS.SNS.SMS.SenderID"] = {"DataType": "String", "StringValue": sender_id}
        if origination_number:
            attributes["AWS.MM.SMS.OriginationNumber"] = {"DataType": "String", "StringValue": origination_number}
        return {
            "PhoneNumber": message.address,
            "Message": message.content.get("text", ""),
            "MessageAttributes": attributes,
        }

    def send(self, message: OutboundMessage) -> SendResult:
        """Publish one SMS and return SNS's MessageId."""
        return aws_send(self.client.publish, self._classify, self.build(message))

    @staticmethod
    def _classify(exc: ClientError) -> ProviderError:
        code = error_code(exc)
        common = common_classification(exc, code)
        if common is not None:
            return common
        detail = str(exc.response.get("Error", {}).get("Message", "")).lower()
        if code in OPTED_OUT_CODES or "opted out" in detail:
            return PermanentError(f"SNS: number opted out ({code})", code=code, suppress=True)
        if code in ("InvalidParameter", "InvalidParameterValue") and "phonenumber" in detail.replace(" ", ""):
            # The number itself is malformed or unusable: suppress it like a hard bounce.
            return PermanentError(f"SNS: invalid phone number ({code})", code=code, suppress=True)
        return PermanentError(f"SNS rejected the message ({code})", code=code)
