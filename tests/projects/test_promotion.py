"""Promotion of templates, layouts and workflows from a project's test environment to its live one, and rollback.

Over the API with a project's test and live keys: what GET /promotion lists (with its diff), what POST /promotion
writes in live (and what live sends then), rollback in either environment, the project setting that makes
promotion the only way to change live, items that fail alone, and another project's keys seeing none of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEntry
from channels_app import services as pipeline
from channels_app.models import SandboxMessage
from notifier.deliveries.models import Delivery
from projects.models import Project
from projects.services import project_create

pytestmark = pytest.mark.django_db

SHIPPED = {"en": {"email": {"subject": "Shipped", "text": "Order {{ order_id }} is on its way"}}}
SHIPPED_V2 = {"en": {"email": {"subject": "Your order {{ order_id }} shipped", "text": "On its way"}}}
WELCOME = {
    "en": {
        "email": {"subject": "Welcome", "html": "<p>Hi {{ name }}</p>"},
        "inapp": {"title": "Hi", "body": "Welcome {{ name }}"},
    }
}
BRAND = "<main>{{ content }}</main>"
BRAND_V2 = "<main class='v2'>{{ content }}</main>"


def _steps(channel: str = "email") -> list[dict[str, Any]]:
    return [{"id": "first", "type": "send", "channel": channel, "template": "welcome"}]


@pytest.fixture
def shop(api_client_factory: Callable[..., tuple[Any, Any]]) -> dict[str, Any]:
    """The project `shop`: its test and live keys (every scope) and a key of the project `other`."""
    project_create(slug="shop")
    project_create(slug="other")
    (test_client, test), (live_client, live) = (
        api_client_factory(project="shop", mode="test"),
        api_client_factory(project="shop", mode="live"),
    )
    _, other = api_client_factory(project="other", mode="test")
    return {"test": test, "live": live, "other": other, "live_client": live_client, "test_client": test_client}


def _put_template(api: Any, key: str, content: dict[str, Any], **more: Any) -> Any:
    return api.put(f"/api/v1/templates/{key}", {"category": "transactional", "content": content, **more}, format="json")


def _promote(api: Any, *items: tuple[str, str]) -> list[dict[str, Any]]:
    response = api.post("/api/v1/promotion", {"items": [{"kind": k, "key": key} for k, key in items]}, format="json")
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


def _listed(api: Any) -> list[dict[str, Any]]:
    response = api.get("/api/v1/promotion")
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


def _send_email(api: Any, template: str = "order_shipped") -> tuple[dict[str, Any], dict[str, Any]]:
    """Send an email to u-1 with `api`, deliver it in this process; return the notification and the email sent."""
    body = {
        "recipient": {"user_id": "u-1"},
        "template": template,
        "channels": ["email"],
        "payload": {"order_id": "A-1"},
    }
    sent = api.post("/api/v1/notifications", body, format="json")
    assert sent.status_code == 202, sent.content
    [delivery_id] = [d["id"] for d in sent.json()["deliveries"]]
    pipeline.deliver([delivery_id])
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == "sent", delivery.last_error
    notification = api.get(f"/api/v1/notifications/{sent.json()['id']}").json()
    return notification, SandboxMessage.objects.get(delivery_id=delivery_id).content


def test_a_template_changed_in_test_is_listed_with_its_diff_promoted_sent_in_live_and_rolled_back(
    shop: dict[str, Any],
) -> None:
    test, live = shop["test"], shop["live"]
    assert _put_template(test, "order_shipped", SHIPPED).status_code == 201
    assert live.put("/api/v1/recipients/u-1", {"email": "u1@example.com"}, format="json").status_code == 201

    # New in test: listed for either key of the project, from nothing in live.
    [new] = _listed(live)
    assert _listed(test) == [new]
    assert {k: new[k] for k in ("kind", "key", "test_version", "live_version")} == {
        "kind": "template", "key": "order_shipped", "test_version": 1, "live_version": None,
    }  # fmt: skip
    assert new["diff"].startswith("--- live/template/order_shipped (none)\n+++ test/template/order_shipped@1\n")
    assert '+        "subject": "Shipped",' in new["diff"]
    assert _promote(test, ("template", "order_shipped")) == [
        {"kind": "template", "key": "order_shipped", "status": 200, "live_version": 1}
    ]
    assert _listed(live) == []
    notification, email = _send_email(live)
    assert (notification["template_version"], email["subject"]) == (1, "Shipped")

    # Changed in test (two versions, the second published): the diff shows what live's email becomes.
    assert _put_template(test, "order_shipped", SHIPPED_V2, publish=False).status_code == 201
    assert _put_template(test, "order_shipped", SHIPPED_V2).status_code == 201
    [changed] = _listed(live)
    assert (changed["test_version"], changed["live_version"]) == (3, 1)
    assert changed["diff"].startswith("--- live/template/order_shipped@1\n+++ test/template/order_shipped@3\n")
    assert '-        "subject": "Shipped",' in changed["diff"]
    assert '+        "subject": "Your order {{ order_id }} shipped",' in changed["diff"]
    assert _promote(live, ("template", "order_shipped"))[0]["live_version"] == 2
    notification, email = _send_email(live)
    assert (notification["template_version"], email["subject"]) == (2, "Your order A-1 shipped")

    # Rolled back in live: version 1 published again as version 3, which the next send uses.
    rolled = live.post("/api/v1/templates/order_shipped/rollback", {"version": 1}, format="json")
    assert rolled.status_code == 201, rolled.content
    assert rolled.json() == {"key": "order_shipped", "version": 3, "published": True}
    notification, email = _send_email(live)
    assert (notification["template_version"], email["subject"]) == (3, "Shipped")
    assert live.get("/api/v1/templates/order_shipped").json()["published_version"] == 3
    # Test is untouched, and live now differs from it again.
    assert test.get("/api/v1/templates/order_shipped").json()["published_version"] == 3
    assert [(c["test_version"], c["live_version"]) for c in _listed(test)] == [(3, 3)]

    entries = list(AuditEntry.objects.filter(target_type="template", target_id="order_shipped").order_by("id"))
    promoted = [e for e in entries if e.action == "template.promote"]
    assert [e.changes["version"] for e in promoted] == [[None, 1], [None, 2]]
    assert [e.changes["test_version"] for e in promoted] == [[None, 1], [None, 3]]
    assert [e.actor_id for e in promoted] == [str(shop["test_client"].pk), str(shop["live_client"].pk)]
    [rollback] = [e for e in entries if e.action == "template.rollback"]
    assert rollback.changes["rolled_back_to"] == [None, 1] and rollback.changes["version"] == [None, 3]


def test_a_layout_and_a_workflow_are_promoted_with_their_template_in_one_call_and_rolled_back(
    shop: dict[str, Any],
) -> None:
    test, live = shop["test"], shop["live"]
    assert test.put("/api/v1/layouts/brand", {"html": BRAND}, format="json").status_code == 201
    assert _put_template(test, "welcome", WELCOME, layout="brand").status_code == 201
    flow = {"category": "transactional", "steps": _steps()}
    assert test.put("/api/v1/workflows/onboard", flow, format="json").status_code == 201
    listed = _listed(live)
    assert [(c["kind"], c["key"]) for c in listed] == [("layout", "brand"), ("template", "welcome"),
                                                      ("workflow", "onboard")]  # fmt: skip
    assert '+  "html": "<main>{{ content }}</main>",' in listed[0]["diff"]
    assert '+      "template": "welcome",' in listed[2]["diff"]

    # In the request's order, the workflow first: it is written last, after the template it names.
    results = _promote(test, ("workflow", "onboard"), ("template", "welcome"), ("layout", "brand"))
    assert [(r["kind"], r["status"], r["live_version"]) for r in results] == [
        ("workflow", 200, 1), ("template", 200, 1), ("layout", 200, 1),
    ]  # fmt: skip
    assert live.get("/api/v1/layouts/brand").json()["html"] == BRAND
    assert live.get("/api/v1/workflows/onboard").json()["steps"] == _steps()
    assert live.get("/api/v1/templates/welcome").json()["published"]["layout"] == "brand"
    assert _listed(test) == []

    # Changed in test and promoted again; then rolled back in live.
    assert test.put("/api/v1/layouts/brand", {"html": BRAND_V2}, format="json").status_code == 201
    flow_v2 = {"category": "transactional", "steps": _steps("inapp")}
    assert test.put("/api/v1/workflows/onboard", flow_v2, format="json").status_code == 201
    listed = _listed(live)
    assert [(c["kind"], c["test_version"], c["live_version"]) for c in listed] == [("layout", 2, 1),
                                                                                  ("workflow", 2, 1)]  # fmt: skip
    assert '-      "channel": "email",' in listed[1]["diff"] and '+      "channel": "inapp",' in listed[1]["diff"]
    assert [r["live_version"] for r in _promote(live, ("layout", "brand"), ("workflow", "onboard"))] == [2, 2]
    assert live.get("/api/v1/layouts/brand").json()["html"] == BRAND_V2

    rolled = live.post("/api/v1/layouts/brand/rollback", {"version": 1}, format="json")
    assert rolled.status_code == 201, rolled.content
    assert rolled.json() == {"key": "brand", "version": 3}
    assert live.get("/api/v1/layouts/brand").json()["html"] == BRAND
    rolled = live.post("/api/v1/workflows/onboard/rollback", {"version": 1}, format="json")
    assert rolled.status_code == 201, rolled.content
    assert (rolled.json()["version"], rolled.json()["steps"]) == (3, _steps())
    assert live.get("/api/v1/workflows/onboard").json()["steps"] == _steps()
    # A send with the workflow in live runs its new latest version.
    assert live.put("/api/v1/recipients/u-1", {"email": "u1@example.com"}, format="json").status_code == 201
    sent = live.post("/api/v1/notifications", {"recipient": {"user_id": "u-1"}, "workflow": "onboard"}, format="json")
    assert sent.status_code == 202, sent.content
    assert sent.json()["workflow_version"] == 3
    actions = set(AuditEntry.objects.values_list("action", flat=True))
    assert {"layout.promote", "layout.rollback", "workflow.promote", "workflow.rollback"} <= actions


def test_rollback_works_in_test_too_and_refuses_what_is_unknown_or_already_in_use(shop: dict[str, Any]) -> None:
    test = shop["test"]
    assert _put_template(test, "order_shipped", SHIPPED).status_code == 201
    assert _put_template(test, "order_shipped", SHIPPED_V2).status_code == 201
    assert test.put("/api/v1/layouts/brand", {"html": BRAND}, format="json").status_code == 201
    assert _put_template(test, "welcome", WELCOME).status_code == 201
    assert test.put("/api/v1/workflows/onboard", {"category": "transactional", "steps": _steps()}, format="json")

    rolled = test.post("/api/v1/templates/order_shipped/rollback", {"version": 1}, format="json")
    assert rolled.status_code == 201 and rolled.json()["version"] == 3
    assert test.get("/api/v1/templates/order_shipped/versions/3").json()["content"] == SHIPPED
    for path, code in (
        ("templates/nope", "template_not_found"),
        ("templates/order_shipped", "template_not_found"),
        ("layouts/nope", "layout_not_found"),
        ("layouts/brand", "layout_not_found"),
        ("workflows/nope", "not_found"),
        ("workflows/onboard", "not_found"),
    ):
        response = test.post(f"/api/v1/{path}/rollback", {"version": 9}, format="json")
        assert (response.status_code, response.json()["error"]["code"]) == (404, code), path
    for path, code in (
        ("templates/order_shipped", "already_published"),
        ("layouts/brand", "already_current"),
        ("workflows/onboard", "already_current"),
    ):
        current = 3 if path.startswith("templates") else 1
        response = test.post(f"/api/v1/{path}/rollback", {"version": current}, format="json")
        assert response.status_code == 400, path
        assert response.json()["error"]["code"] == code and "version" in response.json()["error"]["fields"]
        for bad in (0, 2**63, "two"):
            response = test.post(f"/api/v1/{path}/rollback", {"version": bad}, format="json")
            assert response.status_code == 400 and "version" in response.json()["error"]["fields"], (path, bad)


def test_any_key_of_the_environment_may_roll_back_its_templates_within_its_categories(
    shop: dict[str, Any], api_client_factory: Callable[..., tuple[Any, Any]]
) -> None:
    assert _put_template(shop["live"], "order_shipped", SHIPPED).status_code == 201
    assert _put_template(shop["live"], "order_shipped", SHIPPED_V2).status_code == 201
    _, marketing = api_client_factory(project="shop", scopes=["templates"], categories=["marketing"])
    refused = marketing.post("/api/v1/templates/order_shipped/rollback", {"version": 1}, format="json")
    assert refused.status_code == 403, refused.content
    _, other = api_client_factory(project="shop", scopes=["templates"])
    response = other.post("/api/v1/templates/order_shipped/rollback", {"version": 1}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["version"] == 3


def test_with_promotion_required_live_changes_only_by_promotion(shop: dict[str, Any]) -> None:
    test, live = shop["test"], shop["live"]
    Project.objects.filter(slug="shop").update(promotion=Project.Promotion.REQUIRED)
    for path, body in (
        ("templates/order_shipped", {"category": "transactional", "content": SHIPPED}),
        ("layouts/brand", {"html": BRAND}),
        ("workflows/onboard", {"category": "transactional", "steps": _steps()}),
    ):
        if path.startswith("workflows"):
            assert _put_template(test, "welcome", WELCOME).status_code == 201
        assert test.put(f"/api/v1/{path}", body, format="json").status_code == 201, path
        refused = live.put(f"/api/v1/{path}", body, format="json")
        assert refused.status_code == 409, path
        error = refused.json()["error"]
        assert error["code"] == "promotion_required" and "promotion" in error["message"]
        assert set(error) == {"code", "message", "fields"}
    results = _promote(live, ("template", "order_shipped"), ("layout", "brand"), ("template", "welcome"),
                       ("workflow", "onboard"))  # fmt: skip
    assert [r["status"] for r in results] == [200, 200, 200, 200]
    assert live.get("/api/v1/workflows/onboard").status_code == 200
    # Rollback is not a direct change either.
    assert _put_template(test, "order_shipped", SHIPPED_V2).status_code == 201
    assert _promote(test, ("template", "order_shipped"))[0]["live_version"] == 2
    assert live.post("/api/v1/templates/order_shipped/rollback", {"version": 1}, format="json").status_code == 201
    # The project's own test environment, and other projects' live ones, are changed directly as before.
    assert _put_template(shop["other"], "order_shipped", SHIPPED).status_code == 201


def test_items_fail_alone(shop: dict[str, Any]) -> None:
    test, live = shop["test"], shop["live"]
    assert _put_template(test, "order_shipped", SHIPPED).status_code == 201
    assert _put_template(test, "draft_only", SHIPPED, publish=False).status_code == 201
    assert test.put("/api/v1/layouts/brand", {"html": BRAND}, format="json").status_code == 201
    assert _put_template(test, "welcome", WELCOME, layout="brand").status_code == 201
    assert _put_template(test, "same", SHIPPED).status_code == 201
    assert _put_template(live, "same", SHIPPED).status_code == 201
    items = [
        {"kind": "widget", "key": "order_shipped"},
        {"kind": "template", "key": "nope"},
        {"kind": "template", "key": "draft_only"},
        {"kind": "template", "key": "same"},
        {"kind": "template", "key": "welcome"},  # its layout was not promoted: unknown in live
        {"kind": "workflow"},
        "order_shipped",
        {"kind": "template", "key": "order_shipped"},
    ]
    response = live.post("/api/v1/promotion", {"items": items}, format="json")
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [(r["kind"], r["key"], r["status"], r["live_version"]) for r in results] == [
        ("widget", "order_shipped", 400, None),
        ("template", "nope", 404, None),
        ("template", "draft_only", 400, None),
        ("template", "same", 400, None),
        ("template", "welcome", 400, None),
        ("workflow", "", 400, None),
        ("", "", 400, None),
        ("template", "order_shipped", 200, 1),
    ]
    errors = [r.get("error") for r in results]
    assert errors[0]["fields"] == {"kind": ["unknown kind; one of: layout, template, workflow"]}
    assert errors[1]["code"] == "not_found" and "nope" in errors[1]["message"]
    assert errors[2]["code"] == "nothing_to_promote" and "no published version" in errors[2]["message"]
    assert errors[3]["code"] == "nothing_to_promote" and "already" in errors[3]["message"]
    assert errors[4]["code"] == "invalid" and "unknown layout 'brand'" in errors[4]["fields"]["layout"][0]
    assert "key" in errors[5]["fields"] and "item" in errors[6]["fields"]
    assert errors[7] is None
    assert live.get("/api/v1/templates/welcome").status_code == 404
    bodies: list[dict[str, Any]] = [{"items": []}, {"items": "template"}, {}]
    for body in bodies:
        refused = live.post("/api/v1/promotion", body, format="json")
        assert refused.status_code == 400 and "items" in refused.json()["error"]["fields"], body


def test_a_key_of_another_project_neither_sees_nor_promotes_this_projects_objects(shop: dict[str, Any]) -> None:
    assert _put_template(shop["test"], "order_shipped", SHIPPED).status_code == 201
    assert shop["test"].put("/api/v1/layouts/brand", {"html": BRAND}, format="json").status_code == 201
    assert _listed(shop["other"]) == []
    results = _promote(shop["other"], ("template", "order_shipped"), ("layout", "brand"))
    assert [r["status"] for r in results] == [404, 404]
    assert shop["live"].get("/api/v1/templates/order_shipped").status_code == 404
    assert [c["key"] for c in _listed(shop["live"])] == ["brand", "order_shipped"]
