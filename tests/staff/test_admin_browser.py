"""The admin as support staff use it, in a real headless Chromium against a live server (and a real worker)."""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select

from audit.models import AuditEntry
from channels_app.models import SandboxMessage
from notifier.accepting.services import notification_accept
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.services import recipient_upsert
from templates_app.models import Template, TemplateVersion
from templates_app.services import template_put
from templates_app.sms import sms_info
from tests.browser import login, screenshot, staff_user, submit, wait
from tests.conftest import wait_for
from tests.factories import make_staff_user, make_topic

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CONTENT: dict[str, Any] = {
    "en": {
        "email": {"subject": "Your order {{ order_id }}", "text": "Hi {{ name }}, order {{ order_id }} shipped."},
        "sms": {"text": "Order {{ order_id }} shipped"},
    },
    "de": {"email": {"subject": "Ihre Bestellung {{ order_id }}", "text": "Hallo {{ name }}, versandt."}},
}


def _editor(driver: WebDriver, base: str, template: Template) -> None:
    driver.get(f"{base}/admin/templates_app/template/{template.pk}/change/")
    wait(driver).until(ec.presence_of_element_located((By.ID, "tpl-editor")))


def _preview(driver: WebDriver, locale: str, payload: str) -> None:
    Select(driver.find_element(By.ID, "preview_locale")).select_by_value(locale)
    area = driver.find_element(By.ID, "preview_payload")
    area.clear()
    area.send_keys(payload)
    driver.find_element(By.ID, "preview-button").click()


def _preview_text(driver: WebDriver, part: str) -> str:
    try:  # the preview is replaced when an answer arrives: an element read just then is gone
        elements = driver.find_elements(By.CSS_SELECTOR, f'pre.preview-part[data-part="{part}"]')
        return elements[0].text if elements else ""
    except StaleElementReferenceException:
        return ""


def test_support_finds_a_delivery_by_email_reads_its_timeline_and_resends_it(
    live_server: Any, browser: WebDriver, start_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_user("sue", "support", monkeypatch)
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="cust-42", email="ana@example.com", locale="de")
    client, _ = api_client_create(name="shop")
    start_worker(queues=["email.high"], concurrency=1)
    data = {"recipient": {"user_id": "cust-42"}, "category": "transactional", "template": "order_shipped"}
    data |= {"channels": ["email"], "payload": {"order_id": "A-7", "name": "Ana"}}
    original = notification_accept(client=client, data=data).deliveries[0]
    wait_for(lambda: Delivery.objects.get(pk=original.pk).status == "sent")

    login(browser, live_server.url, "sue")
    browser.get(f"{live_server.url}/admin/deliveries/delivery/")
    search = browser.find_element(By.ID, "searchbar")
    search.send_keys("ana@example.com")
    search.submit()
    # submit() does not wait for the result page: wait for it, or the rows are read from the page being left.
    wait(browser).until(ec.url_contains("q=ana"))
    rows = wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"))
    assert len(rows) == 1
    submit(browser, rows[0].find_element(By.CSS_SELECTOR, "th a"))
    timeline = wait(browser).until(ec.presence_of_element_located((By.ID, "timeline"))).text
    for label in ("Request accepted", "Queued", "Attempt 1", "Accepted by the provider"):
        assert label in timeline
    assert "Ihre Bestellung A-7" in browser.find_element(By.ID, "sent-content").text

    submit(browser, browser.find_element(By.ID, "action-resend"), confirm=True)
    wait_for(lambda: Delivery.objects.filter(resent_from=original.pk).exists())
    resent = Delivery.objects.get(resent_from=original.pk)
    assert browser.current_url.endswith(f"/admin/deliveries/delivery/{resent.pk}/change/")
    wait_for(lambda: Delivery.objects.get(pk=resent.pk).status == "sent")
    # Sent once, by the worker, to the same address; the original stays as it was.
    assert SandboxMessage.objects.get(delivery_id=resent.pk).send_count == 1
    assert SandboxMessage.objects.get(delivery_id=resent.pk).address == "ana@example.com"
    assert SandboxMessage.objects.count() == 2
    entry = AuditEntry.objects.get(action="delivery.resend")
    assert (entry.actor_name, entry.target_id) == ("sue", str(original.pk))
    browser.refresh()
    assert f"#{original.pk}" in browser.find_element(By.ID, "timeline").text


