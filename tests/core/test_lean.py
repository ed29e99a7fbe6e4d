"""A lean validator returns what its serializer returns, or None: never a value DRF would refuse or change."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from core.lean import lean_validator, refuses_unknown_keys
from core.serializers import JsonObjectField
from tests.bodies import mixed_bodies

pytestmark = pytest.mark.pure


class Inner(serializers.Serializer):
    """A nested object with a check across its fields."""

    low = serializers.IntegerField(min_value=0, max_value=10)
    high = serializers.IntegerField(min_value=0, max_value=10, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["low"] > attrs.get("high", 10):
            raise serializers.ValidationError({"low": ["Above high."]})
        return attrs


class Every(serializers.Serializer):
    """One field of each kind the lean path takes, and one it leaves to DRF."""

    name = serializers.CharField(max_length=8)
    note = serializers.CharField(max_length=5, required=False, allow_blank=True, allow_null=True)
    slug = serializers.SlugField(max_length=6, required=False)
    email = serializers.EmailField(required=False)
    kind = serializers.ChoiceField(choices=[("a", "A"), ("b", "B")], required=False, allow_blank=True)
    on = serializers.BooleanField(required=False)
    tags = serializers.ListField(
        child=serializers.ChoiceField(choices=["x", "y", "z"]), required=False, allow_empty=False, max_length=2
    )
    vars = JsonObjectField(required=False, default=dict)
    inner = Inner(required=False)
    when = serializers.DateTimeField(required=False)  # converted: always DRF's

    def validate_name(self, value: str) -> str:
        if value == "bad":
            raise serializers.ValidationError("Bad name.")
        return value.upper()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("kind") == "b" and "tags" not in attrs:
            raise serializers.ValidationError({"tags": ["Needed with kind b."]})
        return attrs


class Strict(Every):
    """Every, refusing unknown keys."""

    @refuses_unknown_keys
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and set(data) - set(self.fields):
            raise serializers.ValidationError({"unknown": ["Unknown field."]})
        return super().to_internal_value(data)


lean_every, lean_strict = lean_validator(Every), lean_validator(Strict)

# Values each field may be given: the first ones valid, then ones DRF converts, trims or refuses.
ANY: list[Any] = [None, True, 0, 7, "", " ", " a", "a ", "ä", "a\x00", [], {}]
VALUES: dict[str, list[Any]] = {
    "name": ["ann", "x" * 8, "bad", "x" * 9, *ANY],
    "note": ["hi", None, "", "hello", "toolong", *ANY],
    "slug": ["ok-1", "a_b", "no way", "x" * 7, *ANY],
    "email": ["a@example.com", "A@Example.COM", "a@", "a@example.com ", *ANY],
    "kind": ["a", "b", "c", "A", *ANY],
    "on": [True, False, "true", 1, *ANY],
    "tags": [["x"], ["x", "y"], [], ["x", "x", "x"], ["w"], [None], ["x", 1], ("x",), *ANY],
    "vars": [{}, {"k": [1, None, "s"]}, {"k": {"d": "\x00"}}, {1: 2}, {"\x00": 1}, *ANY],
    "inner": [{"low": 1}, {"low": 2, "high": 3}, {"low": 5, "high": 1}, {"low": 11}, {"low": "1"},
              {"low": 1, "x": 1}, {"low": True}, *ANY],
    "when": ["2030-01-01T00:00:00Z", "soon"],
    "unknown": [1],
}  # fmt: skip


def _drf(cls: type[serializers.Serializer], data: Any) -> dict[str, Any] | None:
    try:
        return dict(cls().run_validation(data))
    except serializers.ValidationError:
        return None


def test_the_lean_answer_is_drfs_or_none_and_the_common_bodies_are_lean() -> None:
    taken = 0
    rare = frozenset({"when", "unknown"})
    for body in mixed_bodies(7, VALUES, 4000, valid=0.6, present=0.4, required={"name": "ann"}, rare=rare):
        for cls, lean in ((Every, lean_every), (Strict, lean_strict)):
            found, expected = lean(body), _drf(cls, body)
            if found is None:
                continue
            taken += 1
            assert expected is not None, f"lean accepted what DRF refuses: {body!r}"
            assert found == expected and list(found) == list(expected), body
            if "inner" in found:
                assert type(found["inner"]) is dict and found["inner"] is not body["inner"]
    assert taken > 400  # the common shapes are not all left to DRF


def test_valid_values_of_every_kind_take_the_lean_path_with_defaults_and_both_validate_steps() -> None:
    body = {
        "name": "ann", "note": None, "slug": "ok-1", "email": "a@example.com", "kind": "b", "on": False,
        "tags": ["x", "z"], "vars": {"k": [1, None]}, "inner": {"low": 2, "high": 3},
    }  # fmt: skip
    found = lean_every(body)
    assert found == _drf(Every, body) and found is not None
    assert found["name"] == "ANN"  # validate_name's value
    assert found["tags"] is not body["tags"] and found["vars"] is not body["vars"]
    assert lean_every({"name": "ann", "note": ""}) == {"name": "ANN", "note": "", "vars": {}}  # the default, new
    assert lean_strict({"name": "ann"}) == {"name": "ANN", "vars": {}}


@pytest.mark.parametrize(
    "body",
    [
        {"name": "bad"},  # validate_name refuses
        {"name": "ann", "kind": "b"},  # validate refuses
        {"name": "ann", "inner": {"low": 5, "high": 1}},  # the nested validate refuses
        {"name": "ann", "when": "2030-01-01T00:00:00Z"},  # a field it does not take
        {"name": "ann", "unknown": 1},  # an unknown key: DRF ignores it, Strict refuses it
        {"name": " ann"},  # trimmed by DRF
        {"name": 7},  # converted by DRF
        {},  # the required name missing: DRF words it
        {"name": "ann", "on": "true"},
        {"name": "ann", "vars": {"k": "\x00"}},
    ],
)
def test_what_drf_would_convert_refuse_or_word_is_left_to_drf(body: dict[str, Any]) -> None:
    assert lean_every(body) is None and lean_strict(body) is None


def test_a_serializer_with_checks_it_cannot_see_is_never_taken() -> None:
    class Own(serializers.Serializer):
        name = serializers.CharField()

        def to_internal_value(self, data: Any) -> Any:
            return super().to_internal_value(data)

    class Renamed(serializers.Serializer):
        name = serializers.CharField(source="other")

    assert _drf(Own, {"name": "ann"}) == {"name": "ann"} and lean_validator(Own)({"name": "ann"}) is None
    assert lean_validator(Renamed)({"name": "ann"}) is None
