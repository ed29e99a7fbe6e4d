"""POST /api/v1/recipients/batch: each item created, updated or refused alone, topics joined, one audit entry."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from audit.models import AuditEntry
from preferences.models import Recipient, Subscription
from projects.scoping import owner_id

pytestmark = pytest.mark.django_db

URL = "/api/v1/recipients/batch"


def _post(api: APIClient, items: list[Any]) -> Any:
    return api.post(URL, {"recipients": items}, format="json")


def test_each_item_is_created_updated_or_refused_alone(api: APIClient, service: Any) -> None:
    assert (
        api.put("/api/v1/recipients/u-old", {"email": "old@example.com", "locale": "de"}, format="json").status_code
        == 201
    )
    items = [
        {"user_id": "u-new", "email": "new@example.com", "phone": "+4915112345678", "timezone": "Europe/Berlin"},
        {"user_id": "u-old", "email": "changed@example.com"},
        {"user_id": "u-bad", "email": "not an email"},
        {"user_id": "u-badzone", "timezone": "Mars/Olympus"},
        {"email": "nobody@example.com"},
        "not an object",
        {"user_id": "u-phone", "phone": "+49 151"},
    ]
    r = _post(api, items)
    assert r.status_code == 200, r.content
    results = r.json()["results"]
    assert [(x["user_id"], x["status"]) for x in results] == [
        ("u-new", 201),
        ("u-old", 200),
        ("u-bad", 400),
        ("u-badzone", 400),
        (None, 400),
        (None, 400),
        ("u-phone", 400),
    ]
    assert "error" not in results[0] and "error" not in results[1]
    assert list(results[2]["error"]["fields"]) == ["email"]
    assert results[2]["error"]["code"] == "invalid"
    assert "IANA" in results[3]["error"]["fields"]["timezone"][0]
    assert list(results[4]["error"]["fields"]) == ["user_id"]
    assert results[5]["error"]["fields"] == {"non_field_errors": ["Must be an object."]}
    assert "E.164" in results[6]["error"]["fields"]["phone"][0]

    # What the single GET shows: the batch wrote the same fields a PUT would.
    new = api.get("/api/v1/recipients/u-new").json()
    assert (new["email"], new["phone"], new["timezone"], new["locale"]) == (
        "new@example.com",
        "+4915112345678",
        "Europe/Berlin",
        "",
    )
    old = api.get("/api/v1/recipients/u-old").json()
    assert (old["email"], old["locale"]) == ("changed@example.com", "de")  # fields not sent keep their value
    assert api.get("/api/v1/recipients/u-bad").status_code == 404
    assert Recipient.objects.filter(environment_id=owner_id(service)).count() == 2

    entry = AuditEntry.objects.get(action="recipients.batch")
    assert entry.changes == {"created": 1, "updated": 1, "refused": 5}
    assert entry.actor_name == service.name
    assert "example.com" not in str(entry.changes)


def test_the_same_user_twice_applies_in_order(api: APIClient) -> None:
    r = _post(
        api,
        [{"user_id": "u-1", "email": "a@example.com"}, {"user_id": "u-1", "email": "b@example.com", "locale": "fr"}],
    )
    assert [x["status"] for x in r.json()["results"]] == [201, 200]
    got = api.get("/api/v1/recipients/u-1").json()
    assert (got["email"], got["locale"]) == ("b@example.com", "fr")


def test_topics_are_joined_and_unknown_ones_refuse_the_item(api: APIClient) -> None:
    assert api.put("/api/v1/topics/news", {"name": "News"}, format="json").status_code == 201
    assert api.put("/api/v1/topics/deals", {"name": "Deals"}, format="json").status_code == 201
    items = [
        {"user_id": "u-1", "topics": ["news", "deals"]},
        {"user_id": "u-2", "topics": ["news", "no-such-topic"]},
        {"user_id": "u-3", "topics": ["Not a slug!"]},
        {"user_id": "u-4", "topics": ["news"]},
    ]
    results = _post(api, items).json()["results"]
    assert [x["status"] for x in results] == [201, 400, 400, 201]
    assert "no-such-topic" in results[1]["error"]["fields"]["topics"][0]
    assert list(results[2]["error"]["fields"]) == ["topics.0"]
    assert api.get("/api/v1/topics/news").json()["subscribers"] == 2
    assert api.get("/api/v1/topics/deals").json()["subscribers"] == 1
    assert api.get("/api/v1/recipients/u-2").status_code == 404  # refused whole, not half written
    # Joining again changes nothing; topics are joined, never left.
    again = _post(api, [{"user_id": "u-1", "topics": ["news"]}]).json()["results"]
    assert again == [{"user_id": "u-1", "status": 200}]
    assert Subscription.objects.filter(recipient__user_id="u-1").count() == 2


def test_topics_need_the_topics_scope(api_client_factory: Any) -> None:
    _, narrow = api_client_factory(scopes=["recipients:write", "recipients:read"])
    r = _post(narrow, [{"user_id": "u-1", "topics": ["news"]}])
    assert r.status_code == 403 and r.json()["error"]["code"] == "scope_missing"
    assert _post(narrow, [{"user_id": "u-1"}]).status_code == 200
    _, reader = api_client_factory(scopes=["recipients:read"])
    assert _post(reader, [{"user_id": "u-1"}]).status_code == 403


def test_the_call_itself_is_refused_when_malformed(api: APIClient) -> None:
    bodies: list[dict[str, Any]] = [
        {},
        {"recipients": []},
        {"recipients": "u-1"},
        {"recipients": [{"user_id": "x"}] * 1001},
    ]
    for body in bodies:
        r = api.post(URL, body, format="json")
        assert r.status_code == 400, body
        assert list(r.json()["error"]["fields"]) == ["recipients"]
    assert not Recipient.objects.exists()


def test_a_project_sees_only_its_own_recipients_and_topics(api_client_factory: Any) -> None:
    from projects.services import project_create

    project_create(slug="other", name="Other")
    mine_client, mine = api_client_factory()
    theirs_client, theirs = api_client_factory(project="other")
    assert theirs.put("/api/v1/topics/theirs", {"name": "Theirs"}, format="json").status_code == 201
    assert theirs.put("/api/v1/recipients/u-1", {"email": "theirs@example.com"}, format="json").status_code == 201

    results = _post(mine, [{"user_id": "u-1", "email": "mine@example.com"}, {"user_id": "u-2", "topics": ["theirs"]}])
    assert [x["status"] for x in results.json()["results"]] == [201, 400]  # their u-1 is not ours to update
    assert theirs.get("/api/v1/recipients/u-1").json()["email"] == "theirs@example.com"
    assert mine.get("/api/v1/recipients/u-1").json()["email"] == "mine@example.com"
    assert theirs.get("/api/v1/topics/theirs").json()["subscribers"] == 0
    assert Recipient.objects.filter(environment_id=owner_id(mine_client)).count() == 1
    assert Recipient.objects.filter(environment_id=owner_id(theirs_client)).count() == 1


def test_a_recipient_called_batch_is_still_reachable(api: APIClient) -> None:
    assert api.put("/api/v1/recipients/batch", {"email": "b@example.com"}, format="json").status_code == 201
    assert api.get("/api/v1/recipients/batch").json()["email"] == "b@example.com"
    assert api.delete("/api/v1/recipients/batch").status_code == 204