def test_support_edits_the_german_subject_previews_publishes_and_rolls_back(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_user("sue", "support", monkeypatch)
    # Publishing is not part of the Support role: an administrator gave this user the permission.
    User.objects.get(username="sue").user_permissions.add(Permission.objects.get(codename="publish_template"))
    v1 = template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    login(browser, live_server.url, "sue")
    _editor(browser, live_server.url, v1.template)

    _preview(browser, "de", '{"order_id": "A-7", "name": "Ana"}')
    wait(browser).until(lambda d: _preview_text(d, "email.subject") == "Ihre Bestellung A-7")
    subject = browser.find_element(By.NAME, "c__de__email__subject")
    subject.clear()
    subject.send_keys("Ihre Bestellung {{ order_id }} ist unterwegs")
    browser.find_element(By.ID, "preview-button").click()
    wait(browser).until(lambda d: _preview_text(d, "email.subject") == "Ihre Bestellung A-7 ist unterwegs")
    assert TemplateVersion.objects.count() == 1  # previewing saves nothing
    screenshot(browser, "template-editor")

    browser.find_element(By.NAME, "publish").click()
    submit(browser, browser.find_element(By.NAME, "_continue"))
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist")))
    template = Template.objects.get(key="order_shipped")
    assert template.published_version.version == 2
    assert (
        template.published_version.content["de"]["email"]["subject"] == "Ihre Bestellung {{ order_id }} ist unterwegs"
    )

    submit(browser, browser.find_element(By.LINK_TEXT, "Roll back to this"))
    confirm = wait(browser).until(ec.presence_of_element_located((By.ID, "confirm-text"))).text
    assert "back from version 2 to version 1" in confirm
    assert Template.objects.get(key="order_shipped").published_version.version == 2  # not before confirming
    submit(browser, browser.find_element(By.ID, "confirm-publish"))
    wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist")))
    assert Template.objects.get(key="order_shipped").published_version.version == 1
    actions = list(
        AuditEntry.objects.filter(action="template.publish").order_by("id").values_list("changes", flat=True)
    )
    assert actions == [{"published_version": [1, 2]}, {"published_version": [2, 1]}]


def test_a_syntax_error_is_shown_beside_its_field_and_nothing_is_saved(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_user("sue", "support", monkeypatch)
    v1 = template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    login(browser, live_server.url, "sue")
    _editor(browser, live_server.url, v1.template)
    subject = browser.find_element(By.NAME, "c__de__email__subject")
    subject.clear()
    subject.send_keys("Ihre Bestellung {{ order_id ")
    submit(browser, browser.find_element(By.NAME, "_continue"))
    errors = (
        wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#errors-c__de__email__subject li"))).text
    )
    assert "syntax error on line 1" in errors
    # Beside its field: the error list sits directly above the German subject's input.
    field = browser.find_element(By.NAME, "c__de__email__subject")
    assert (
        field.find_element(By.XPATH, "preceding-sibling::ul[1]").get_attribute("id") == "errors-c__de__email__subject"
    )
    assert field.get_attribute("value") == "Ihre Bestellung {{ order_id "  # what was typed is kept
    assert TemplateVersion.objects.count() == 1
    assert Template.objects.get(key="order_shipped").published_version_id == v1.pk


def test_the_sms_counter_in_the_browser_agrees_with_the_server(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_user("sue", "support", monkeypatch)
    v1 = template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    login(browser, live_server.url, "sue")
    _editor(browser, live_server.url, v1.template)
    texts = [
        "",
        "Hello",
        "a" * 160,
        "a" * 161,
        "€" * 80,
        "€" * 81,
        "[" * 77 + "a",
        "Grüße aus Köln",
        "Привет",
        "ç" * 70,
        "😀" * 35,
        "😀" * 36,
        "a" * 152 + "€" + "a" * 10,
        "x" * 66 + "😀" + "x" * 10,
    ]
    for text in texts:
        expected = sms_info(text)
        got = browser.execute_script("return window.notifierSmsInfo(arguments[0])", text)
        assert got == {"encoding": expected.encoding, "units": expected.units, "segments": expected.segments}, text
    area = browser.find_element(By.NAME, "c__en__sms__text")
    area.clear()
    area.send_keys("Привет " * 11)
    counter = browser.find_element(By.CSS_SELECTOR, '[data-sms-for="id_c__en__sms__text"]').text
    info = sms_info("Привет " * 11)
    assert f"{info.units} units · ucs2 · {info.segments} segment(s)" in counter


def test_support_cannot_publish_or_open_campaigns(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    staff_user("sue", "support", monkeypatch)
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    v2 = template_put(
        key="order_shipped", category="transactional", default_locale="en", content=CONTENT, publish=False
    )
    login(browser, live_server.url, "sue")
    index = browser.find_element(By.ID, "content-main").text
    assert "Deliveries" in index and "Templates" in index
    assert "Campaigns" not in index
    _editor(browser, live_server.url, v2.template)
    with pytest.raises(NoSuchElementException):
        browser.find_element(By.NAME, "publish")
    assert not browser.find_elements(By.LINK_TEXT, "Publish")
    browser.get(f"{live_server.url}/admin/templates_app/templateversion/{v2.pk}/publish/")
    assert "403" in browser.title or "Forbidden" in browser.page_source
    browser.get(f"{live_server.url}/admin/campaigns/campaign/")
    assert "403" in browser.title or "Forbidden" in browser.page_source
    browser.get(f"{live_server.url}/admin/campaigns/campaign/add/")
    assert "403" in browser.title or "Forbidden" in browser.page_source
    assert Template.objects.get(key="order_shipped").published_version.version == 1


def _wizard_start(driver: WebDriver, base: str, name: str) -> None:
    """Log in as the marketer "max", open the campaign wizard and name the campaign, sent as marketing-tool."""
    api_client_create(name="marketing-tool")
    login(driver, base, "max")
    driver.get(f"{base}/admin/campaigns/campaign/add/")
    wait(driver).until(ec.presence_of_element_located((By.ID, "wizard-form")))
    driver.find_element(By.NAME, "name").send_keys(name)
    # A client is offered with its project environment: a campaign's topic and template are that environment's.
    Select(driver.find_element(By.NAME, "client")).select_by_visible_text("marketing-tool (default/live)")


def _wizard_next(driver: WebDriver) -> None:
    """Go to the wizard's next step and wait until the step before it is gone.

    The steps carry the answers so far in hidden fields of the same names, so waiting for a field to be
    present could find the old page's hidden one, which goes stale under the test as the next page loads.
    """
    submit(driver, driver.find_element(By.ID, "wizard-next"))


def test_a_marketer_creates_test_sends_schedules_and_pauses_a_campaign(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifier.campaigns.models import Campaign
    from preferences.services import topic_subscribe

    monkeypatch.setenv("STAFF_USER_PASSWORD", "pw-browser-123456")
    call_command("create_staff_user", "max", "--role", "marketing", "--email", "max@example.com", stdout=io.StringIO())
    promo = {
        "en": {"email": {"subject": "Spring sale {{ percent }}%", "text": "{{ percent }}% off"}},
        "de": {"email": {"subject": "Frühlingsangebot {{ percent }}%", "text": "{{ percent }}% Rabatt"}},
    }
    template_put(key="spring", category="marketing", default_locale="en", content=promo)
    topic = make_topic(key="newsletter", name="Newsletter")
    recipient_upsert(user_id="sub-1", email="sub1@example.com", locale="de")
    recipient_upsert(user_id="sub-2", email="sub2@example.com", locale="en")
    topic_subscribe(topic=topic, user_ids=["sub-1", "sub-2"])
    _wizard_start(browser, live_server.url, "Spring sale")
    topic_select = Select(browser.find_element(By.NAME, "topic"))
    assert "newsletter — 2 subscribers" in [o.text for o in topic_select.options]
    topic_select.select_by_value("newsletter")
    _wizard_next(browser)

    Select(wait(browser).until(ec.presence_of_element_located((By.NAME, "template")))).select_by_value("spring")
    payload = browser.find_element(By.NAME, "payload")
    payload.clear()
    payload.send_keys('{"percent": 20}')
    submit(browser, browser.find_element(By.ID, "wizard-preview"))
    sample = wait(browser).until(ec.presence_of_element_located((By.ID, "wizard-sample"))).text
    assert "Frühlingsangebot 20%" in sample and "sub-1" in sample
    submit(browser, browser.find_element(By.ID, "wizard-test"))
    message = wait(browser).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist"))).text
    assert "Test sent to max@example.com" in message
    assert Delivery.objects.filter(address="max@example.com", channel="email").count() == 1
    screenshot(browser, "campaign-wizard")
    _wizard_next(browser)

    when = wait(browser).until(ec.presence_of_element_located((By.NAME, "send_at_local")))
    browser.execute_script("arguments[0].value = '2031-06-01T09:30'", when)
    Select(browser.find_element(By.NAME, "time_zone")).select_by_value("Europe/Berlin")
    rate = browser.find_element(By.NAME, "rate_per_second")
    rate.clear()
    rate.send_keys("25")
    _wizard_next(browser)
    review = wait(browser).until(ec.presence_of_element_located((By.ID, "review"))).text
    assert "2031-06-01 09:30 Europe/Berlin" in review
    submit(browser, browser.find_element(By.ID, "wizard-create"))

    status = wait(browser).until(ec.presence_of_element_located((By.ID, "campaign-status")))
    assert status.text == "scheduled"
    campaign = Campaign.objects.get(name="Spring sale")
    assert campaign.send_at.isoformat() == "2031-06-01T07:30:00+00:00"  # 09:30 in Berlin, summer time
    assert campaign.rate_per_second == 25
    submit(browser, browser.find_element(By.ID, "campaign-pause"))
    assert browser.find_element(By.ID, "campaign-status").text == "paused"
    assert Campaign.objects.get(pk=campaign.pk).status == "paused"
    assert browser.find_element(By.ID, "campaign-resume")
    actions = set(AuditEntry.objects.filter(actor_name="max").values_list("action", flat=True))
    assert {"campaign.test_send", "campaign.create", "campaign.pause"} <= actions


def test_the_wizard_schedules_a_campaign_at_each_recipients_local_time(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifier.campaigns.models import Campaign
    from preferences.models import Topic
    from preferences.services import topic_subscribe

    staff_user("max", "marketing", monkeypatch)
    content = {"en": {"email": {"subject": "Good morning", "text": "Coffee is on us"}}}
    template_put(key="morning", category="marketing", default_locale="en", content=content)
    topic = Topic.objects.create(key="early-birds", name="Early birds")
    recipient_upsert(user_id="tokyo", email="tokyo@example.com", timezone="Asia/Tokyo")
    recipient_upsert(user_id="nowhere", email="nowhere@example.com")
    topic_subscribe(topic=topic, user_ids=["tokyo", "nowhere"])
    _wizard_start(browser, live_server.url, "Morning coffee")
    Select(browser.find_element(By.NAME, "topic")).select_by_value("early-birds")
    _wizard_next(browser)
    Select(wait(browser).until(ec.presence_of_element_located((By.NAME, "template")))).select_by_value("morning")
    _wizard_next(browser)

    when = wait(browser).until(ec.presence_of_element_located((By.NAME, "send_at_local")))
    options = {e.get_attribute("value"): e for e in browser.find_elements(By.NAME, "schedule_in")}
    assert set(options) == {"zone", "recipient"} and options["zone"].is_selected()
    options["recipient"].click()
    browser.execute_script("arguments[0].value = '2031-06-01T08:00'", when)
    Select(browser.find_element(By.NAME, "time_zone")).select_by_value("Europe/Berlin")
    screenshot(browser, "campaign-schedule")
    _wizard_next(browser)
    review = wait(browser).until(ec.presence_of_element_located((By.ID, "review"))).text
    assert "2031-06-01 08:00 in each recipient's time zone (Europe/Berlin for recipients without one)" in review
    submit(browser, browser.find_element(By.ID, "wizard-create"))

    status = wait(browser).until(ec.presence_of_element_located((By.ID, "campaign-status")))
    assert status.text == "scheduled"
    campaign = Campaign.objects.get(name="Morning coffee")
    assert (campaign.send_at, campaign.send_at_local, campaign.timezone) == (
        None,
        "2031-06-01T08:00:00",
        "Europe/Berlin",
    )
    # The run starts when the earliest time zone (UTC+14) reaches 08:00: 18:00 UTC the day before.
    assert campaign.periodic_task.clocked.clocked_time.isoformat() == "2031-05-31T18:00:00+00:00"
    assert "in each recipient's time zone" in browser.find_element(By.ID, "content-main").text
    entry = AuditEntry.objects.get(action="campaign.create", actor_name="max")
    assert entry.changes["send_at_local"] == [None, "2031-06-01T08:00:00"]


def test_operations_charts(
    live_server: Any, browser: WebDriver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from notifier.deliveries.models import DeliveryEvent
    from tests.factories import make_delivery

    make_staff_user("ops", password="pw-browser-123456", superuser=True)
    now = timezone.now()
    # A day of traffic: a daily wave of sends per channel, some failures and a provider outage.
    rows = []
    for channel, scale in (("email", 12), ("sms", 6), ("push", 9), ("inapp", 4), ("webhook", 2)):
        delivery = make_delivery(channel=channel, status="sent", provider="sandbox")
        for step in range(0, 24 * 60, 5):
            at = now - timedelta(minutes=step)
            wave = int(scale * (1.2 + math.sin(step / 180)))
            rows += [DeliveryEvent(delivery=delivery, status="sent", at=at) for _ in range(wave)]
            if 300 < step < 360:
                rows += [DeliveryEvent(delivery=delivery, status="failed", at=at) for _ in range(scale // 3)]
    DeliveryEvent.objects.bulk_create(rows)
    # Beat's samples of the broker and the breakers over the last hour: a queue filling and draining, an outage.
    from channels_app.breaker import record
    from config.celery import app as celery_app
    from ops.series import ops_sample
    from tests.conftest import purge_all_queues, queue_depth

    purge_all_queues()
    try:
        for k, backlog in enumerate((0, 2, 5, 8, 6, 4, 7, 9, 5, 3, 2, 1, 3)):
            minutes_ago = 60 - 5 * k
            if minutes_ago == 20:
                record("sandbox", ok=False, n=200)  # the breaker opens
            with celery_app.connection_for_write() as conn:
                # kombu types the channel as the abstract StdChannel; py-amqp's channel has queue_purge.
                conn.default_channel.queue_purge("email.low")  # type: ignore[attr-defined]
            for _ in range(backlog):
                celery_app.send_task("notifier.tasks.noop", queue="email.low")

            def reached(backlog: int = backlog) -> bool:
                return queue_depth("email.low") == backlog

            wait_for(reached)
            assert ops_sample(now=now - timedelta(minutes=minutes_ago)) is not None
    finally:
        purge_all_queues()
    # A broadcast asking a throttled queue for room, and a template that renders slowly.
    from notifier.dispatch import shares
    from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID, Environment

    settings.PROVIDER_RATE_LIMITS = {"sandbox": {"rate": 1000, "burst": 1000}}
    # A flow that has not asked for ACTIVE_SECONDS (3 s) no longer counts; logging in and drawing a day of events
    # take longer than that beside a full run, and what this checks is the table, not that expiry.
    monkeypatch.setattr(shares, "ACTIVE_SECONDS", 600.0)
    shares.reset(["email.low"])
    project = Environment.objects.get(pk=DEFAULT_LIVE_ENVIRONMENT_ID).project
    shares.ask("email.low", rate=1000, project=project.pk, weight=1, flow="charts", want=250, backlog=4000)
    shares.render_cost_record({(DEFAULT_LIVE_ENVIRONMENT_ID, "weekly_digest"): 0.0345})
    # The shared helper waits for the logged-in page: a get() right after the click could overtake the POST.
    login(browser, live_server.url, "ops")
    browser.get(f"{live_server.url}/admin/notifier/dashboard/")
    # The dashboard reads a day of events and the broker's queue depths: slower than a form under a full run.
    charts = wait(browser, 60).until(ec.presence_of_element_located((By.ID, "ops-charts")))
    assert len(charts.find_elements(By.CSS_SELECTOR, "svg.chart polyline")) >= 5
    legend = " ".join(e.text for e in charts.find_elements(By.CSS_SELECTOR, "svg text.legend"))
    assert "sent" in legend and "failed" in legend
    # The queue depth is drawn over time from the samples: one line with a point per sampled bucket.
    history = browser.find_element(By.ID, "chart-queue-history")
    assert "all queues" in " ".join(e.text for e in history.find_elements(By.CSS_SELECTOR, "text.legend"))
    assert "email.low" in " ".join(e.text for e in history.find_elements(By.CSS_SELECTOR, "text.legend"))
    points = [len(p.get_attribute("points").split()) for p in history.find_elements(By.TAG_NAME, "polyline")]
    assert points and max(points) == 13, points  # a sample every 5 minutes for an hour: 13 buckets
    assert browser.find_element(By.ID, "chart-dead-history").find_elements(By.TAG_NAME, "polyline")
    assert browser.find_element(By.ID, "chart-error-history").find_elements(By.TAG_NAME, "polyline")
    states = [
        e.get_attribute("data-state")
        for e in browser.find_elements(By.CSS_SELECTOR, "#chart-breaker-history rect.slot")
    ]
    assert "closed" in states and "open" in states
    fair = browser.find_element(By.ID, "ops-fair-shares")
    cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in fair.find_elements(By.TAG_NAME, "tr")]
    assert ["email.low", project.slug, "3750", "0 s", "100 %", "250"] in cells, cells
    assert [project.slug, "live", "weekly_digest", "34.5 ms"] in cells, cells
    shares.reset(["email.low"])
    screenshot(browser, "operations-charts")


def test_a_delivery_timeline_shows_attempts_errors_and_callbacks(
    live_server: Any, browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifier.deliveries.status import record_events

    staff_user("sue", "support", monkeypatch)
    template_put(key="order_shipped", category="transactional", default_locale="en", content=CONTENT)
    recipient_upsert(user_id="cust-7", email="bo@example.com", locale="de")
    client, _ = api_client_create(name="shop")
    data = {"recipient": {"user_id": "cust-7"}, "category": "transactional", "template": "order_shipped"}
    data |= {"channels": ["email"], "payload": {"order_id": "B-12", "name": "Bo"}}
    delivery = notification_accept(client=client, data=data).deliveries[0]
    # The story a worker and the provider's callbacks would have written.
    for status, detail in (
        ("sending", ""),
        ("failed", "ses: 503 Service Unavailable (retriable), retry in 4 s"),
        ("sending", ""),
        ("sent", "ses"),
        ("delivered", "ses:delivery 250 2.0.0 OK"),
        ("opened", "ses:open"),
    ):
        record_events([(delivery.pk, status, detail)])
    Delivery.objects.filter(pk=delivery.pk).update(
        status="opened",
        provider="ses",
        provider_message_id="0100-ses-b12",
        template_version=TemplateVersion.objects.get(template__key="order_shipped", version=1),
    )

    login(browser, live_server.url, "sue")
    browser.get(f"{live_server.url}/admin/deliveries/delivery/?q=0100-ses-b12")
    submit(browser, browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr th a"))
    items = wait(browser).until(ec.presence_of_element_located((By.ID, "timeline"))).find_elements(By.TAG_NAME, "li")
    labels = [item.find_element(By.TAG_NAME, "strong").text for item in items]
    assert labels == [
        "Request accepted",
        "Queued",
        "Attempt 1",
        "Failed",
        "Attempt 2",
        "Accepted by the provider",
        "Delivered (provider callback)",
        "Opened",
    ]
    assert "503 Service Unavailable" in items[3].text
    assert "Ihre Bestellung B-12" in browser.find_element(By.ID, "sent-content").text
    assert "send" in browser.find_element(By.ID, "compliance").text
    screenshot(browser, "delivery-timeline")
