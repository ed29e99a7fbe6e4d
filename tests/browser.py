"""Headless Chromium for the admin's browser tests (Selenium, Debian's chromium and chromedriver)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "admin"
PASSWORD = "pw-browser-123456"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Start a headless Chromium for one test; skip when it is not installed."""
    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        pytest.skip("chromium and chromedriver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


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
    """Return a waiter for conditions in the page."""
    return WebDriverWait(driver, timeout)


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
