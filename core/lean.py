"""Validate a common request body by a DRF serializer's own declaration, without DRF's per-call machinery.

A serializer stays the one definition of a body: its fields, their limits and validators, its `validate_<name>`
methods and its `validate` give the OpenAPI schema, the values and every error message. DRF's way of running
them (a `run_validation` per field, `SkipField` for each absent one, `ErrorDetail`s, a copy of its fields per
instance) cost more than the rest of a send's accept, so `lean_validator(Serializer)` reads the declaration once
and returns a function that runs the same checks directly, for values that need no conversion:

- a string a `CharField` would keep as it is (ASCII, not blank, not trimmed, within its length), then the field's
  other validators (an e-mail's, a URL's, a slug's pattern); a choice given as one of its strings; a boolean; an
  integer; a list of such values; a nested serializer of such fields; a field class's own `lean` method (the JSON
  object of template variables, a cleared set of chat addresses);
- null where the field allows it, "" where a string or choice field allows it, and each absent field's default;
- then the serializer's `validate_<name>` methods and its `validate`, the real ones.

Anything else (an unknown or read-only field, a value DRF would convert, trim or refuse, a check that fails) makes
the function answer None, and the caller validates with the serializer itself, which words the error. So the lean
path can never refuse what DRF accepts nor accept what it refuses, and it returns DRF's values in DRF's order
(tests/core/test_lean.py holds it to that over generated bodies).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import MaxLengthValidator, MinLengthValidator, ProhibitNullCharactersValidator
from rest_framework import fields as drf_fields
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator

# What a check answers for a value it does not take as it stands.
GIVE_UP: Any = object()

Check = Callable[[Any], Any]
Lean = Callable[[Any], "dict[str, Any] | None"]

# Validators a lean value has passed by construction: ASCII without NUL, its length checked before them.
_IMPLIED_ALWAYS = (ProhibitNullCharactersValidator, ProhibitSurrogateCharactersValidator)


def _not_implied(validators: list[Any], shortest: int, longest: int) -> list[Any]:
    """Return the validators a lean value of a length within [shortest, longest] has not passed by construction."""
    return [
        v
        for v in validators
        if not isinstance(v, _IMPLIED_ALWAYS)
        and not (isinstance(v, MaxLengthValidator) and v.limit_value >= longest)
        and not (isinstance(v, MinLengthValidator) and v.limit_value <= shortest)
    ]


_REFUSED = (serializers.ValidationError, DjangoValidationError)


def _never(value: Any) -> Any:
    return GIVE_UP


def _same_method(cls: type, base: type, *names: str) -> bool:
    """Return True if `cls` runs `base`'s own code for each method named (a subclass may only add validators)."""
    return all(getattr(cls, name) is getattr(base, name) for name in names)


def _with_validators(check: Check, validators: list[Any]) -> Check:
    """Return `check` followed by the field's validators: any refusal is a give-up."""
    if not validators:
        return check
    if any(getattr(v, "requires_context", False) for v in validators):
        return _never  # DRF passes such a validator its field: leave it to DRF

    def checked(value: Any) -> Any:
        value = check(value)
        if value is GIVE_UP:
            return GIVE_UP
        try:
            for validator in validators:
                validator(value)
        except _REFUSED:
            return GIVE_UP
        return value

    return checked


def _char(field: serializers.CharField) -> Check:
    longest = field.max_length if field.max_length is not None else 1 << 62
    shortest = max(field.min_length or 0, 1)
    trims = field.trim_whitespace

    def check(value: Any) -> Any:
        # What CharField returns unchanged: a str that neither the blank test nor trimming touches. Non-ASCII
        # (surrogates, Unicode spaces that strip() removes) is left to DRF.
        if (
            type(value) is str and shortest <= len(value) <= longest and value.isascii() and "\x00" not in value
            and (not trims or value.strip() == value) and value.strip()
        ):  # fmt: skip
            return value
        return GIVE_UP

    return _with_validators(check, _not_implied(field.validators, shortest, longest))


def _choice(field: serializers.ChoiceField) -> Check:
    choices = dict(field.choice_strings_to_values)

    def check(value: Any) -> Any:
        return choices[value] if type(value) is str and value in choices else GIVE_UP

    return _with_validators(check, list(field.validators))


def _boolean(value: Any) -> Any:
    return value if type(value) is bool else GIVE_UP


def _integer(value: Any) -> Any:
    # DRF reads an integer through its decimal text; past 2**53 a float could have been meant: DRF decides.
    return value if type(value) is int and -(1 << 53) < value < (1 << 53) else GIVE_UP


