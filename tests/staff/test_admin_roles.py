"""Staff roles: the Support and Marketing groups, create_staff_user, what each may open, and the audit of it."""

from __future__ import annotations

import importlib
import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from notifier.staff.roles import ROLE_PERMISSIONS
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from templates_app.models import Template
from templates_app.services import template_put
from tests.factories import make_delivery

pytestmark = pytest.mark.django_db

SMS = {"en": {"sms": {"text": "Hi {{ name }}"}}}


def _staff(name: str, role: str, monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setenv("STAFF_USER_PASSWORD", "pw-role-123456")
    call_command("create_staff_user", name, "--role", role, stdout=io.StringIO())
    client = Client()
    assert client.login(username=name, password="pw-role-123456")
    return client


def test_the_migration_creates_both_groups_with_exactly_their_permissions() -> None:
    # The migration's own function, on the app state it runs in: a transactional test's flush earlier on this
    # worker empties auth_group, so the groups the test database was migrated with may be gone by now.
    Group.objects.filter(name__in=list(ROLE_PERMISSIONS)).delete()
    migration = importlib.import_module("notifier.staff.migrations.0001_roles")
    migration.create_roles(MigrationLoader(connection).project_state(("staff", "0001_roles")).apps, None)
    for role, names in ROLE_PERMISSIONS.items():
        group = Group.objects.get(name=role)
        held = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
        assert held == set(names)
    support = set(ROLE_PERMISSIONS["Support"])
    assert "templates_app.publish_template" not in support
    assert not any("campaign" in name for name in support)


def test_create_staff_user_prints_a_one_time_password_once_and_audits() -> None:
    out = io.StringIO()
    call_command("create_staff_user", "sam", "--role", "support", "--email", "sam@example.com", stdout=out)
    password = out.getvalue().split("One-time password (shown once): ")[1].strip()
    user = User.objects.get(username="sam")
    assert user.is_staff and not user.is_superuser
    assert list(user.groups.values_list("name", flat=True)) == ["Support"]
    assert Client().login(username="sam", password=password)
    assert AuditEntry.objects.filter(action="staff_user.create", target_id=str(user.pk)).exists()
    with pytest.raises(Exception, match="exists already"):
        call_command("create_staff_user", "sam", "--role", "support", stdout=io.StringIO())


def test_support_works_deliveries_and_templates_but_cannot_publish_or_open_campaigns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = _staff("sue", "support", monkeypatch)
    v1 = template_put(key="t", category="transactional", default_locale="en", content=SMS)
    v2 = template_put(key="t", category="transactional", default_locale="en", content=SMS, publish=False)
    delivery = make_delivery()
    assert client.get(reverse("admin:deliveries_delivery_change", args=[delivery.pk])).status_code == 200
    assert (
        'id="action-resend"'
        in client.get(reverse("admin:deliveries_delivery_change", args=[delivery.pk])).content.decode()
    )
    assert client.get(reverse("admin:templates_app_template_change", args=[v1.template.pk])).status_code == 200
    assert client.get(reverse("admin:templates_app_templateversion_publish", args=[v2.pk])).status_code == 403
    assert client.post(reverse("admin:templates_app_templateversion_publish", args=[v2.pk])).status_code == 403
    assert Template.objects.get(key="t").published_version_id == v1.pk
    assert client.get(reverse("admin:campaigns_campaign_changelist")).status_code == 403
    assert client.get(reverse("admin:campaigns_campaign_add")).status_code == 403

    # Given publish_template by an administrator, the same user may publish.
    from django.contrib.auth.models import Permission

    User.objects.get(username="sue").user_permissions.add(Permission.objects.get(codename="publish_template"))
    client.post(reverse("admin:templates_app_templateversion_publish", args=[v2.pk]))
    assert Template.objects.get(key="t").published_version_id == v2.pk


def test_marketing_sees_only_optional_templates_and_campaigns_not_deliveries(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _staff("max", "marketing", monkeypatch)
    otp = template_put(key="otp", category="security", default_locale="en", content=SMS)
    promo = template_put(key="promo", category="marketing", default_locale="en", content=SMS)
    listing = client.get(reverse("admin:templates_app_template_changelist")).content.decode()
    assert "promo" in listing and ">otp<" not in listing
    # Not theirs to see: a 404, as an object of a project they are not a member of.
    assert client.get(reverse("admin:templates_app_template_change", args=[otp.template.pk])).status_code == 404
    assert client.get(reverse("admin:templates_app_template_change", args=[promo.template.pk])).status_code == 200
    assert client.get(reverse("admin:templates_app_templateversion_publish", args=[otp.pk])).status_code == 404
    assert client.get(reverse("admin:campaigns_campaign_changelist")).status_code == 200
    assert client.get(reverse("admin:deliveries_delivery_changelist")).status_code == 403
    # A marketer cannot create a template of a category that is not optional.
    response = client.post(
        reverse("admin:templates_app_template_add"),
        {
            "environment": str(DEFAULT_LIVE_ENVIRONMENT_ID),
            "key": "otp2",
            "category": "security",
            "default_locale": "en",
            "c__en__sms__text": "Code {{ c }}",
            "versions-TOTAL_FORMS": "0",
            "versions-INITIAL_FORMS": "0",
            "versions-MIN_NUM_FORMS": "0",
            "versions-MAX_NUM_FORMS": "0",
        },
    )
    assert response.status_code == 200 and "category" in response.context["adminform"].form.errors
    assert not Template.objects.filter(key="otp2").exists()


def test_every_admin_change_is_in_the_audit_log(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _staff("sue", "support", monkeypatch)
    v1 = template_put(key="t", category="transactional", default_locale="en", content=SMS)
    url = reverse("admin:templates_app_template_change", args=[v1.template.pk])
    data = {
        "key": "t",
        "category": "transactional",
        "default_locale": "en",
        "description": "Shipping texts",
        "c__en__sms__text": "Hi {{ name }}",
        "versions-TOTAL_FORMS": "1",
        "versions-INITIAL_FORMS": "1",
        "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "0",
    }
    assert client.post(url, data).status_code == 302
    entry = AuditEntry.objects.get(action="admin.change")
    assert (entry.actor_name, entry.target_type, entry.target_id) == (
        "sue",
        "templates_app.template",
        str(v1.template.pk),
    )
    assert AuditEntry.objects.filter(action="template.describe", actor_name="sue").exists()


def test_create_staff_user_with_a_project_makes_a_member_of_it_in_the_role(monkeypatch: pytest.MonkeyPatch) -> None:
    from projects.models import Membership
    from projects.scoping import owner_scope
    from projects.selectors import environment_of
    from projects.services import project_create
    from tests.factories import make_api_client

    project_create(slug="shop")
    with owner_scope(environment_of(project="shop", mode="live").pk):
        shop = make_delivery(client=make_api_client(environment=environment_of(project="shop", mode="live")))
    default = make_delivery()
    monkeypatch.setenv("STAFF_USER_PASSWORD", "pw-role-123456")
    out = io.StringIO()
    call_command("create_staff_user", "sam", "--role", "support", "--project", "shop", stdout=out)
    assert "in project shop" in out.getvalue()
    user = User.objects.get(username="sam")
    assert list(Membership.objects.filter(user=user).values_list("project__slug", "role")) == [("shop", "support")]
    assert not user.groups.exists()
    client = Client()
    assert client.login(username="sam", password="pw-role-123456")
    assert client.get(reverse("admin:deliveries_delivery_change", args=[shop.pk])).status_code == 200
    assert client.get(reverse("admin:deliveries_delivery_change", args=[default.pk])).status_code == 404
    with pytest.raises(Exception, match="No project 'nowhere'"):
        call_command("create_staff_user", "kim", "--role", "support", "--project", "nowhere", stdout=io.StringIO())
