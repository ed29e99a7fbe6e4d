"""Staff see their projects in the admin, with the role they have in each (Django's test client).

Two projects, `shop` and `blog`, each with the same keys (a template `order_shipped` and `promo`, a topic `news`)
and a delivery to the same address. `ann` is Support in shop, `bob` Marketing in blog, `sue` Support in shop and
Marketing in blog, `root` a superuser. Each sees exactly what their roles allow in their projects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifier.campaigns.models import Campaign
from notifier.campaigns.services import campaign_create
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deadletters.models import DeadLetter
from notifier.deliveries.models import Delivery, Notification
from notifier.dispatch import shares
from notifier.staff.services import staff_roles_sync
from preferences.models import Topic
from projects.models import Environment, Membership, Project
from projects.scoping import owner_scope
from projects.selectors import environment_of
from projects.services import project_create
from templates_app.models import Template
from templates_app.services import template_put
from tests.factories import (
    make_dead_letter,
    make_delivery,
    make_delivery_event,
    make_sandbox_message,
    make_staff_user,
    make_topic,
)

pytestmark = pytest.mark.django_db

ADDRESS = "ana@example.com"
EMAIL = {"en": {"email": {"subject": "Hi", "text": "Hello {{ name }}"}}}


@dataclass
class Side:
    """One project's rows."""

    project: Project
    live: Environment
    client: ApiClient
    delivery: Delivery
    templates: dict[str, Template] = field(default_factory=dict)
    topic: Topic | None = None
    campaign: Campaign | None = None
    dead_letter: DeadLetter | None = None


def _side(slug: str) -> Side:
    project = project_create(slug=slug, name=slug.title())
    live = environment_of(project=slug, mode="live")
    client, _ = api_client_create(name=f"{slug}-service", project=slug, scopes=["send"])
    with owner_scope(live.pk):
        delivery = make_delivery(client=client, address=ADDRESS, status="failed", provider="ses")
        make_delivery_event(delivery=delivery, status="failed")
        side = Side(project=project, live=live, client=client, delivery=delivery)
        for key, category in (("order_shipped", "transactional"), ("promo", "marketing")):
            side.templates[key] = template_put(key=key, category=category, default_locale="en", content=EMAIL).template
        side.topic = make_topic(key="news", name="News")
        make_topic(key=f"{slug}-only", name=f"{slug} only")
    side.campaign = campaign_create(client=client, name=f"{slug} spring", template="promo", topic="news", draft=True)
    side.dead_letter = make_dead_letter(delivery=delivery)
    make_sandbox_message(
        delivery_id=delivery.pk, client=client, channel="email", address=ADDRESS, content={"subject": "Hi"}
    )
    return side


