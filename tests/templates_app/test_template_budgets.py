"""Template budgets: each known template bomb is refused at save time or fails fast (preview 400, delivery failed
with reason template_budget), for the API, the admin preview and real workers, which keep serving; the chat part
(its text and its Block Kit strings) within the same budgets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from notifier.deliveries.models import Delivery
from templates_app.services import template_put
from tests.conftest import wait_for
from tests.factories import make_staff_user

# Refused at save: what breaks the budget is in the template itself.
STATIC_BOMBS = {
    "format_width": '{{ "%50000000d"|format(1) }}',
    "center_width": '{{ "x"|center(50000000) }}',
    "ljust_width": '{{ "x".ljust(50000000) }}',
    "str_format_width": '{{ "{:>50000000}".format(1) }}',
    "nested_range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}
# Saved (nothing in the template alone says so) but stopped while rendering, whatever the payload.
DYNAMIC_BOMBS = {
    "format_width_from_payload": "{{ fmt|format(1) }}",
    "center_width_from_payload": '{{ "x"|center(n) }}',
    "namespace_doubling": (
        '{% set ns = namespace(s="x") %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}'
    ),
    "plus_doubling": (
        '{% set ns = namespace(s="x") %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}'
    ),
    "nested_range_from_payload": "{% for i in range(n) %}{% for j in range(n) %}{{ '' }}{% endfor %}{% endfor %}",
    "replace_amplification": '{{ ("a" * 100000)|replace("a", "a" * 100000) }}',
    "set_block_accumulation": '{% set x %}{% for i in range(9000) %}{{ "y" * 90000 }}{% endfor %}{% endset %}{{ x }}',
    "power_tower": "{{ ((10 ** 1000) ** 1000) ** 1000 }}",
}
PAYLOAD = {"fmt": "%50000000d", "n": 100000}


def body(text: str) -> dict[str, Any]:
    return {
        "category": "transactional",
        "default_locale": "en",
        "content": {"en": {"inapp": {"title": "t", "body": text}}},
    }


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(STATIC_BOMBS))
def test_static_bombs_are_refused_at_save_time(api: Any, name: str) -> None:
    response = api.put(f"/api/v1/templates/{name}", body(STATIC_BOMBS[name]), format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "template_budget"
    fields = response.json()["error"]["fields"]
    assert "template budget" in fields["content.en.inapp.body"][0]
    assert api.put("/api/v1/templates/fine", body("Hi {{ name }}"), format="json").status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(DYNAMIC_BOMBS))
def test_dynamic_bombs_fail_the_preview_with_400(api: Any, name: str) -> None:
    assert api.put(f"/api/v1/templates/{name}", body(DYNAMIC_BOMBS[name]), format="json").status_code == 201
    response = api.post(f"/api/v1/templates/{name}/preview", {"payload": PAYLOAD, "locale": "en"}, format="json")
    assert response.status_code == 400, response.content[:500]
    assert response.json()["error"]["code"] == "template_budget"
    assert len(response.content) < 2000  # the answer is the error, not 50 MB
    # The API process still serves.
    api.put("/api/v1/templates/fine", body("Hi {{ name }}"), format="json")
    ok = api.post("/api/v1/templates/fine/preview", {"payload": {"name": "Ada"}, "locale": "en"}, format="json")
    assert ok.status_code == 200 and ok.json()["channels"]["inapp"]["parts"]["body"] == "Hi Ada"


@pytest.mark.django_db
def test_the_time_budget_stops_a_slow_render(api: Any, settings: Any) -> None:
    settings.TEMPLATE_MAX_RENDER_SECONDS = 0.0  # every check is past the deadline
    api.put("/api/v1/templates/slow", body("{% for i in range(3) %}{{ i }}{% endfor %}"), format="json")
    response = api.post("/api/v1/templates/slow/preview", {"payload": {}, "locale": "en"}, format="json")
    assert response.status_code == 400
    assert "longer than" in response.json()["error"]["message"]


@pytest.mark.django_db
def test_ordinary_templates_are_untouched(api: Any) -> None:
    text = (
        '{% for item in items %}{{ loop.index }}. {{ item.name ~ " x" ~ item.qty }}{% endfor %} '
        '{{ "%5.2f"|format(total) }} {{ "{:>6}".format(code) }} {{ title|center(12) }} {{ (note + "!")|upper }}'
    )
    api.put("/api/v1/templates/order", body(text), format="json")
    payload = {"items": [{"name": "Pen", "qty": 2}, {"name": "Ink", "qty": 1}], "total": 3.5, "code": "A1",
               "title": "Order", "note": "thanks"}  # fmt: skip
    response = api.post("/api/v1/templates/order/preview", {"payload": payload, "locale": "en"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["channels"]["inapp"]["parts"]["body"] == (
        "1. Pen x22. Ink x1  3.50     A1    Order     THANKS!"
    )


@pytest.mark.django_db
def test_previewing_a_draft_needs_the_templates_scope(api: Any, api_client_factory: Any) -> None:
    api.put("/api/v1/templates/draft", {**body("Hi"), "publish": False}, format="json")
    _, sender = api_client_factory(scopes=["send"])
    response = sender.post("/api/v1/templates/draft/preview", {"payload": {}, "locale": "en"}, format="json")
    assert response.status_code == 403 and response.json()["error"]["fields"] == {"scope": ["templates"]}


@pytest.mark.django_db
def test_the_admin_preview_is_bounded_too(client: Any) -> None:
    client.force_login(make_staff_user("staff", superuser=True))
    version = template_put(
        key="bomb", category="transactional", default_locale="en",
        content={"en": {"inapp": {"title": "t", "body": DYNAMIC_BOMBS["namespace_doubling"]}}},
    )  # fmt: skip
    url = reverse("admin:templates_app_templateversion_preview", args=[version.pk])
    response = client.post(url, {"payload": json.dumps(PAYLOAD), "locale": "en"})
    assert response.status_code == 200
    assert "template budget" in response.context["error"]


@pytest.mark.django_db(transaction=True)
def test_a_bomb_fails_its_delivery_with_template_budget_and_workers_keep_serving(api: Any, start_worker: Any) -> None:
    api.put("/api/v1/templates/bomb", body(DYNAMIC_BOMBS["namespace_doubling"]), format="json")
    api.put("/api/v1/templates/fine", body("Hi {{ name }}"), format="json")
    start_worker(queues=["inapp.high", "inapp.low"])
    bomb = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": "u-1"}, "template": "bomb", "payload": PAYLOAD},
        format="json",
    )
    assert bomb.status_code == 202, bomb.content
    failed = wait_for(lambda: Delivery.objects.filter(notification_id=bomb.json()["id"], status="failed").first())
    assert failed.reason == "template_budget" and "template budget" in failed.last_error
    fine = api.post(
        "/api/v1/notifications", {"recipient": {"user_id": "u-1"}, "template": "fine", "payload": {"name": "A"}},
        format="json",
    )  # fmt: skip
    delivered = wait_for(
        lambda: Delivery.objects.filter(notification_id=fine.json()["id"], status__in=["sent", "delivered"]).first()
    )
    assert delivered.reason != "template_budget"


@pytest.mark.pure
def test_guarded_filters_behave_like_jinjas_own() -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from templates_app import budget
    from templates_app.rendering import _GLOBALS, _render_node, compile_string

    sources = [
        '{{ "hello world foo"|truncate(9) }} {{ "a b c d e f"|wordwrap(3) }} {{ [1, 2, 3]|join("-") }}',
        '{{ [1, 2, 3, 4]|slice(2)|list }} {{ [1, 2, 3]|batch(2)|list }} {{ "x"|center(5) }}',
        '{{ "%d-%s"|format(3, "z") }}',
        '{{ x ~ y }} {{ [x, "&"]|join("<br>") }} {{ x|replace("b", "i") }} {{ "a\nb"|indent(2, true) }}',
    ]
    for html in (False, True):
        stock = ImmutableSandboxedEnvironment(autoescape=html, trim_blocks=True, lstrip_blocks=True)
        for source in sources:
            token = budget.start()
            try:
                ours = _render_node(compile_string(source, html=html), {**_GLOBALS, "x": "<b>", "y": 1}, "p")
            finally:
                budget.finish(token)
            assert ours == stock.from_string(source).render(x="<b>", y=1)


def chat_body(text: str, blocks_text: str = "ok") -> dict[str, Any]:
    """Return a template whose chat part has `text` and one Block Kit section of `blocks_text`."""
    section = {"type": "section", "text": {"type": "mrkdwn", "text": blocks_text}}
    return {
        "category": "transactional",
        "default_locale": "en",
        "content": {"en": {"chat": {"text": text, "blocks": [section]}}},
    }


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["format_width", "nested_range"])
@pytest.mark.parametrize("where", ["text", "blocks"])
def test_static_bombs_in_the_chat_part_are_refused_at_save_time(api: Any, name: str, where: str) -> None:
    bomb = STATIC_BOMBS[name]
    template = chat_body(bomb) if where == "text" else chat_body("fine", bomb)
    response = api.put(f"/api/v1/templates/chat-{name}", template, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "template_budget"
    (field,) = response.json()["error"]["fields"]
    assert field.startswith(f"content.en.chat.{where}")
    assert api.put("/api/v1/templates/chat-fine", chat_body("Hi {{ name }}"), format="json").status_code == 201


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["namespace_doubling", "nested_range_from_payload", "replace_amplification"])
@pytest.mark.parametrize("where", ["text", "blocks"])
def test_dynamic_bombs_in_the_chat_part_fail_the_preview_with_400(api: Any, name: str, where: str) -> None:
    bomb = DYNAMIC_BOMBS[name]
    template = chat_body(bomb) if where == "text" else chat_body("fine", bomb)
    assert api.put(f"/api/v1/templates/chat-{name}", template, format="json").status_code == 201
    response = api.post(f"/api/v1/templates/chat-{name}/preview", {"payload": PAYLOAD, "locale": "en"}, format="json")
    assert response.status_code == 400, response.content[:500]
    assert response.json()["error"]["code"] == "template_budget"
    assert len(response.content) < 2000
    api.put("/api/v1/templates/chat-fine", chat_body("Hi {{ name }}", "*{{ name }}*"), format="json")
    ok = api.post("/api/v1/templates/chat-fine/preview", {"payload": {"name": "Ada"}, "locale": "en"}, format="json")
    assert ok.status_code == 200 and ok.json()["channels"]["slack"]["parts"]["text"] == "Hi Ada"
    assert ok.json()["channels"]["slack"]["parts"]["blocks"][0]["text"]["text"] == "*Ada*"


@pytest.mark.django_db(transaction=True)
def test_a_chat_bomb_fails_its_slack_delivery_with_template_budget_and_workers_keep_serving(
    api: Any, start_worker: Any, slack_stub: Any, slack_env: dict[str, str]
) -> None:
    api.put("/api/v1/templates/bomb", chat_body("fine", DYNAMIC_BOMBS["namespace_doubling"]), format="json")
    api.put("/api/v1/templates/fine", chat_body("Hi {{ name }}"), format="json")
    start_worker(queues=["slack.high", "slack.low"], env={**slack_env, "SLACK_PROVIDERS": "slack"})
    recipient = {"chat": {"slack": "#ops"}}
    bomb = api.post("/api/v1/notifications", {"recipient": recipient, "template": "bomb", "payload": PAYLOAD},
                    format="json")  # fmt: skip
    assert bomb.status_code == 202, bomb.content
    failed = wait_for(lambda: Delivery.objects.filter(notification_id=bomb.json()["id"], status="failed").first(), 60)
    assert failed.reason == "template_budget" and "template budget" in failed.last_error
    fine = api.post("/api/v1/notifications", {"recipient": recipient, "template": "fine", "payload": {"name": "A"}},
                    format="json")  # fmt: skip
    wait_for(lambda: Delivery.objects.filter(notification_id=fine.json()["id"], status="sent").first(), 60)
    assert [p["text"] for p in slack_stub.posts()] == ["Hi A"]
