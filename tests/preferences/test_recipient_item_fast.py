"""A batch's fast paths give what the serializers give: each recipient item's validation, and the answer."""

from __future__ import annotations

import zoneinfo
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from core.db import InstanceBuilder
from core.serializers import thread_serializer
from preferences import phones
from preferences.models import Recipient
from preferences.serializers import (
    RecipientBatchInputSerializer,
    RecipientBatchItemSerializer,
    RecipientBatchOutputSerializer,
    recipient_batch_answer,
    recipient_item_fast,
)

pytestmark = pytest.mark.pure

PLAIN = {
    "user_id": "user-00000001",
    "email": "user1@example.com",
    "phone": "+4915112000001",
    "locale": "de-DE",
    "timezone": "Europe/Berlin",
    "topics": ["all-users"],
}

# Values each field may take: valid ones, and ones DRF converts, trims or refuses.
FIELD_VALUES: dict[str, list[Any]] = {
    "user_id": ["u-1", " u-1", "u-1\n", "", "   ", 42, 4.5, True, None, "ü-1", "u\x00", "x" * 255, "x" * 256, ["u"]],
    "email": [
        "a@example.com",
        "A.B+c@sub.example.org",
        "a@localhost",
        "a@[127.0.0.1]",
        "a@[::1]",
        "a@b",
        "not an email",
        "a@@b.com",
        " a@example.com",
        "a@example.com ",
        "a@exämple.com",
        "ü@example.com",
        "",
        "  ",
        None,
        7,
        True,
        "a" * 310 + "@example.com",
        "a@" + "b" * 320 + ".com",
        "a\x00@example.com",
        ["a@example.com"],
    ],
    "phone": [
        "+4915112345678",
        "+49 151 12345678",
        "+49-151-1234-5678",
        "+4901511234567",
        "+390612345678",
        "+3906123456789",
        "+12015550123",
        "+1 (201) 555-0123",
        "+442079460958",
        "+447911123456",
        "+33612345678",
        "+819012345678",
        "+8613812345678",
        "+61412345678",
        "+10000000000",
        "+99912345678",
        "+49 151",
        "+4",
        "+",
        "015112345678",
        " +4915112345678",
        "+4915112345678 ",
        "+49151123456789012345678901234",
        "+49\uff11\uff15\uff1112345678",
        "+4915112345678;ext=12",
        "+4915112345678 x12",
        "tel:+4915112345678",
        "",
        "  ",
        None,
        4915112345678,
        True,
    ],
    "locale": [
        "de",
        "de-DE",
        "de_DE",
        "zh-Hant-TW",
        "pt-BR",
        "x",
        "1d",
        "de-",
        "de--DE",
        "de DE",
        " de",
        "de\n",
        "toolonglocale-" * 3,
        "",
        None,
        5,
        "dé",
    ],
    "timezone": [
        "Europe/Berlin",
        "UTC",
        "America/Argentina/Buenos_Aires",
        "Etc/GMT+5",
        "Mars/Olympus",
        "utc",
        " UTC",
        "UTC ",
        "Europe/Berlin\n",
        "",
        None,
        1,
        "x" * 65,
    ],
    "webhook_url": [
        "https://example.com/hook",
        "http://example.com",
        "HTTPS://EXAMPLE.COM/x",
        "ftp://example.com",
        "https://",
        "https://exa mple.com",
        "example.com",
        "https://example.com/" + "x" * 2040,
        " https://example.com",
        "",
        None,
        3,
    ],
    "chat": [None, {}, {"slack": "#ops"}, {"slack": ""}, {"fax": "1"}, [], "x", 0],
    "tracking_opt_out": [True, False, "true", "false", 1, 0, "yes", None, "x", [], 2],
    "topics": [
        [],
        ["news"],
        ["news", "all-users", "a_b", "A-1"],
        ["news", "news"],
        ["x" * 128],
        ["x" * 129],
        [" news"],
        ["news\n"],
        ["ne ws"],
        ["nëws"],
        [""],
        [None],
        [1],
        "news",
        None,
        {},
        ["news"] * 100,
        ["news"] * 101,
        [["news"]],
    ],
    "unknown": [1],
}


