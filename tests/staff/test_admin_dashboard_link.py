"""The operations dashboard is found from the admin: linked on the index and in the navigation for the roles that may
open it (notifier.staff.roles.may_see_dashboard), absent and refused (403) for the others. In headless Chromium."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec

from tests.browser import login, staff_user, wait
from tests.factories import make_staff_user


@pytest.mark.django_db(transaction=True)
def test_support_finds_the_dashboard_from_the_admin_index_and_marketing_does_not(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_user("sue", "support", monkeypatch)
    staff_user("mark", "marketing", monkeypatch)
    login(browser, live_server.url, "sue")
    index = browser.find_element(By.ID, "content-main")
    link = browser.find_element(By.CSS_SELECTOR, "#ops-links tr.model-dashboard a[href='/admin/notifier/dashboard/']")
    assert link.text == "Operations dashboard"
    assert "Deliveries" in index.text  # the applications are still listed below it
    link.click()
    wait(browser, 60).until(ec.presence_of_element_located((By.ID, "ops-charts")))
    assert browser.title.startswith("Operations dashboard")
    # The navigation sidebar of every admin page has it too, marked as the current page here.
    current = browser.find_element(By.CSS_SELECTOR, "#nav-sidebar tr.model-dashboard a")
    assert current.get_attribute("aria-current") == "page"
    assert current.get_attribute("textContent").strip() == "Operations dashboard"
    browser.get(f"{live_server.url}/admin/deliveries/delivery/")
    assert browser.find_element(By.CSS_SELECTOR, "#nav-sidebar a[href='/admin/notifier/dashboard/']")

    browser.delete_all_cookies()
    login(browser, live_server.url, "mark")
    assert "Campaigns" in browser.find_element(By.ID, "content-main").text
    assert not browser.find_elements(By.CSS_SELECTOR, "a[href='/admin/notifier/dashboard/']")
    browser.get(f"{live_server.url}/admin/notifier/dashboard/")
    assert "403" in browser.title or "Forbidden" in browser.page_source


@pytest.mark.django_db
def test_a_superuser_sees_the_link_and_an_anonymous_visitor_is_sent_to_log_in() -> None:
    client = Client()
    assert "/admin/login/" in client.get("/admin/notifier/dashboard/")["Location"]
    client.force_login(make_staff_user("root", superuser=True))
    assert 'href="/admin/notifier/dashboard/"' in client.get("/admin/").content.decode()