def _list(field: serializers.ListField) -> Check:
    child = _field_check(field.child)
    allow_empty = field.allow_empty
    longest = field.max_length if field.max_length is not None else 1 << 62
    shortest = field.min_length or 0

    def check(value: Any) -> Any:
        if type(value) is not list or not shortest <= len(value) <= longest or (not value and not allow_empty):
            return GIVE_UP
        found = [child(item) for item in value]
        return GIVE_UP if any(item is GIVE_UP for item in found) else found

    return _with_validators(check, _not_implied(field.validators, shortest, longest))


def _field_check(field: serializers.Field[Any, Any, Any, Any]) -> Check:
    """Return the lean check of one field's value (present and not null), or one that always gives up."""
    cls = type(field)
    own = getattr(field, "lean", None)
    if own is not None:
        return own  # type: ignore[no-any-return]
    if isinstance(field, serializers.Serializer):
        return _serializer_check(field)
    if isinstance(field, serializers.CharField) and _same_method(
        cls, serializers.CharField, "run_validation", "to_internal_value", "validate_empty_values"
    ):
        return _char(field)
    if isinstance(field, serializers.ChoiceField) and _same_method(
        cls, serializers.ChoiceField, "run_validation", "to_internal_value", "validate_empty_values"
    ):
        return _choice(field)
    if cls is serializers.BooleanField:
        return _boolean
    if cls is serializers.IntegerField:
        return _with_validators(_integer, list(field.validators))
    if isinstance(field, serializers.ListField) and _same_method(
        cls, serializers.ListField, "run_validation", "to_internal_value", "run_child_validation"
    ):
        return _list(field)
    return _never


def _value_check(field: serializers.Field[Any, Any, Any, Any]) -> Check:
    """Return the check of a present value, null and "" included, as the field's run_validation would see them."""
    check = _field_check(field)
    if check is _never or getattr(field, "lean", None) is not None:
        return check  # a field's own lean method sees null and "" itself
    stock_empty = type(field).validate_empty_values is drf_fields.Field.validate_empty_values
    allow_null = field.allow_null and stock_empty
    blank = "" if getattr(field, "allow_blank", False) else GIVE_UP

    def value_check(value: Any) -> Any:
        if value is None:
            return None if allow_null else GIVE_UP
        if value == "" and type(value) is str:
            return blank
        return check(value)

    return value_check if allow_null or blank is not GIVE_UP else check


def _serializer_check(serializer: serializers.Serializer[Any]) -> Check:
    """Return the lean check of a whole body for `serializer` (a top-level one or a nested field)."""
    cls = type(serializer)
    if serializer.validators or not _same_method(
        cls, serializers.Serializer, "run_validation", "validate_empty_values"
    ):
        return _never
    # Refusing unknown keys (as a strict serializer does) is what the lean path does anyway; any other
    # to_internal_value of its own may check more than its fields, and is not run here.
    if getattr(cls.to_internal_value, "lean_refuses_unknown_keys", False) is False and not _same_method(
        cls, serializers.Serializer, "to_internal_value"
    ):
        return _never
    steps: list[tuple[str, Check, Callable[[Any], Any] | None, Any]] = []
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        if field.source != name:
            return _never
        default: Any = GIVE_UP  # absent and required: DRF words the error
        if not field.required:
            default = field.default
            if getattr(default, "requires_context", False):
                default = GIVE_UP  # a default that reads its field: DRF computes it
        steps.append((name, _value_check(field), getattr(serializer, f"validate_{name}", None), default))
    known = frozenset(name for name, *_ in steps)
    validate = serializer.validate

    def check(data: Any) -> Any:
        if type(data) is not dict or not data.keys() <= known:
            return GIVE_UP
        found: dict[str, Any] = {}
        try:
            for name, value_check, validate_method, default in steps:
                if name in data:
                    value = value_check(data[name])
                elif default is empty:
                    continue
                elif default is GIVE_UP:
                    return GIVE_UP
                else:
                    value = default() if callable(default) else default
                if value is GIVE_UP:
                    return GIVE_UP
                found[name] = value if validate_method is None else validate_method(value)
            return validate(found)
        except _REFUSED:
            return GIVE_UP

    return check


def lean_validator(serializer_class: type[serializers.Serializer[Any]]) -> Lean:
    """Return a function giving what `serializer_class().run_validation(data)` returns, or None to let DRF decide.

    The serializer is read on first use (its fields need Django's settings), once per process.
    """

    @functools.cache
    def compiled() -> Check:
        return _serializer_check(serializer_class())

    def validate(data: Any) -> dict[str, Any] | None:
        found = compiled()(data)
        return None if found is GIVE_UP else found

    return validate


def refuses_unknown_keys(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a serializer's `to_internal_value` whose only addition to DRF's is refusing unknown keys."""
    method.lean_refuses_unknown_keys = True  # type: ignore[attr-defined]
    return method
