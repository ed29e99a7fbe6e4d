"""The in-app inbox: listing with keyset pagination and unread counts, marking read (→ `opened`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import include, path
from rest_framework.test import APIClient

from notifier.clients.models import ApiClient
from notifier.deliveries.models import Delivery, DeliveryEvent
from preferences.models import Recipient
from tests.factories import make_delivery, make_recipient

# The inbox routes (until the root URL conf includes them) next to the rest of /api/v1/ for the end-to-end test.
urlpatterns = [path("api/v1/", include("notifier.inbox.urls")), path("api/v1/", include("notifier.urls"))]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


def make_inapp(
    service: ApiClient,
    recipient: Recipient,
    title: str,
    *,
    status: str = Delivery.Status.SENT,
    category: str = "social",
    channel: str = "inapp",
) -> Delivery:
    """Create an in-app delivery as the worker leaves it once stored: `sent`, content {title, body}."""
    return make_delivery(
        client=service,
        recipient=recipient,
        channel=channel,
        status=status,
        category=category,
        template_key="friend_request",
        priority="normal",
        address=recipient.user_id,
        provider="inapp",
        content={"title": title, "body": f"body of {title}"},
    )


def inbox_url(user_id: str, suffix: str = "") -> str:
    return f"/api/v1/recipients/{user_id}/inbox{suffix}"


def test_lists_newest_first_with_content_category_and_unread_count(service: ApiClient, api: APIClient) -> None:
    me = make_recipient()
    first = make_inapp(service, me, "first", category="social")
    second = make_inapp(service, me, "second", category="security")
    resp = api.get(inbox_url(me.user_id))
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert [i["id"] for i in body["items"]] == [second.pk, first.pk]
    item = body["items"][0]
    assert (item["title"], item["body"], item["category"], item["read_at"]) == (
        "second",
        "body of second",
        "security",
        None,
    )
    assert item["created_at"]
    assert body["unread_count"] == 2
    assert body["next_cursor"] is None


def test_only_this_recipients_stored_inapp_deliveries_are_listed(service: ApiClient, api: APIClient) -> None:
    me, other = make_recipient(), make_recipient()
    mine = make_inapp(service, me, "mine")
    make_inapp(service, other, "theirs")
    make_inapp(service, me, "still queued", status=Delivery.Status.QUEUED)
    make_inapp(service, me, "suppressed", status=Delivery.Status.SUPPRESSED)
    make_inapp(service, me, "an email", channel="email")
    body = api.get(inbox_url(me.user_id)).json()
    assert [i["id"] for i in body["items"]] == [mine.pk]
    assert body["unread_count"] == 1


def test_keyset_pagination_walks_every_item_once(service: ApiClient, api: APIClient) -> None:
    me = make_recipient()
    created = [make_inapp(service, me, f"n{i}").pk for i in range(5)]
    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        body = api.get(inbox_url(me.user_id), params).json()
        pages += 1
        seen += [i["id"] for i in body["items"]]
        assert body["unread_count"] == 5
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(created, reverse=True)
    assert pages == 3


def test_new_items_arriving_between_pages_do_not_shift_the_next_page(service: ApiClient, api: APIClient) -> None:
    me = make_recipient()
    old = [make_inapp(service, me, f"n{i}").pk for i in range(3)]
    first = api.get(inbox_url(me.user_id), {"limit": 2}).json()
    make_inapp(service, me, "newer")
    second = api.get(inbox_url(me.user_id), {"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [i["id"] for i in second["items"]] == [old[0]]


def test_read_one_sets_read_at_and_opens_once(service: ApiClient, api: APIClient) -> None:
    me = make_recipient()
    d = make_inapp(service, me, "hello")
    other = make_inapp(service, me, "other")
    resp = api.post(inbox_url(me.user_id, f"/{d.pk}/read"))
    assert resp.status_code == 200, resp.content
    assert resp.json()["id"] == d.pk and resp.json()["read_at"] is not None
    d.refresh_from_db()
    assert d.status == "opened" and d.read_at is not None
    assert list(d.events.values_list("status", flat=True)) == ["opened"]
    # Again: the same answer, no second event, no new read_at.
    again = api.post(inbox_url(me.user_id, f"/{d.pk}/read"))
    assert again.status_code == 200
    assert again.json()["read_at"] == resp.json()["read_at"]
    assert d.events.count() == 1
    other.refresh_from_db()
    assert other.status == "sent" and other.read_at is None
    body = api.get(inbox_url(me.user_id), {"unread": "true"}).json()
    assert [i["id"] for i in body["items"]] == [other.pk]
    assert body["unread_count"] == 1


def test_read_a_delivered_item_opens_it(service: ApiClient, api: APIClient) -> None:
    me = make_recipient()
    d = make_inapp(service, me, "hello", status=Delivery.Status.DELIVERED)
    assert api.post(inbox_url(me.user_id, f"/{d.pk}/read")).status_code == 200
    d.refresh_from_db()
    assert d.status == "opened"


def test_read_all_opens_every_unread_item(service: ApiClient, api: APIClient) -> None:
    me, other = make_recipient(), make_recipient()
    read_before = make_inapp(service, me, "already read")
    api.post(inbox_url(me.user_id, f"/{read_before.pk}/read"))
    unread = [make_inapp(service, me, f"n{i}") for i in range(3)]
    theirs = make_inapp(service, other, "theirs")
    queued = make_inapp(service, me, "queued", status=Delivery.Status.QUEUED)
    resp = api.post(inbox_url(me.user_id, "/read-all"))
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"marked_read": 3, "unread_count": 0}
    for d in unread:
        d.refresh_from_db()
        assert d.status == "opened" and d.read_at is not None
    assert DeliveryEvent.objects.filter(delivery__in=unread, status="opened").count() == 3
    assert read_before.events.count() == 1
    for d in (theirs, queued):
        before = d.status
        d.refresh_from_db()
        assert d.status == before and d.read_at is None
    assert api.post(inbox_url(me.user_id, "/read-all")).json() == {"marked_read": 0, "unread_count": 0}


def test_cannot_read_someone_elses_or_an_unstored_item(service: ApiClient, api: APIClient) -> None:
    me, other = make_recipient(), make_recipient()
    theirs = make_inapp(service, other, "theirs")
    queued = make_inapp(service, me, "queued", status=Delivery.Status.QUEUED)
    for d in (theirs, queued):
        resp = api.post(inbox_url(me.user_id, f"/{d.pk}/read"))
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "not_found"
        status = d.status
        d.refresh_from_db()
        assert d.status == status and d.read_at is None and d.events.count() == 0


@pytest.mark.parametrize(("method", "suffix"), [("get", ""), ("post", "/read-all"), ("post", "/1/read")])
def test_unknown_user_is_a_404(api: APIClient, method: str, suffix: str) -> None:
    resp = getattr(api, method)(inbox_url("nobody", suffix))
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("params", "field"), [({"cursor": "abc"}, "cursor"), ({"limit": "0"}, "limit")])
def test_bad_query_parameters_are_400s_naming_the_field(api: APIClient, params: dict[str, str], field: str) -> None:
    me = make_recipient()
    resp = api.get(inbox_url(me.user_id), params)
    assert resp.status_code == 400
    assert field in resp.json()["error"]["fields"]


def test_requires_an_api_key(service: ApiClient) -> None:
    me = make_recipient()
    d = make_inapp(service, me, "hello")
    anonymous = APIClient()
    assert anonymous.get(inbox_url(me.user_id)).status_code == 401
    assert anonymous.post(inbox_url(me.user_id, f"/{d.pk}/read")).status_code == 401
    d.refresh_from_db()
    assert d.status == "sent"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_end_to_end_sent_through_the_api_stored_by_a_worker_read_in_the_inbox(
    service: ApiClient, api: APIClient, start_worker: Any
) -> None:
    from templates_app.services import template_put
    from tests.conftest import wait_for

    template_put(
        key="friend_request",
        category="social",
        default_locale="en",
        content={"en": {"inapp": {"title": "Hi {{ name }}", "body": "{{ name }} wants to be friends"}}},
    )
    me = make_recipient(user_id="u-e2e")
    start_worker(queues=["inapp.high", "inapp.low"])
    resp = api.post(
        "/api/v1/notifications",
        {"recipient": {"user_id": me.user_id}, "category": "social", "template": "friend_request",
         "payload": {"name": "Ada"}, "channels": ["inapp"]},
        format="json",
    )  # fmt: skip
    assert resp.status_code == 202, resp.content

    def stored() -> dict[str, Any] | None:
        page = api.get(inbox_url(me.user_id)).json()
        return page if page["items"] else None

    body = wait_for(stored, timeout=60)
    assert body["unread_count"] == 1
    item = body["items"][0]
    assert (item["title"], item["body"], item["category"]) == ("Hi Ada", "Ada wants to be friends", "social")
    assert api.post(inbox_url(me.user_id, f"/{item['id']}/read")).status_code == 200
    d = Delivery.objects.get(pk=item["id"])
    assert d.status == "opened"
    assert list(d.events.order_by("id").values_list("status", flat=True)) == ["queued", "sending", "sent", "opened"]
