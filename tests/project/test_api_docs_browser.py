"""/api/docs/ (Swagger UI) and /api/redoc/ render the operations in headless Chromium from our own files only."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser import screenshot, wait

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RESOURCES = "return performance.getEntriesByType('resource').map(e => e.name)"


def _foreign(driver: WebDriver, origin: str) -> list[str]:
    """Return every URL the page loaded from anywhere but the app itself."""
    names: list[str] = driver.execute_script(RESOURCES)
    return [name for name in names if urlsplit(name).netloc != origin]


def test_swagger_ui_lists_the_operations_offline(live_server: Any, browser: WebDriver) -> None:
    browser.get(f"{live_server.url}/api/docs/")
    wait(browser).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) >= 40)
    paths = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/api/v1/notifications", "/api/v1/notifications/batch", "/api/v1/suppressions"} <= {
        p.replace("\u200b", "") for p in paths
    }
    tags = {e.text.strip().lower() for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-tag")}
    assert {"notifications", "templates", "dead letters"} <= {t.split("\n")[0] for t in tags}
    assert _foreign(browser, urlsplit(live_server.url).netloc) == []
    screenshot(browser, "api-docs")


def test_redoc_renders_the_reference_offline(live_server: Any, browser: WebDriver) -> None:
    # ReDoc's sidebar footer always asks for Redocly's logo from their CDN; the page's policy refuses it, so
    # the browser never fetches it. Record what the policy refused to tell a refused request from a fetched one.
    browser.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument",
        {
            "source": "window.__refused = []; document.addEventListener('securitypolicyviolation', "
            "e => window.__refused.push(e.blockedURI));"
        },
    )
    browser.get(f"{live_server.url}/api/redoc/")
    wait(browser).until(lambda d: "Send up to 1,000 notifications" in d.find_element(By.TAG_NAME, "body").text)
    foreign = _foreign(browser, urlsplit(live_server.url).netloc)
    refused = browser.execute_script("return window.__refused")
    assert [url for url in foreign if url not in refused] == []
