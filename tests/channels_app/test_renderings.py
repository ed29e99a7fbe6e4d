"""A send worker renders each content once: a topic workflow's runs share one rendering, a layout saved is seen.

The send pipeline runs in this process on real rows, Redis and broker; `render_many` is wrapped only to count the
renderings the worker asks for.
"""

from __future__ import annotations

from typing import Any

import pytest

from channels_app import renderings
from channels_app.models import SandboxMessage
from channels_app.services import deliver
from notifier.deliveries.models import Delivery
from notifier.dispatch import fanout
from notifier.workflows.models import WorkflowRun
from notifier.workflows.services import runs_advance
from preferences.services import recipient_upsert
from templates_app import rendering
from tests.conftest import purge_all_queues
from tests.templates_app.test_layouts import EMAIL, LAYOUT_HTML, put_layout, put_template
from tests.workflows.test_workflow_fair_shares import blast, project_client, project_topic


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the renderings the send pipeline asks for: one entry per call, the number of requests in it."""
    calls: list[int] = []
    real = rendering.render_many

    def counted(requests: list[Any]) -> Any:
        calls.append(len(requests))
        return real(requests)

    monkeypatch.setattr("channels_app.services.render_many", counted)
    renderings.forget()
    return calls


def _deliver_in_batches(ids: list[int], size: int) -> int:
    return sum(deliver(ids[i : i + size]).sent for i in range(0, len(ids), size))


@pytest.mark.django_db(transaction=True)
def test_a_topic_workflows_runs_render_once_for_all_their_notifications(renders: list[int]) -> None:
    purge_all_queues()
    a = project_client("proj-a")
    project_topic(a, "everyone", 60)
    trigger = blast(a, "everyone")
    fanout.fanout_run(notification_id=trigger.pk, enqueue_next=False)  # one run per subscriber
    run_ids = sorted(WorkflowRun.objects.filter(notification_id=trigger.pk).values_list("pk", flat=True))
    assert runs_advance(run_ids=run_ids) == {"done": 60}
    deliveries = Delivery.objects.filter(address__startswith="everyone-")
    # Each run sent its own notification, all with the trigger's payload.
    assert deliveries.values("notification_id").distinct().count() == 60
    ids = sorted(deliveries.values_list("pk", flat=True))

    assert _deliver_in_batches(ids, 20) == 60
    # Three batches of twenty notifications: one rendering in all (per notification it was sixty).
    assert sum(renders) == 1, renders
    messages = SandboxMessage.objects.filter(delivery_id__in=ids)
    assert messages.count() == 60
    assert {(m.content["subject"], m.content.get("html")) for m in messages} == {
        (messages[0].content["subject"], messages[0].content.get("html"))
    }
    purge_all_queues()


@pytest.mark.django_db(transaction=True)
def test_a_layout_saved_between_two_sends_of_the_same_content_is_used_by_the_second(
    api: Any, renders: list[int]
) -> None:
    purge_all_queues()
    assert put_layout(api, "brand", {"html": LAYOUT_HTML}).status_code == 201
    assert put_template(api, "shipped", EMAIL, layout="brand").status_code == 201
    recipient_upsert(user_id="lay-1", email="lay-1@example.com")
    body = {
        "recipient": {"user_id": "lay-1"},
        "template": "shipped",
        "channels": ["email"],
        "payload": {"order_id": 7},
    }
    sent: list[Any] = []

    def send() -> str:
        response = api.post("/api/v1/notifications", {**body, "dedup_key": f"lay-{len(sent)}"}, format="json")
        sent.append(response)
        assert response.status_code == 202, response.content
        delivery_id = response.json()["deliveries"][0]["id"]
        assert deliver([delivery_id]).sent == 1
        html: str = SandboxMessage.objects.get(delivery_id=delivery_id).content["html"]
        return html

    first, again = send(), send()
    assert "ACME Inc." in first and again == first
    assert sum(renders) == 1, renders  # the second notification reused the first's rendering

    assert put_layout(api, "brand", {"html": LAYOUT_HTML.replace("ACME Inc.", "ACME GmbH")}).status_code == 201
    after = send()
    assert "ACME GmbH" in after and "ACME Inc." not in after
    assert sum(renders) == 2, renders
    purge_all_queues()


@pytest.mark.pure
def test_renderings_are_kept_by_content_only_while_shared() -> None:
    def key(notification: str, payload: dict[str, Any], *, version: int = 3, locale: str = "en", shared: bool = True):
        return renderings.key(
            notification_id=notification, version_id=version, channel="email", locale=locale, payload=payload,
            shared=shared,
        )  # fmt: skip

    one = key("n1", {"a": 1, "b": [1, 2]})
    # Another notification with the same payload (keys in another order) shares the rendering...
    assert key("n2", {"b": [1, 2], "a": 1}) == one
    # ... not with another payload, version or locale ...
    assert key("n1", {"a": 2, "b": [1, 2]}) != one
    assert key("n1", {"a": 1, "b": [1, 2]}, version=4) != one
    assert key("n1", {"a": 1, "b": [1, 2]}, locale="de") != one
    # ... and, when the generation cannot be checked, only within its own notification.
    assert key("n1", {"a": 1}, shared=False) != key("n2", {"a": 1}, shared=False)
    # A payload orjson cannot encode still has a key.
    assert key("n1", {"a": 2**70}) != key("n1", {"a": 2**70 + 1})


@pytest.mark.pure
def test_a_send_takes_as_many_provider_slots_as_its_rendering_takes_the_workers() -> None:
    from notifier.dispatch.shares import units_per_delivery

    assert units_per_delivery(0.0, 1000) == 1  # a shared or fast rendering: one slot
    assert units_per_delivery(0.001, 1000) == 1  # exactly a slot
    assert units_per_delivery(0.0105, 1000) == 11
    assert units_per_delivery(0.0105, 50) == 1  # a slow provider's slot is longer than the rendering
    assert units_per_delivery(0.5, 50) == 25