def _drf(data: Any) -> dict[str, Any] | None:
    """Return what RecipientBatchItemSerializer returns for `data`, or None if it refuses it."""
    try:
        return dict(thread_serializer(RecipientBatchItemSerializer).run_validation(data))
    except serializers.ValidationError:
        return None


def _assert_agrees(data: Any) -> bool:
    """Assert that the fast path never differs from DRF; return whether it took the item."""
    fast, slow = recipient_item_fast(data), _drf(data)
    if fast is None:
        return False
    assert slow is not None, f"the fast path accepted what DRF refuses: {data!r}"
    assert fast == slow, data
    assert list(fast) == list(slow), data  # the serializer's field order
    if "topics" in fast:
        assert fast["topics"] is not data["topics"]
    return True


# Values of each field that the serializer accepts as they are (the fast path's to take).
VALID: dict[str, st.SearchStrategy[Any]] = {
    "user_id": st.from_regex(r"[A-Za-z0-9_.:@|-]{1,40}", fullmatch=True),
    "email": st.emails(),
    "phone": st.sampled_from(["+4915112345678", "+12015550123", "+442079460958", "+33612345678", "+390612345678"]),
    "locale": st.from_regex(r"[a-z]{2,3}([-_][A-Za-z0-9]{2,8}){0,2}", fullmatch=True),
    "timezone": st.sampled_from(sorted(zoneinfo.available_timezones())),
    "webhook_url": st.from_regex(r"https?://[a-z]{1,10}\.(com|org|io)(/[a-z0-9]{0,8})?", fullmatch=True),
    "chat": st.sampled_from([None, {}]),
    "tracking_opt_out": st.booleans(),
    "topics": st.lists(st.from_regex(r"[-a-zA-Z0-9_]{1,12}", fullmatch=True), max_size=4),
}
# Shapes of text DRF converts, trims or refuses, made from a valid value.
SPOILED = st.sampled_from([" {}", "{} ", "{}\n", "\t{}", "{}\x00", "{}\u00e9", "\u00a0{}", "{0}{0}", "{} x", ""])


def _field(name: str) -> st.SearchStrategy[Any]:
    """Values of one field: mostly valid ones (so that the fast path sees most items), listed ones, spoiled ones,
    and generated text shaped like the field's."""
    generated: dict[str, st.SearchStrategy[Any]] = {
        "user_id": st.text(max_size=260),
        "email": st.text(max_size=40),
        "phone": st.from_regex(r"\+[0-9]{1,17}", fullmatch=True)
        | st.from_regex(r"\+[1-9][0-9]{0,3}[ -]?[0-9]{2,5}[ -]?[0-9]{2,9}", fullmatch=True)
        | st.text(alphabet="+0123456789 -()x;", max_size=24),
        "locale": st.text(max_size=8),
        "timezone": st.text(max_size=12),
        "webhook_url": st.from_regex(r"(https?|ftp)://[a-z0-9. -]{0,20}(/[a-z]*)?", fullmatch=True)
        | st.text(max_size=20),
        "topics": st.lists(
            VALID["user_id"] | st.text(max_size=4) | st.builds(str.format, SPOILED, VALID["user_id"]), max_size=4
        ),
        "tracking_opt_out": st.none() | st.integers() | st.text(max_size=5),
    }
    listed = st.sampled_from(FIELD_VALUES[name])
    if name not in VALID:
        return listed
    valid = VALID[name]
    text_valid = valid.filter(lambda v: isinstance(v, str))
    spoiled = (
        st.builds(str.format, SPOILED, text_valid) if name not in ("chat", "topics", "tracking_opt_out") else valid
    )
    other = st.one_of(listed, spoiled, generated.get(name, listed))
    # Each field valid four times in five: items with several fields are then often valid throughout.
    return st.integers(0, 4).flatmap(lambda n: valid if n else other)


