"""Headless Chromium for the browser tests (Selenium, Debian's chromium and chromedriver), and the admin's helpers."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "admin"
PASSWORD = "pw-browser-123456"


def open_chromium(*, javascript: bool = True, lang: str | None = None, window_size: str | None = None) -> WebDriver:
    """Start a headless Chromium (without JavaScript if asked); skip the test when it is not installed."""
    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium and chromedriver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    if lang:
        options.add_argument(f"--lang={lang}")
    if window_size:
        options.add_argument(f"--window-size={window_size}")
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture
def browser_factory() -> Iterator[Callable[..., WebDriver]]:
    """Return `open_chromium` for a test that needs several browsers (or options); all are quit afterwards."""
    drivers: list[WebDriver] = []

    def _open(**options: Any) -> WebDriver:
        driver = open_chromium(**options)
        drivers.append(driver)
        return driver

    yield _open
    for driver in drivers:
        driver.quit()


@pytest.fixture
def browser(browser_factory: Callable[..., WebDriver]) -> WebDriver:
    """Start a headless Chromium for one test, sized for the admin's screenshots."""
    return browser_factory(window_size="1400,1100")


def staff_user(name: str, role: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Create a staff user in a role with the command staff use."""
    monkeypatch.setenv("STAFF_USER_PASSWORD", PASSWORD)
    call_command("create_staff_user", name, "--role", role, stdout=io.StringIO())


def login(driver: WebDriver, base_url: str, username: str) -> None:
    """Log in through the admin's login form."""
    driver.get(f"{base_url}/admin/login/")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait(driver).until(ec.presence_of_element_located((By.ID, "user-tools")))


def wait(driver: WebDriver, timeout: float = 20) -> WebDriverWait:
    """Return a waiter for conditions in the page.

    A condition that reads an element while the page is being replaced finds it stale; that is "not yet",
    so the waiter asks again instead of failing the test.
    """
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,))


def submit(driver: WebDriver, button: WebElement, *, confirm: bool = False) -> None:
    """Click a button that submits a form and wait until the page it leaves is gone.

    A click returns before the next page arrives, so anything the test looks for afterwards could be found
    on the page being left (which then goes stale under the test). Waiting for the old document to go stale
    orders the test after the navigation. `confirm` accepts the page's confirm() dialog first.
    """
    old = driver.find_element(By.TAG_NAME, "html")
    button.click()
    if confirm:
        wait(driver).until(ec.alert_is_present()).accept()
    wait(driver).until(lambda _: _left(old))
    wait(driver).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _left(element: WebElement) -> bool:
    """Tell whether an element's document is gone.

    Chromium answers a question about a node of a document being replaced either "stale" or, in the middle of
    the swap, an inspector error that the node "does not belong to the document": both mean the page was left.
    """
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if "does not belong to the document" in str(error.msg):
            return True
        raise
    return False


def screenshot(driver: WebDriver, name: str) -> Path:
    """Save a full-width screenshot (into docs/admin/, shown in docs/admin.md, with NOTIFIER_SCREENSHOTS=docs).

    A normal test run writes them under var/ so it never leaves the work tree changed; refreshing the
    documentation's pictures is a deliberate `NOTIFIER_SCREENSHOTS=docs make test`.
    """
    folder = SCREENSHOTS if os.environ.get("NOTIFIER_SCREENSHOTS") == "docs" else SCREENSHOTS.parent.parent / "var"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return Math.min(document.body.scrollHeight, 2400)")
    driver.set_window_size(1400, max(900, int(height)))
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1100)
    return path
