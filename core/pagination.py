"""The one cursor paginator of the API: a single cursor format, the `cursor` query field and the page body.

Every cursor-paginated list (notifications, dead letters, suppressions, inboxes, event attempts, sandbox
messages) answers `{"results": [...], "next_cursor": "<cursor>" | null}` (the inboxes, which answered `items`
first, carry the same list under both keys) and takes the cursor back in `?cursor=`; an empty `cursor=` is the
first page, as a client's first request naturally sends it. Every list takes `limit`, the page size: 1 to
`PAGE_MAX` (a few older lists allow more), `PAGE_DEFAULT` when left out or empty.

A cursor is the URL-safe base64 of a small JSON object naming the position after which the next page starts
(`{"i": 42}` for lists keyed by id, `{"c": "<created_at>", "i": "<uuid>"}` for notifications).

Cursors handed out before the format was unified stay valid (the API contract does not let a saved cursor break):
a bare id (`"42"`, sandbox messages, inboxes, event attempts) and the base64 of a bare id (suppressions) both
decode to `{"i": 42}`. Anything else is a 400 naming `cursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from core.bodies import json_loads_checked, value_problems
from core.errors import ApiError

INVALID = "Invalid cursor."
PAGE_DEFAULT = 50
PAGE_MAX = 200


def encode_cursor(position: dict[str, Any]) -> str:
    """Return the opaque cursor of a keyset position."""
    return base64.urlsafe_b64encode(json.dumps(position, default=str).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[str, Any]:
    """Return the position a cursor names; raise ValueError if this API did not make it.

    Accepts the two older formats of id-keyed lists (a bare id, and the base64 of one) as `{"i": id}`. A bare
    id cannot be mistaken for base64 JSON: base64 digits decode to bytes above 0xCF, never to `{` or a digit.
    Read as a request body is (core.bodies): `NaN`, `Infinity`, a number past a double's range and text
    PostgreSQL cannot store are in no cursor this API makes, and would reach a selector's int() or a query.
    """
    if cursor.isascii() and cursor.isdigit():
        return {"i": int(cursor)}
    try:
        raw = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode())
        value, to_check = json_loads_checked(raw.decode())
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise ValueError(INVALID) from exc
    if to_check and value_problems(value):
        raise ValueError(INVALID)
    if isinstance(value, int) and not isinstance(value, bool):
        return {"i": value}
    if not isinstance(value, dict):
        raise ValueError(INVALID)
    return value


def invalid_cursor() -> ApiError:
    """Return the 400 for a cursor this API did not make (for selectors that check a cursor's fields)."""
    return ApiError(400, "invalid", INVALID, {"cursor": [INVALID]})


def cursor_id(position: dict[str, Any] | None) -> int | None:
    """Return the id an id-keyed position names (the last one seen), or None for the first page; 400 if not one."""
    if position is None:
        return None
    value = position.get("i")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**63:
        raise invalid_cursor()
    return value


class CursorField(serializers.CharField):
    """The `cursor` query parameter: validated and decoded into its position (None when empty)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_blank", True)
        kwargs.setdefault("max_length", 512)
        kwargs.setdefault("help_text", "The `next_cursor` of the previous page; leave out for the first page.")
        super().__init__(**kwargs)

    def run_validation(self, data: Any = serializers.empty) -> Any:
        # A CharField answers "" for a blank value before to_internal_value runs; blank means the first page,
        # and so does whitespace alone, which the CharField trims to blank.
        if isinstance(data, str) and not data.strip():
            return None
        return super().run_validation(data)

    # An override mypy refuses (hence the ignore): a CharField validates to a str; this field's value is the
    # decoded position.
    def to_internal_value(self, data: Any) -> dict[str, Any] | None:  # type: ignore[override]
        text = super().to_internal_value(data)
        if not text:
            return None
        try:
            return decode_cursor(text)
        except ValueError:
            raise serializers.ValidationError(INVALID) from None


class PageLimitField(serializers.IntegerField):
    """The `limit` query parameter: the page size, `PAGE_DEFAULT` when left out or sent empty."""

    def __init__(self, *, max_value: int = PAGE_MAX, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("default", PAGE_DEFAULT)
        kwargs.setdefault("help_text", f"Items per page, 1 to {max_value} (default {PAGE_DEFAULT}).")
        super().__init__(min_value=1, max_value=max_value, **kwargs)

    def run_validation(self, data: Any = serializers.empty) -> Any:
        # `limit=` is what a client sends when it has no page size in mind: the default, not a 400.
        if data == "":
            data = serializers.empty
        return super().run_validation(data)


class CursorQuerySerializer(serializers.Serializer[Any]):  # input only: it never serializes an instance
    """Query parameters every cursor-paginated list takes: where to start and how many."""

    cursor = CursorField()
    limit = PageLimitField()


@dataclass(frozen=True)
class CursorPage:
    """One page of a list and where the next one starts (a position, a bare id, a cursor, or None at the end)."""

    items: Sequence[Any]
    next: dict[str, Any] | int | str | None
    extra: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        # Fields beside the items and the cursor (an inbox's unread_count) are read from `extra`.
        extra = self.__dict__.get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(name)


class NextCursorField(serializers.CharField):
    """Render where the next page starts as a cursor in the one format (null on the last page)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "Pass as `cursor` to get the next page; null on the last page.")
        super().__init__(read_only=True, allow_null=True, **kwargs)

    def get_attribute(self, instance: CursorPage) -> Any:
        return instance.next

    def to_representation(self, value: dict[str, Any] | int | str) -> str:
        if isinstance(value, str):
            return value  # made by a selector with encode_cursor
        return encode_cursor({"i": value} if isinstance(value, int) else value)


def cursor_page_serializer(
    item: type[serializers.BaseSerializer[Any]],
    *,
    name: str,
    items_key: str = "results",
    **extra: serializers.Field[Any, Any, Any, Any],
) -> type[serializers.Serializer[CursorPage]]:
    """Return the serializer of a page of `item`: `{"results": [...], "next_cursor", **extra}`, for a CursorPage.

    `items_key="items"` names a list that answered `items` before the shape was unified: it answers both keys.
    """
    fields: dict[str, Any] = {"results": item(many=True, source="items")}
    if items_key == "items":
        fields["items"] = item(many=True)
    fields.update({"next_cursor": NextCursorField(), **extra})
    return type(name, (serializers.Serializer,), {**fields, "__doc__": f"A page of {items_key}, keyset-paginated."})
