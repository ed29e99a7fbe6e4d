"""The preference center in a real headless Chromium (Debian's chromium and chromedriver, driven by Selenium)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEntry
from preferences.services import preference_token, recipient_upsert
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _link(api: Any, user_id: str) -> str:
    response = api.post(f"/api/v1/recipients/{user_id}/preference-link", {"ttl_seconds": 600}, format="json")
    assert response.status_code == 200, response.content
    return response.json()["url"]


def _type_time(field: Any, value: str) -> None:
    """Type a time the way a person does: segment by segment, in the browser's 12- or 24-hour layout."""
    hour, minute = (int(part) for part in value.split(":"))
    field.send_keys(f"{(hour % 12) or 12:02d}{minute:02d}{'P' if hour >= 12 else 'A'}")
    if field.get_attribute("value") != value:  # a 24-hour locale has no AM/PM segment
        field.send_keys(f"{hour:02d}{minute:02d}")
    assert field.get_attribute("value") == value


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_change_a_category_and_quiet_hours_then_the_api_shows_it(
    browser_factory: Callable[..., Any], live_server: Any, settings: Any, api: Any, javascript: bool
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import Select, WebDriverWait

    settings.PUBLIC_BASE_URL = live_server.url
    recipient_upsert(user_id="u-web", email="web@example.com", locale="en-US")
    driver = browser_factory(javascript=javascript, lang="en-GB")
    # Prove the session really runs (or does not run) scripts.
    driver.get("data:text/html,<title>off</title><script>document.title='on'</script>")
    assert driver.title == ("on" if javascript else "off")
    driver.get(_link(api, "u-web"))
    assert driver.find_element(By.TAG_NAME, "h1").text == "Notification preferences"
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("lang") == "en"
    # Locked categories are visible but cannot be changed.
    security = driver.find_element(By.ID, "category-security-enabled")
    assert security.is_selected() and not security.is_enabled()
    # Every form control has a label.
    for control in driver.find_elements(By.CSS_SELECTOR, "input, select"):
        labels = driver.find_elements(By.CSS_SELECTOR, f"label[for='{control.get_attribute('id')}']")
        assert len(labels) == 1, control.get_attribute("id")

    driver.find_element(By.ID, "category-marketing-enabled").click()
    Select(driver.find_element(By.ID, "category-social-frequency")).select_by_value("daily_digest")
    driver.find_element(By.CSS_SELECTOR, "label[for='category-social-channel-sms']").click()  # by its label
    _type_time(driver.find_element(By.ID, "quiet_start"), "21:30")
    _type_time(driver.find_element(By.ID, "quiet_end"), "07:15")
    Select(driver.find_element(By.ID, "timezone")).select_by_value("Europe/Berlin")
    driver.find_element(By.ID, "save").click()

    # The POST, its redirect and the new page can outlast the click on a busy machine.
    saved = WebDriverWait(driver, 20).until(expected_conditions.presence_of_element_located((By.ID, "saved")))
    assert saved.text == "Your preferences are saved."
    assert not driver.find_element(By.ID, "category-marketing-enabled").is_selected()
    prefs = api.get("/api/v1/recipients/u-web/preferences").json()
    assert prefs["categories"]["marketing"]["enabled"] is False
    assert prefs["categories"]["social"]["frequency"] == "daily_digest"
    assert prefs["categories"]["social"]["channels"] == [c for c in settings.CHANNELS if c != "sms"]
    assert prefs["quiet_hours"] == {"start": "21:30", "end": "07:15"}
    assert api.get("/api/v1/recipients/u-web").json()["timezone"] == "Europe/Berlin"
    assert AuditEntry.objects.filter(action="preferences.update", actor_type="recipient", actor_id="u-web").exists()


def test_a_german_recipient_gets_a_german_page_in_keyboard_order(
    browser_factory: Callable[..., Any], live_server: Any, settings: Any, api: Any
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    settings.PUBLIC_BASE_URL = live_server.url
    recipient_upsert(user_id="u-de", locale="de-DE")
    driver = browser_factory(lang="en-GB")
    driver.get(_link(api, "u-de"))
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("lang") == "de"
    assert driver.find_element(By.TAG_NAME, "h1").text == "Benachrichtigungseinstellungen"
    assert driver.find_element(By.ID, "save").text == "Einstellungen speichern"
    assert "Wird immer gesendet" in driver.find_element(By.ID, "category-security-locked").text

    # Tab walks the controls in reading order, skipping the locked ones, and ends on the save button.
    expected = [
        el.get_attribute("id")
        for el in driver.find_elements(By.CSS_SELECTOR, "input, select, button")
        if el.is_enabled() and el.get_attribute("type") != "hidden"
    ]
    seen: list[str] = []
    # A time field has a tab stop per segment (hours, minutes, AM/PM): count each field once.
    for _ in range(len(expected) * 3):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        current = driver.switch_to.active_element.get_attribute("id")
        if not seen or seen[-1] != current:
            seen.append(current)
        if current == "save":
            break
    assert seen == expected and seen[-1] == "save"


def _luminance(css_color: str) -> float:
    r, g, b = (int(v) / 255 for v in css_color[css_color.index("(") + 1 : css_color.index(")")].split(",")[:3])
    channel = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * channel[0] + 0.7152 * channel[1] + 0.0722 * channel[2]


def _contrast(foreground: str, background: str) -> float:
    lighter, darker = sorted((_luminance(foreground), _luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def test_text_and_controls_meet_wcag_aa_contrast(
    browser_factory: Callable[..., Any], live_server: Any, settings: Any, api: Any
) -> None:
    from selenium.webdriver.common.by import By

    settings.PUBLIC_BASE_URL = live_server.url
    recipient_upsert(user_id="u-contrast")
    driver = browser_factory(lang="en-GB")
    driver.get(_link(api, "u-contrast"))
    page_background = driver.find_element(By.TAG_NAME, "body").value_of_css_property("background-color")
    checked = 0
    for selector in ("h1", "p", "label", "legend", ".help", ".locked", "select", "button"):
        for element in driver.find_elements(By.CSS_SELECTOR, selector):
            background = element.value_of_css_property("background-color")
            if background.endswith(", 0)"):  # transparent: the page shows through
                background = page_background
            ratio = _contrast(element.value_of_css_property("color"), background)
            assert ratio >= 4.5, (selector, element.text, ratio)
            checked += 1
    assert checked > 20


def test_expired_and_tampered_links_show_a_4xx_page(
    browser_factory: Callable[..., Any], live_server: Any, settings: Any, api: Any
) -> None:
    from selenium.webdriver.common.by import By

    settings.PUBLIC_BASE_URL = live_server.url
    recipient_upsert(user_id="u-old")
    driver = browser_factory(lang="en-GB")
    url = _link(api, "u-old")
    driver.get(url[:-3] + "xyz")
    assert driver.find_element(By.TAG_NAME, "h1").text == "This link is not valid"
    assert driver.title == "This link is not valid"
    expired = preference_token(user_id="u-old", environment_id=DEFAULT_LIVE_ENVIRONMENT_ID, expires_at=1_000_000_000)
    driver.get(f"{live_server.url}/preferences/{expired}")
    assert driver.find_element(By.TAG_NAME, "h1").text == "This link has expired"
    assert not driver.find_elements(By.TAG_NAME, "form")
    # The browser shows the page; the status it got is what matters to caches and crawlers.
    import urllib.error
    import urllib.request

    for target, status in ((url[:-3] + "xyz", 404), (f"{live_server.url}/preferences/{expired}", 410)):
        with pytest.raises(urllib.error.HTTPError) as failure:
            urllib.request.urlopen(target, timeout=10)
        assert failure.value.code == status
