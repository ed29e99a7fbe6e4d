"""Phone numbers checked against the numbering plans (`phonenumbers`), not a pattern, and stored in E.164."""

from __future__ import annotations

import phonenumbers


class InvalidPhoneNumber(ValueError):
    """The text is not a valid international phone number."""


def phone_normalize(value: str) -> str:
    """Return `value` as an E.164 number ("+4915112345678"); raise InvalidPhoneNumber with the reason.

    Separators are accepted ("+44 20 7946 0958"); the number must be international (leading "+") and valid in
    its country's numbering plan, so +99912345678 (no such country code) and +10000000000 (no such area) fail.
    """
    text = value.strip()
    if not text.startswith("+"):
        raise InvalidPhoneNumber("Must be an international number starting with + and the country code.")
    try:
        number = phonenumbers.parse(text, None)
    except phonenumbers.NumberParseException:
        raise InvalidPhoneNumber("Not a phone number.") from None
    if not phonenumbers.is_valid_number(number):
        raise InvalidPhoneNumber("Not a valid number in its country's numbering plan.")
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
