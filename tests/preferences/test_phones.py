"""Phone numbers are checked against numbering plans (phonenumbers) and stored in E.164."""

from __future__ import annotations

from typing import Any

import pytest

from preferences.models import Recipient
from preferences.phones import InvalidPhoneNumber, phone_normalize
from tests.factories import make_recipient, make_staff_user

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("number", ["+99912345678", "+10000000000", "+15555550100", "4915112345678", "+49 abc", "+1"])
def test_impossible_numbers_are_a_400_naming_the_field(api: Any, number: str) -> None:
    response = api.put("/api/v1/recipients/u-1", {"phone": number}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["phone"]
    assert not Recipient.objects.filter(user_id="u-1").exists()


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("+4915112345678", "+4915112345678"),
        ("+44 20 7946 0958", "+442079460958"),
        ("+1 (415) 555-0123", "+14155550123"),
    ],
)
def test_valid_numbers_are_stored_in_e164(api: Any, given: str, stored: str) -> None:
    response = api.put("/api/v1/recipients/u-2", {"phone": given}, format="json")
    assert response.status_code in (200, 201), response.content
    assert response.json()["phone"] == stored
    assert Recipient.objects.get(user_id="u-2").phone == stored


def test_clearing_the_phone_still_works(api: Any) -> None:
    api.put("/api/v1/recipients/u-3", {"phone": "+4915112345678"}, format="json")
    assert api.put("/api/v1/recipients/u-3", {"phone": ""}, format="json").json()["phone"] == ""


def test_phone_normalize_reasons() -> None:
    with pytest.raises(InvalidPhoneNumber, match="international"):
        phone_normalize("015112345678")
    with pytest.raises(InvalidPhoneNumber, match="numbering plan"):
        phone_normalize("+10000000000")


def test_the_admin_checks_and_normalises_too(client: Any) -> None:

    client.force_login(make_staff_user("ops", superuser=True))
    recipient = make_recipient(user_id="u-4")
    url = f"/admin/preferences/recipient/{recipient.pk}/change/"
    base = {"user_id": "u-4", "locale": "en", "timezone": "", "devices-TOTAL_FORMS": "0", "devices-INITIAL_FORMS": "0"}
    bad = client.post(url, {**base, "phone": "+99912345678"})
    assert bad.status_code == 200 and "phone number" in bad.content.decode().lower()
    good = client.post(url, {**base, "phone": "+44 20 7946 0958"})
    assert good.status_code == 302, good.content[:3000]
    recipient.refresh_from_db()
    assert recipient.phone == "+442079460958"