def _login(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _member(name: str, **roles: str) -> Client:
    user = make_staff_user(name)
    for slug, role in roles.items():
        Membership.objects.create(user=user, project=Project.objects.get(slug=slug), role=role)
    return _login(user)


@pytest.fixture
def world() -> dict[str, Any]:
    return {
        "shop": _side("shop"),
        "blog": _side("blog"),
        "ann": _member("ann", shop="support"),
        "bob": _member("bob", blog="marketing"),
        "sue": _member("sue", shop="support", blog="marketing"),
        "root": _login(make_staff_user("root", superuser=True)),
    }


def rows(response: Any) -> list[str]:
    """Return the text of each row of a changelist page, as the staff user sees it."""
    assert response.status_code == 200, response.status_code
    table = re.search(r'<table id="result_list">.*?<tbody>(.*?)</tbody>', response.content.decode(), re.S)
    return [re.sub(r"<[^>]+>", " ", row) for row in re.findall(r"<tr.*?</tr>", table.group(1), re.S)] if table else []


LISTS = {
    "deliveries": reverse("admin:deliveries_delivery_changelist"),
    "notifications": reverse("admin:deliveries_notification_changelist"),
    "templates": reverse("admin:templates_app_template_changelist"),
    "campaigns": reverse("admin:campaigns_campaign_changelist"),
    "topics": reverse("admin:preferences_topic_changelist"),
    "dead letters": reverse("admin:deadletters_deadletter_changelist"),
    "sandbox messages": reverse("admin:channels_app_sandboxmessage_changelist"),
}


def test_each_member_lists_the_rows_of_their_projects_that_their_role_there_may_see(world: dict[str, Any]) -> None:
    # Rows per list: ann is Support in shop; bob Marketing in blog (templates of optional categories only);
    # sue both; root everything. None: the list is not for them (403).
    expected: dict[str, dict[str, int | None]] = {
        "ann": {"deliveries": 1, "notifications": 1, "templates": 2, "campaigns": None, "topics": None,
                "dead letters": 1, "sandbox messages": 1},
        "bob": {"deliveries": None, "notifications": None, "templates": 1, "campaigns": 1, "topics": 2,
                "dead letters": None, "sandbox messages": None},
        "sue": {"deliveries": 1, "notifications": 1, "templates": 3, "campaigns": 1, "topics": 2,
                "dead letters": 1, "sandbox messages": 1},
        "root": {"deliveries": 2, "notifications": 2, "templates": 4, "campaigns": 2, "topics": 4,
                 "dead letters": 2, "sandbox messages": 2},
    }  # fmt: skip
    for user, lists in expected.items():
        for name, count in lists.items():
            response = world[user].get(LISTS[name])
            if count is None:
                assert response.status_code == 403, (user, name)
            else:
                assert len(rows(response)) == count, (user, name, rows(response))
    # What sue sees of blog is Marketing's: its promo, not its transactional template; shop's both.
    templates = rows(world["sue"].get(LISTS["templates"]))
    assert sum("order_shipped" in row for row in templates) == 1
    assert sum("promo" in row for row in templates) == 2


def test_search_finds_only_the_members_projects(world: dict[str, Any]) -> None:
    # The same address was sent to in both projects.
    assert len(rows(world["ann"].get(LISTS["deliveries"], {"q": ADDRESS}))) == 1
    assert len(rows(world["root"].get(LISTS["deliveries"], {"q": ADDRESS}))) == 2
    found = rows(world["ann"].get(LISTS["deliveries"], {"q": str(world["blog"].delivery.pk)}))
    assert found == []  # another project's delivery id finds nothing
    assert len(rows(world["bob"].get(LISTS["templates"], {"q": "promo"}))) == 1
    assert len(rows(world["root"].get(LISTS["templates"], {"q": "promo"}))) == 2
    assert len(rows(world["bob"].get(LISTS["topics"], {"q": "only"}))) == 1


def test_another_projects_objects_answer_404(world: dict[str, Any]) -> None:
    shop, blog = world["shop"], world["blog"]
    ann, bob, sue, root = world["ann"], world["bob"], world["sue"], world["root"]
    delivery_page = "admin:deliveries_delivery_change"
    template_page = "admin:templates_app_template_change"
    assert ann.get(reverse(delivery_page, args=[shop.delivery.pk])).status_code == 200
    assert ann.get(reverse(delivery_page, args=[blog.delivery.pk])).status_code == 404
    assert ann.get(reverse(template_page, args=[blog.templates["promo"].pk])).status_code == 404
    assert ann.get(reverse("admin:deliveries_delivery_history", args=[blog.delivery.pk])).status_code == 404
    # sue is Marketing in blog: its promo is hers, its transactional template is not.
    assert sue.get(reverse(template_page, args=[blog.templates["promo"].pk])).status_code == 200
    assert sue.get(reverse(template_page, args=[blog.templates["order_shipped"].pk])).status_code == 404
    assert sue.get(reverse(template_page, args=[shop.templates["order_shipped"].pk])).status_code == 200
    assert sue.get(reverse(delivery_page, args=[blog.delivery.pk])).status_code == 404
    assert bob.get(reverse("admin:campaigns_campaign_progress", args=[shop.campaign.pk])).status_code == 404
    assert bob.get(reverse("admin:campaigns_campaign_progress", args=[blog.campaign.pk])).status_code == 200
    published = blog.templates["promo"].published_version_id
    assert ann.get(reverse("admin:templates_app_templateversion_preview", args=[published])).status_code == 404
    # An action's own URL too: ann cannot resend blog's delivery.
    assert ann.post(reverse("admin:deliveries_delivery_resend", args=[blog.delivery.pk])).status_code == 404
    assert not Delivery.objects.filter(resent_from=blog.delivery.pk).exists()
    for page, obj in ((delivery_page, blog.delivery), (template_page, blog.templates["order_shipped"])):
        assert root.get(reverse(page, args=[obj.pk])).status_code == 200


def test_a_members_role_applies_in_its_own_project_only(world: dict[str, Any]) -> None:
    shop, blog, sue = world["shop"], world["blog"], world["sue"]
    template_page = "admin:templates_app_template_change"
    # Support in shop: edits templates but may not publish; Marketing in blog: publishes.
    shop_page = sue.get(reverse(template_page, args=[shop.templates["promo"].pk])).content.decode()
    blog_page = sue.get(reverse(template_page, args=[blog.templates["promo"].pk])).content.decode()
    assert 'name="publish"' not in shop_page and 'name="publish"' in blog_page
    with owner_scope(shop.live.pk):
        shop_draft = template_put(key="promo", category="marketing", default_locale="en", content=EMAIL, publish=False)
    with owner_scope(blog.live.pk):
        blog_draft = template_put(key="promo", category="marketing", default_locale="en", content=EMAIL, publish=False)
    publish = "admin:templates_app_templateversion_publish"
    assert sue.post(reverse(publish, args=[shop_draft.pk])).status_code == 403
    assert sue.post(reverse(publish, args=[blog_draft.pk])).status_code == 302
    assert Template.objects.get(pk=blog_draft.template_id).published_version_id == blog_draft.pk
    assert Template.objects.get(pk=shop_draft.template_id).published_version_id != shop_draft.pk
    # Support's delivery buttons in shop; Marketing's campaign buttons in blog.
    delivery_page = sue.get(reverse("admin:deliveries_delivery_change", args=[shop.delivery.pk])).content.decode()
    assert 'id="action-resend"' in delivery_page
    Campaign.objects.filter(pk=blog.campaign.pk).update(status="scheduled")
    progress = sue.get(reverse("admin:campaigns_campaign_progress", args=[blog.campaign.pk])).content.decode()
    assert 'id="campaign-pause"' in progress
    # A member's groups do not count: sue, put in the Support group too, still is Marketing in blog.
    staff_roles_sync()  # the group as the migration makes it (a flushed database may have lost it)
    User.objects.get(username="sue").groups.add(Group.objects.get(name="Support"))
    assert sue.get(reverse("admin:deliveries_delivery_change", args=[blog.delivery.pk])).status_code == 404


def test_the_resend_action_resends_only_the_members_projects_deliveries(world: dict[str, Any]) -> None:
    shop, blog = world["shop"], world["blog"]
    selected = [shop.delivery.pk, blog.delivery.pk]
    response = world["ann"].post(LISTS["deliveries"], {"action": "resend_selected", "_selected_action": selected})
    assert response.status_code == 302
    resent = Delivery.objects.get(resent_from=shop.delivery.pk)
    assert not Delivery.objects.filter(resent_from=blog.delivery.pk).exists()
    # The resend is shop's, as the original: its notification is in shop's environment.
    assert resent.environment_id == shop.live.pk
    assert Notification.objects.get(pk=resent.notification_id).environment_id == shop.live.pk


def test_the_dead_letter_replay_action_replays_only_the_members_projects(world: dict[str, Any]) -> None:
    shop, blog = world["shop"], world["blog"]
    ann = User.objects.get(username="ann")
    selected = {"action": "replay_selected", "_selected_action": [shop.dead_letter.pk, blog.dead_letter.pk]}
    # Support reads dead letters; replaying takes change_deadletter, which an administrator grants ann herself.
    world["ann"].post(LISTS["dead letters"], selected)
    assert DeadLetter.objects.filter(status="pending").count() == 2
    ann.user_permissions.add(Permission.objects.get(codename="change_deadletter"))
    response = world["ann"].post(LISTS["dead letters"], selected)
    assert response.status_code == 302
    assert DeadLetter.objects.get(pk=shop.dead_letter.pk).status == "replayed"
    assert DeadLetter.objects.get(pk=blog.dead_letter.pk).status == "pending"


def _wizard(staff: Client, **answers: Any) -> Any:
    data = {"step": "1", "name": "Autumn", "time_zone": "UTC", "rate_per_second": "10", "payload": "{}", "_next": "1"}
    return staff.post(reverse("admin:campaigns_campaign_wizard"), {**data, **answers})


def test_the_campaign_wizard_offers_and_takes_only_one_environment_of_the_members_projects(
    world: dict[str, Any],
) -> None:
    shop, blog, bob = world["shop"], world["blog"], world["bob"]
    page = bob.get(reverse("admin:campaigns_campaign_wizard")).content.decode()
    assert "blog-service" in page and "shop-service" not in page
    assert "blog-only" in page and "shop-only" not in page
    # Another project's topic, with bob's client: refused beside the topic.
    refused = _wizard(bob, client=blog.client.pk, topic="shop-only")
    assert refused.context["step"] == 1 and "topic" in refused.context["form"].errors
    # Another project's client: not one of the choices.
    refused = _wizard(bob, client=shop.client.pk, topic="news")
    assert refused.context["step"] == 1 and "client" in refused.context["form"].errors
    # news exists in both: the client's environment's is the one taken, and its templates are offered next.
    taken = _wizard(bob, client=blog.client.pk, topic="news")
    assert taken.context["step"] == 2, taken.context["form"].errors
    assert [key for key, _ in taken.context["form"].fields["template"].choices] == ["", "promo"]
    # A superuser sees every project, and still cannot mix two environments.
    refused = _wizard(world["root"], client=blog.client.pk, topic="shop-only")
    assert "topic" in refused.context["form"].errors


def test_the_campaign_form_refuses_a_topic_of_another_project(world: dict[str, Any]) -> None:
    shop, blog = world["shop"], world["blog"]
    url = reverse("admin:campaigns_campaign_change", args=[blog.campaign.pk])
    data = {
        "name": "blog spring", "client": blog.client.pk, "template_key": "promo", "category": "marketing",
        "payload": "{}", "timezone": "UTC", "rate_per_second": "100", "topic": shop.topic.pk,
    }  # fmt: skip
    # bob is offered only blog's topics: shop's is not a valid choice.
    refused = world["bob"].post(url, data)
    assert refused.status_code == 200 and "topic" in refused.context["adminform"].form.errors
    # A superuser is offered every topic, and still refused one of another environment than the client's.
    refused = world["root"].post(url, data)
    assert refused.status_code == 200
    assert refused.context["adminform"].form.errors["topic"] == [
        "The topic must be of blog/live, the client's environment."
    ]
    assert Campaign.objects.get(pk=blog.campaign.pk).topic_id == blog.topic.pk
    accepted = world["bob"].post(url, {**data, "topic": blog.topic.pk, "name": "blog autumn"})
    assert accepted.status_code == 302, accepted.context["adminform"].form.errors
    assert Campaign.objects.get(pk=blog.campaign.pk).name == "blog autumn"


def test_a_new_objects_environment_is_one_of_the_members_projects(world: dict[str, Any]) -> None:
    shop, blog, bob = world["shop"], world["blog"], world["bob"]
    blog_test = environment_of(project="blog", mode="test")
    page = bob.get(reverse("admin:preferences_topic_add"))
    choices = {str(env) for env in page.context["adminform"].form.fields["environment"].queryset}
    assert choices == {"blog/live", "blog/test"}
    refused = bob.post(reverse("admin:preferences_topic_add"), {"environment": shop.live.pk, "key": "x", "name": "X"})
    assert refused.status_code == 200 and "environment" in refused.context["adminform"].form.errors
    assert not Topic.objects.filter(key="x").exists()
    made = bob.post(reverse("admin:preferences_topic_add"), {"environment": blog_test.pk, "key": "x", "name": "X"})
    assert made.status_code == 302
    assert Topic.objects.get(key="x").environment_id == blog_test.pk
    # A template made in the admin is written in the chosen environment, through the same services.
    form = {
        "environment": blog_test.pk, "key": "welcome", "category": "marketing", "default_locale": "en",
        "c__en__email__subject": "Welcome", "c__en__email__text": "Hello",
        "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0",
    }  # fmt: skip
    assert bob.post(reverse("admin:templates_app_template_add"), form).status_code == 302
    assert Template.objects.get(key="welcome").environment_id == blog_test.pk
    refused = bob.post(reverse("admin:templates_app_template_add"), {**form, "environment": shop.live.pk, "key": "w2"})
    assert refused.status_code == 200 and "environment" in refused.context["adminform"].form.errors
    # Fixed afterwards: the change page shows it, and a post cannot move it.
    topic = Topic.objects.get(key="x")
    change = reverse("admin:preferences_topic_change", args=[topic.pk])
    bob.post(change, {"environment": blog.live.pk, "key": "x", "name": "X2"})
    topic.refresh_from_db()
    assert (topic.name, topic.environment_id) == ("X2", blog_test.pk)


def test_the_dashboard_counts_only_the_members_projects(world: dict[str, Any]) -> None:
    shop = world["shop"]
    with owner_scope(shop.live.pk):
        make_delivery_event(delivery=shop.delivery, status="sent", at=timezone.now())
    response = world["ann"].get(reverse("notifier-dashboard"))
    assert response.status_code == 200
    email = next(row for row in response.context["outcomes"] if row["channel"] == "email")
    assert (email["failed"], email["sent"]) == (1, 1)  # shop's, not blog's failure
    assert dict(response.context["dead_letters_pending"]) == {"email": 1}
    html = response.content.decode()
    assert 'id="ops-scope"' in html and "shop" in html
    assert "Dead-letter queue" not in html and "chart-queue-history" not in html  # the installation's
    everything = world["root"].get(reverse("notifier-dashboard"))
    email = next(row for row in everything.context["outcomes"] if row["channel"] == "email")
    assert email["failed"] == 2 and dict(everything.context["dead_letters_pending"]) == {"email": 2}
    assert "chart-queue-history" in everything.content.decode()
    assert world["bob"].get(reverse("notifier-dashboard")).status_code == 403


def test_the_dashboards_fair_shares_show_each_member_their_projects_rows(world: dict[str, Any], settings: Any) -> None:
    # Both projects' broadcasts ask a throttled email queue; each has a template that renders slowly.
    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": 1000, "burst": 1000}}
    shares.reset(["email.low"])
    shop, blog = world["shop"], world["blog"]
    for side, backlog in ((shop, 700), (blog, 300)):
        granted = shares.ask(
            "email.low", rate=1000, project=side.project.pk, weight=1, flow=f"b-{side.project.slug}", want=100,
            backlog=backlog,
        )  # fmt: skip
        assert granted.granted == 100, granted
    shares.render_cost_record({(shop.live.pk, "order_shipped"): 0.0123, (blog.live.pk, "promo"): 0.0456})

    def fair(client: Client) -> tuple[list[tuple[str, int]], list[tuple[str, str, float]], str]:
        response = client.get(reverse("notifier-dashboard"))
        assert response.status_code == 200
        html = response.content.decode()
        table = re.search(r'id="ops-fair-shares".*?</div>', html, re.S)
        assert table is not None
        return (
            [(row["project"], row["backlog"]) for row in response.context["fair_shares"]],
            [(row["project"], row["template"], row["milliseconds"]) for row in response.context["render_costs"]],
            table.group(0),
        )

    shares_seen, costs, html = fair(world["root"])
    assert shares_seen == [("blog", 200), ("shop", 600)], shares_seen
    assert costs == [("blog", "promo", 45.6), ("shop", "order_shipped", 12.3)]
    assert "blog" in html and "45.6 ms" in html and "12.3 ms" in html
    # ann (Support in shop) sees shop's rows only.
    shares_seen, costs, html = fair(world["ann"])
    assert [project for project, _ in shares_seen] == ["shop"]
    assert costs == [("shop", "order_shipped", 12.3)]
    assert "blog" not in html and "45.6 ms" not in html and "12.3 ms" in html
    shares.reset(["email.low"])


def test_a_new_api_keys_environment_is_chosen_and_gives_its_mode(world: dict[str, Any]) -> None:
    blog_test = environment_of(project="blog", mode="test")
    add = reverse("admin:clients_apiclient_add")
    form = {"name": "blog-staging", "scopes": ["send"], "is_active": "on", "environment": blog_test.pk}
    assert world["root"].post(add, form).status_code == 200  # the page that shows the new key once
    made = ApiClient.objects.get(name="blog-staging")
    assert (made.environment_id, made.mode) == (blog_test.pk, "test")
    # A member given API clients chooses among their projects' environments, and must choose one.
    bob = User.objects.get(username="bob")
    bob.user_permissions.add(*Permission.objects.filter(codename__in=["add_apiclient", "view_apiclient"]))
    page = world["bob"].get(add)
    assert {str(env) for env in page.context["adminform"].form.fields["environment"].queryset} == {
        "blog/live",
        "blog/test",
    }
    refused = world["bob"].post(add, {**form, "name": "x", "environment": ""})
    assert refused.status_code == 200 and "environment" in refused.context["adminform"].form.errors
    refused = world["bob"].post(add, {**form, "name": "x", "environment": world["shop"].live.pk})
    assert refused.status_code == 200 and "environment" in refused.context["adminform"].form.errors
    assert not ApiClient.objects.filter(name="x").exists()
