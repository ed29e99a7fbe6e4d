"""Topics and bulk subscription over the REST API."""

from __future__ import annotations

import pytest
from django.urls import include, path
from rest_framework.test import APIClient

from preferences.models import Recipient, Subscription
from tests.factories import make_recipient

urlpatterns = [path("api/v1/", include("preferences.urls"))]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def test_topic_put_get(api: APIClient) -> None:
    r = api.put("/api/v1/topics/all-users", {"name": "All users"}, format="json")
    assert r.status_code == 201
    assert r.json()["key"] == "all-users" and r.json()["subscribers"] == 0
    r = api.put("/api/v1/topics/all-users", {"name": "Everyone"}, format="json")
    assert r.status_code == 200 and r.json()["name"] == "Everyone"
    assert api.get("/api/v1/topics/all-users").json()["name"] == "Everyone"
    assert api.get("/api/v1/topics/nope").status_code == 404
    assert api.put("/api/v1/topics/" + "k" * 129, {"name": "x"}, format="json").status_code == 400
    assert "name" in api.put("/api/v1/topics/t", {"name": "x" * 300}, format="json").json()["error"]["fields"]


def test_bulk_subscribe_ten_thousand(api: APIClient, django_assert_max_num_queries: object) -> None:
    api.put("/api/v1/topics/big", {"name": "Big"}, format="json")
    make_recipient(user_id="u-00005", email="keep@example.com")  # an existing recipient is reused
    user_ids = [f"u-{i:05d}" for i in range(10_000)]
    # A bounded number of round trips, not one per user id.
    with django_assert_max_num_queries(30):  # type: ignore[operator]
        r = api.post("/api/v1/topics/big/subscribers", {"user_ids": user_ids}, format="json")
    assert r.status_code == 200, r.content
    assert r.json() == {"added": 10_000, "total": 10_000}
    assert Recipient.objects.filter(user_id__startswith="u-").count() == 10_000
    assert Recipient.objects.get(user_id="u-00005").email == "keep@example.com"
    assert api.get("/api/v1/topics/big").json()["subscribers"] == 10_000

    # Again, with some new ids and duplicates in the list: only the new ones count.
    r = api.post("/api/v1/topics/big/subscribers", {"user_ids": [*user_ids[:10], "new-1", "new-1"]}, format="json")
    assert r.json() == {"added": 1, "total": 10_001}


def test_bulk_subscribe_limits_and_errors(api: APIClient) -> None:
    api.put("/api/v1/topics/t", {"name": "T"}, format="json")
    too_many = [f"u{i}" for i in range(10_001)]
    r = api.post("/api/v1/topics/t/subscribers", {"user_ids": too_many}, format="json")
    assert r.status_code == 400 and "user_ids" in r.json()["error"]["fields"]
    assert not Recipient.objects.exists()
    bodies: list[dict[str, object]] = [
        {},
        {"user_ids": []},
        {"user_ids": "u1"},
        {"user_ids": ["x" * 256]},
        {"user_ids": [None]},
    ]
    for body in bodies:
        r = api.post("/api/v1/topics/t/subscribers", body, format="json")
        assert r.status_code == 400, body
        assert any(k.startswith("user_ids") for k in r.json()["error"]["fields"]), body
    assert api.post("/api/v1/topics/missing/subscribers", {"user_ids": ["a"]}, format="json").status_code == 404


def test_unsubscribe_one(api: APIClient) -> None:
    api.put("/api/v1/topics/t", {"name": "T"}, format="json")
    api.post("/api/v1/topics/t/subscribers", {"user_ids": ["a", "b"]}, format="json")
    assert api.delete("/api/v1/topics/t/subscribers/a").status_code == 204
    assert list(Subscription.objects.values_list("recipient__user_id", flat=True)) == ["b"]
    assert api.delete("/api/v1/topics/t/subscribers/a").status_code == 204  # idempotent
    assert api.delete("/api/v1/topics/missing/subscribers/a").status_code == 404
    assert api.get("/api/v1/topics/t").json()["subscribers"] == 1
