"""Staff see their projects in the admin, in a real headless Chromium against a live server.

`sue` is Support in the project shop and Marketing in blog: she finds shop's delivery to an address both
projects sent to and not blog's, gets a 404 for blog's, resends shop's from its page, and lists shop's
templates and blog's marketing one only; the superuser lists both deliveries.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec

from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from projects.models import Membership, Project
from projects.scoping import owner_scope
from projects.selectors import environment_of
from projects.services import project_create
from templates_app.services import template_put
from tests.browser import PASSWORD, login, submit, wait
from tests.factories import make_delivery, make_staff_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ADDRESS = "ana@example.com"
EMAIL = {"en": {"email": {"subject": "Hi", "text": "Hello"}}}


def _project(slug: str) -> Delivery:
    """Make a project with a client, a transactional and a marketing template, and a sent delivery to ADDRESS."""
    project_create(slug=slug, name=slug.title())
    client, _ = api_client_create(name=f"{slug}-service", project=slug)
    with owner_scope(environment_of(project=slug, mode="live").pk):
        for key, category in (("order_shipped", "transactional"), ("promo", "marketing")):
            template_put(key=key, category=category, default_locale="en", content=EMAIL)
        return make_delivery(client=client, address=ADDRESS, status="sent", provider="sandbox")


def _rows(driver: WebDriver) -> list[str]:
    return [row.text for row in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")]


def test_a_member_sees_and_acts_on_their_projects_only(live_server: Any, browser: WebDriver) -> None:
    shop, blog = _project("shop"), _project("blog")
    sue = make_staff_user("sue", password=PASSWORD)
    Membership.objects.create(user=sue, project=Project.objects.get(slug="shop"), role="support")
    Membership.objects.create(user=sue, project=Project.objects.get(slug="blog"), role="marketing")
    make_staff_user("root", password=PASSWORD, superuser=True)

    login(browser, live_server.url, "sue")
    browser.get(f"{live_server.url}/admin/deliveries/delivery/?q={ADDRESS}")
    rows = wait(browser).until(lambda d: _rows(d))
    assert len(rows) == 1 and str(shop.pk) in rows[0]
    # Blog's delivery is not hers to see: its page is a 404.
    browser.get(f"{live_server.url}/admin/deliveries/delivery/{blog.pk}/change/")
    assert "Not Found" in browser.page_source or "404" in browser.title
    # Shop's she resends from its page, as Support.
    browser.get(f"{live_server.url}/admin/deliveries/delivery/{shop.pk}/change/")
    submit(browser, wait(browser).until(ec.presence_of_element_located((By.ID, "action-resend"))), confirm=True)
    resent = Delivery.objects.get(resent_from=shop.pk)
    assert browser.current_url.endswith(f"/admin/deliveries/delivery/{resent.pk}/change/")
    assert resent.environment_id == environment_of(project="shop", mode="live").pk
    # Templates: shop's two (Support), blog's marketing one (Marketing edits optional categories only).
    browser.get(f"{live_server.url}/admin/templates_app/template/")
    templates = wait(browser).until(lambda d: _rows(d))
    assert sorted(row.split()[0] for row in templates) == ["order_shipped", "promo", "promo"]

    browser.delete_all_cookies()
    login(browser, live_server.url, "root")
    browser.get(f"{live_server.url}/admin/deliveries/delivery/?q={ADDRESS}")
    assert len(wait(browser).until(lambda d: _rows(d))) == 3  # both projects', and shop's resend
    assert User.objects.get(username="sue").project_memberships.count() == 2