ITEMS = st.fixed_dictionaries(
    {"user_id": _field("user_id")},
    optional={name: _field(name) for name in VALID if name != "user_id"},
)


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in FIELD_VALUES.items() for v in values])
def test_each_field_value_alone_is_validated_as_drf_validates_it(field: str, value: Any) -> None:
    _assert_agrees({**PLAIN, field: value})


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=ITEMS, drop_user_id=st.integers(0, 19))
def test_generated_items_are_validated_as_drf_validates_them(item: dict[str, Any], drop_user_id: int) -> None:
    if drop_user_id == 0:  # an item without its user id now and then
        item.pop("user_id")
    event("fast path" if _assert_agrees(item) else "deferred")


def test_plain_items_take_the_fast_path_with_every_field() -> None:
    item = {**PLAIN, "webhook_url": "https://example.com/hook", "tracking_opt_out": True, "chat": None}
    assert _assert_agrees(item)
    assert _assert_agrees({"user_id": "u-1"})
    assert _assert_agrees({"user_id": "u-1", "email": None, "phone": "", "locale": "de_DE", "timezone": None})
    assert _assert_agrees({"user_id": "u-1", "phone": "+49 151 12345678"})  # stored as E.164, as the PUT does
    assert recipient_item_fast({"email": "a@example.com"}) is None  # no user id: DRF words the error
    assert recipient_item_fast([PLAIN]) is None and recipient_item_fast(None) is None


def test_a_phone_number_is_judged_once_per_text_and_as_before() -> None:
    phones._judged_cached.cache_clear()
    for _ in range(3):
        assert phones.phone_normalize(" +49 151 12345678") == "+4915112345678"
        with pytest.raises(phones.InvalidPhoneNumber, match="numbering plan"):
            phones.phone_normalize("+10000000000")
    info = phones._judged_cached.cache_info()
    assert (info.misses, info.hits) == (2, 4)
    long_text = "+4915112345678" + " " * 30 + "1"  # longer than a recipient's phone: judged, not remembered
    with pytest.raises(phones.InvalidPhoneNumber):
        phones.phone_normalize(long_text)
    assert phones._judged_cached.cache_info().currsize == 2


def _error(fields: dict[str, list[str]]) -> dict[str, Any]:
    return {"code": "invalid", "message": "Invalid input.", "fields": fields}


@pytest.mark.parametrize(
    "results",
    [
        [{"user_id": "u-1", "status": 201}, {"user_id": "u-2", "status": 200}],
        [{"user_id": None, "status": 400, "error": _error({"user_id": ["This field is required."]})}],
        [
            {"user_id": "u-1", "status": 400, "error": _error({"email": ["Enter a valid email address."]})},
            {"user_id": "u-2", "status": 201},
        ],
    ],
    ids=["written", "refused", "mixed"],
)
def test_the_answer_is_the_serializers(results: list[dict[str, Any]]) -> None:
    expected = RecipientBatchOutputSerializer({"results": results}).data
    found = recipient_batch_answer(results)
    assert found == expected
    assert [list(x) for x in found["results"]] == [list(x) for x in expected["results"]]


def test_the_items_reach_the_view_as_sent_and_a_null_item_still_fails_the_call() -> None:
    items = [PLAIN, "x", 3, [1], {"a": {"b": [None]}}]
    data = RecipientBatchInputSerializer(data={"recipients": items})
    assert data.is_valid(), data.errors
    assert data.validated_data["recipients"] == items
    refused = RecipientBatchInputSerializer(data={"recipients": [PLAIN, None]})
    assert not refused.is_valid()
    assert refused.errors == {"recipients": {1: ["This field may not be null."]}}


def test_a_built_recipient_holds_what_model_init_would() -> None:
    fields = recipient_item_fast({**PLAIN, "tracking_opt_out": True})
    assert fields is not None
    fields.pop("topics")
    values = {"environment_id": 3, "user_id": fields.pop("user_id"), **fields}
    built, made = InstanceBuilder(Recipient).new(**values), Recipient(**values)
    for field in Recipient._meta.concrete_fields:
        a, b = getattr(built, field.attname), getattr(made, field.attname)
        if field.auto_created:
            assert a is b is None
        else:
            assert a == b, field.name
    assert built.chat is not InstanceBuilder(Recipient).new(**values).chat  # a callable default, called per instance
