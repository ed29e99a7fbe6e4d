"""Phone numbers checked against the numbering plans (`phonenumbers`), not a pattern, and stored in E.164."""

from __future__ import annotations

import functools

import phonenumbers

# Distinct numbers whose outcome a process remembers: a batch sent again (a client's retry, a nightly sync of
# the same recipients) is not parsed again. Only texts as long as a recipient's phone may be (32): about 250
# bytes each, 2 MB in all.
PHONE_CACHE_SIZE = 8192
_CACHED_LENGTH = 32


class InvalidPhoneNumber(ValueError):
    """The text is not a valid international phone number."""


def _judged(text: str) -> tuple[str, str | None]:
    """Return the E.164 form of stripped `text` and None, or `text` and why it is refused.

    A pure function of the text (the numbering plans are the installed library's), so its outcome is cached.
    """
    if not text.startswith("+"):
        return text, "Must be an international number starting with + and the country code."
    try:
        number = phonenumbers.parse(text, None)
    except phonenumbers.NumberParseException:
        return text, "Not a phone number."
    if not phonenumbers.is_valid_number(number):
        return text, "Not a valid number in its country's numbering plan."
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164), None


_judged_cached = functools.lru_cache(maxsize=PHONE_CACHE_SIZE)(_judged)


def phone_normalize(value: str) -> str:
    """Return `value` as an E.164 number ("+4915112345678"); raise InvalidPhoneNumber with the reason.

    Separators are accepted ("+44 20 7946 0958"); the number must be international (leading "+") and valid in
    its country's numbering plan, so +99912345678 (no such country code) and +10000000000 (no such area) fail.
    """
    text = value.strip()
    number, reason = _judged_cached(text) if len(text) <= _CACHED_LENGTH else _judged(text)
    if reason is not None:
        raise InvalidPhoneNumber(reason)
    return number
