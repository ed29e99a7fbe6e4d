"""The admin's import of recipients, in a real headless Chromium against a live server and a real Celery worker.

A superuser uploads a CSV, maps its columns, runs a dry run (nothing written; the counts and the refused row
shown), then imports for real: the maintenance worker writes the recipients, the page follows its progress
and names the refused row. A JSON Lines upload is mapped by its objects' keys (a nested `chat` object
included) and imported straight away.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from audit.models import AuditEntry
from preferences.models import Recipient, RecipientImport, Subscription
from preferences.services import topic_upsert
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from projects.scoping import owner_scope
from tests.browser import PASSWORD, login, screenshot, submit, wait
from tests.factories import make_staff_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CSV = (
    "id,E-Mail,locale,Favourite colour\n"
    "u-1,one@example.com,de,blue\n"
    "u-2,two@example.com,en-GB,red\n"
    "u-3,not an email,fr,green\n"
    "u-4,four@example.com,,green\n"
)


def _field(driver: WebDriver, name: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, f".field-{name} .readonly").text).lower()


def _finished(driver: WebDriver) -> bool:
    driver.refresh()
    return _field(driver, "status") in ("done", "failed")


def test_upload_map_dry_run_then_import(
    live_server: Any, browser: WebDriver, start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    with owner_scope(DEFAULT_LIVE_ENVIRONMENT_ID):
        topic_upsert(key="news", name="News")
    start_worker(queues=["maintenance"], concurrency=1)
    make_staff_user("root", password=PASSWORD, superuser=True)
    path = tmp_path / "customers.csv"
    path.write_text(CSV)

    login(browser, live_server.url, "root")
    browser.get(f"{live_server.url}/admin/preferences/recipientimport/add/")
    Select(browser.find_element(By.NAME, "environment")).select_by_value(str(DEFAULT_LIVE_ENVIRONMENT_ID))
    browser.find_element(By.NAME, "upload").send_keys(str(path))
    browser.find_element(By.NAME, "topic_key").send_keys("news")
    submit(browser, browser.find_element(By.NAME, "_save"))

    # The columns: E-Mail and locale found by name, id mapped by hand, the colour left out.
    assert "/mapping/" in browser.current_url
    selects = {
        s.get_attribute("name"): Select(s) for s in browser.find_elements(By.CSS_SELECTOR, "#mapping-form select")
    }
    assert [s.first_selected_option.text for s in selects.values()] == ["(ignore)", "email", "locale", "(ignore)"]
    submit(browser, browser.find_element(By.ID, "start-dry-run"))
    assert "Map one column to user_id." in browser.find_element(By.ID, "mapping-form").text
    Select(browser.find_element(By.NAME, "column_0")).select_by_value("user_id")
    submit(browser, browser.find_element(By.ID, "start-dry-run"))

    wait(browser, 90).until(_finished)
    assert _field(browser, "status") == "done"
    assert (_field(browser, "created"), _field(browser, "updated"), _field(browser, "refused")) == ("3", "0", "1")
    refused = browser.find_element(By.ID, "refused-rows").text
    assert "4 email Enter a valid email address." in refused
    assert not Recipient.objects.exists()  # a dry run writes nothing

    submit(browser, browser.find_element(By.ID, "import-for-real"))
    wait(browser, 90).until(_finished)
    assert _field(browser, "status") == "done"
    assert (_field(browser, "created"), _field(browser, "refused")) == ("3", "1")
    assert browser.find_element(By.ID, "import-progress").get_attribute("value") == "5"
    assert "4 email Enter a valid email address." in browser.find_element(By.ID, "refused-rows").text
    screenshot(browser, "recipient-import")

    got = {r.user_id: (r.email, r.locale) for r in Recipient.objects.all()}
    assert got == {
        "u-1": ("one@example.com", "de"),
        "u-2": ("two@example.com", "en-GB"),
        "u-4": ("four@example.com", ""),
    }
    assert Subscription.objects.filter(topic__key="news").count() == 3
    assert RecipientImport.objects.count() == 2
    entry = AuditEntry.objects.get(action="recipients.import")
    assert (entry.actor_name, entry.changes["created"], entry.changes["refused"]) == ("root", 3, 1)


JSONL_ROWS = [
    '{"user_id": "j-1", "email": "one@example.com", "locale": "de", "chat": {"slack": "U0JSONL01"}}',
    '{"user_id": "j-2", "phone": "+4915112345678", "timezone": "Europe/Berlin"}',
    "[1, 2]",
    "{broken",
    '{"user_id": "j-5", "email": "not an email"}',
]


def test_a_json_lines_upload_is_mapped_by_its_keys_and_imported(
    live_server: Any, browser: WebDriver, start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    start_worker(queues=["maintenance"], concurrency=1)
    make_staff_user("root", password=PASSWORD, superuser=True)
    path = tmp_path / "people.jsonl"
    path.write_text("\n".join(JSONL_ROWS) + "\n")

    login(browser, live_server.url, "root")
    browser.get(f"{live_server.url}/admin/preferences/recipientimport/add/")
    Select(browser.find_element(By.NAME, "environment")).select_by_value(str(DEFAULT_LIVE_ENVIRONMENT_ID))
    browser.find_element(By.NAME, "upload").send_keys(str(path))
    submit(browser, browser.find_element(By.NAME, "_save"))

    # The columns are the objects' keys, in the order first seen, each named like a field and so mapped.
    assert "/mapping/" in browser.current_url
    selects = [Select(s) for s in browser.find_elements(By.CSS_SELECTOR, "#mapping-form select")]
    chosen = [s.first_selected_option.text for s in selects]
    assert chosen == ["user_id", "email", "locale", "chat", "phone", "timezone"]
    submit(browser, browser.find_element(By.ID, "start-import"))

    wait(browser, 90).until(_finished)
    assert _field(browser, "status") == "done"
    assert _field(browser, "file_format") == "json lines"
    assert (_field(browser, "created"), _field(browser, "updated"), _field(browser, "refused")) == ("2", "0", "3")
    refused = browser.find_element(By.ID, "refused-rows").text
    assert "3 line Must be a JSON object." in refused
    assert "4 line Not valid JSON" in refused
    assert "5 email Enter a valid email address." in refused

    with owner_scope(DEFAULT_LIVE_ENVIRONMENT_ID):
        got = {r.user_id: (r.email, r.phone, r.locale, r.timezone, r.chat) for r in Recipient.objects.all()}
    assert got == {
        "j-1": ("one@example.com", "", "de", "", {"slack": "U0JSONL01"}),
        "j-2": ("", "+4915112345678", "", "Europe/Berlin", {}),
    }
    job = RecipientImport.objects.get()
    assert (job.file_format, job.dry_run) == ("jsonl", False)
