"""Serializer helpers of every app: instances reused by a thread, and the free-form JSON object field.

DRF builds a serializer's fields anew for every instance, hence the reused instances.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail, ValidationError
from rest_framework.settings import api_settings

from core.lean import GIVE_UP

S = TypeVar("S", bound="serializers.BaseSerializer[Any]")

_local = threading.local()


def thread_serializer(cls: type[S]) -> S:
    """Return this thread's instance of a context-free serializer, built on first use.

    A serializer deep-copies its declared fields for each instance: for the send body and its answer that
    was about a fifth of an accept's CPU. Use the instance only through `run_validation(data)` and
    `to_representation(obj)` (or `validate_with` and `represent_with`), which keep nothing on the instance;
    never `is_valid`, `.data` or `.save`, which do, and never with a context.
    """
    instances: dict[type, serializers.BaseSerializer[Any]] = _local.__dict__.setdefault("instances", {})
    instance = instances.get(cls)
    if instance is None:
        instance = instances[cls] = cls()
    return instance  # type: ignore[return-value]


def validate_with(cls: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    """Validate `data` as `cls(data=data).is_valid(raise_exception=True)` would, with this thread's instance.

    Raises the same ValidationError (a null body included: "No data provided" under non_field_errors).
    """
    try:
        return dict(thread_serializer(cls).run_validation(data))
    except ValidationError as exc:
        detail = exc.detail
        if isinstance(detail, list) and len(detail) == 1 and getattr(detail[0], "code", None) == "null":
            detail = {api_settings.NON_FIELD_ERRORS_KEY: [ErrorDetail("No data provided", code="null")]}
        raise ValidationError(detail) from None


def represent_with(cls: type[serializers.Serializer[Any]], instance: Any) -> dict[str, Any]:
    """Return `cls(instance).data`, built with this thread's instance of the serializer."""
    return dict(thread_serializer(cls).to_representation(instance))


def holds_nul(value: Any) -> bool:
    """Return True if a string anywhere in a parsed JSON value (an object's keys too) holds a NUL character.

    Walked with a stack, not by recursion: a payload nested as deep as the JSON parser allows must not raise
    RecursionError here, deeper in the request's stack than the parser was.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


class JsonObjectField(serializers.DictField):
    """A free-form JSON object (template variables, template content), refused if a string in it holds a NUL.

    PostgreSQL stores neither a NUL in `text` nor `\\u0000` in `jsonb`: accepted, such a value failed the
    INSERT with a 500, and in a batch it took its neighbours' rows with it. DRF's CharField refuses it the same
    way (ProhibitNullCharactersValidator), so the message is DRF's.
    """

    default_error_messages = {"null_characters": "Null characters are not allowed."}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        if holds_nul(value):
            self.fail("null_characters")
        return value

    def lean(self, value: Any) -> Any:
        """Return what run_validation returns for an object of string keys without NUL (core/lean.py), or GIVE_UP."""
        if type(value) is dict and (value or self.allow_empty) and all(type(k) is str for k in value):
            return GIVE_UP if holds_nul(value) else dict(value)
        return GIVE_UP
