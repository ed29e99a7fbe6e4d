"""The delivery admin at the size of a fortnight: no full count, a default date range, fixed filter choices.

The SQL of each list page is captured against the real database and planned again with EXPLAIN: what the page
reads is checked by the partitions the plans touch, not by the text of the statements.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.core.paginator import EmptyPage
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifier.deliveries import partitions
from notifier.deliveries.models import Delivery
from notifier.staff.admin_scale import EstimatedCountPaginator
from tests.factories import make_delivery, make_staff_user, move_to_day

LIST = "/admin/deliveries/delivery/"


def _today() -> Any:
    return timezone.now().astimezone(UTC).date()


def _at(days_ago: int, address: str) -> Delivery:
    """Create a delivery on the day `days_ago` days back (its id carries that day, as real ones do)."""
    day = _today() - timedelta(days=days_ago)
    when = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    if days_ago == 0:
        when = min(when, timezone.now() - timedelta(minutes=1))
    return move_to_day(make_delivery(address=address), when)


def _relations(plan: Any) -> set[str]:
    """Return every relation a plan (EXPLAIN's JSON) reads."""
    found = set()
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            found.add(plan["Relation Name"])
        for value in plan.values():
            found |= _relations(value)
    elif isinstance(plan, list):
        for item in plan:
            found |= _relations(item)
    return found


def _partitions_read(queries: list[dict[str, Any]]) -> set[str]:
    """Plan every captured statement on the delivery table again; return the delivery partitions they read."""
    read: set[str] = set()
    with connection.cursor() as cursor:
        for query in queries:
            sql = query["sql"]
            if "notifier_delivery" not in sql or not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0]
            read |= {r for r in _relations(json.loads(plan) if isinstance(plan, str) else plan)}
    return {r for r in read if r.startswith("notifier_delivery_")}


@pytest.fixture
def support(client: Any) -> Any:
    """A logged-in superuser's test client."""
    client.force_login(make_staff_user("support-scale", superuser=True))
    return client


@pytest.mark.django_db
def test_the_list_reads_only_the_default_days_and_counts_nothing_in_full(support: Any) -> None:
    """The default page's statements (list, bounded count) read only today's and yesterday's partitions; no
    statement counts the table unbounded and no filter's choices come from SELECT DISTINCT."""
    recent, old = _at(0, "recent@example.com"), _at(5, "old@example.com")
    # The planner's statistics are not rolled back with another test's rows: read this test's own first, so the
    # paginator asks for the bounded count of a small list instead of trusting an estimate of a million.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifier_delivery")
    with CaptureQueriesContext(connection) as ctx:
        page = support.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert f"/admin/deliveries/delivery/{recent.pk}/change/" in html
    assert f"/admin/deliveries/delivery/{old.pk}/change/" not in html
    statements = [q["sql"] for q in ctx.captured_queries]
    assert not [s for s in statements if "DISTINCT" in s.upper()]
    counts = [s for s in statements if "COUNT(" in s.upper() and "notifier_delivery" in s]
    assert counts and all(re.search(r"LIMIT \d+\)", s) for s in counts), counts
    # The partitions holding today's and yesterday's ids (notifier/deliveries/partitions.py).
    today = _today()
    low, high = partitions.delivery_id_bounds(today - timedelta(days=1))[0], partitions.delivery_id_bounds(today)[1]
    allowed = _partitions_read([{"sql": f"SELECT id FROM notifier_delivery WHERE id >= {low} AND id < {high}"}])
    read = _partitions_read(ctx.captured_queries)
    assert read and read <= allowed, read
    # The same pages over every day do read the others: the check above can fail.
    with CaptureQueriesContext(connection) as everything:
        assert support.get(LIST + "?range=all").status_code == 200
    assert _partitions_read(everything.captured_queries) - allowed


@pytest.mark.django_db
def test_the_default_range_is_visible_and_other_days_come_on_request(support: Any) -> None:
    """Today and yesterday by default (shown selected); 7 days, a given day, any date and a search reach older
    deliveries when asked for."""
    recent, five, ten = _at(0, "r@example.com"), _at(5, "five@example.com"), _at(10, "ten@example.com")

    def shown(url: str) -> set[int]:
        page = support.get(url)
        assert page.status_code == 200, (url, page.status_code)
        return {
            d.pk for d in (recent, five, ten) if f"/admin/deliveries/delivery/{d.pk}/change/" in page.content.decode()
        }

    default = support.get(LIST).content.decode()
    assert re.search(r'<li class="selected">\s*<a href="\?range=2d"[^>]*>Today and yesterday</a>', default), default
    assert shown(LIST) == {recent.pk}
    assert shown(LIST + "?range=7d") == {recent.pk, five.pk}
    assert shown(LIST + "?range=14d") == {recent.pk, five.pk, ten.pk}
    assert shown(LIST + "?range=all") == {recent.pk, five.pk, ten.pk}
    ten_day = partitions.delivery_id_day(ten.pk).isoformat()
    assert shown(LIST + f"?day={ten_day}") == {ten.pk}
    assert shown(LIST + "?q=ten@example.com") == set()  # the search keeps the dates chosen...
    assert shown(LIST + "?q=ten@example.com&range=all") == {ten.pk}  # ...and reaches every day on request


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["range=yesterday", "day=2026-13-40", "day=soon"])
def test_a_bad_range_or_day_is_refused_not_a_server_error(support: Any, query: str) -> None:
    """An unknown range or a day that is not a date sends the page back to the admin's error flag."""
    page = support.get(f"{LIST}?{query}")
    assert page.status_code == 302 and page["Location"].endswith("?e=1")


@pytest.mark.django_db
def test_an_estimated_count_says_about_and_keeps_every_page_full(support: Any, monkeypatch: Any) -> None:
    """Past two pages the count is the planner's estimate: the page says "about", pages stay full, and the
    count of a small list is exact."""
    for index in range(7):
        _at(0, f"many-{index}@example.com")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {partitions.partition_name(partitions.DELIVERY, _today())}")
    monkeypatch.setattr(admin.site._registry[Delivery], "list_per_page", 2)
    page = support.get(LIST)
    assert page.status_code == 200
    assert re.search(r"about [\d,]+ deliveries", page.content.decode())
    assert page.content.decode().count('name="_selected_action"') == 2

    queryset = Delivery.objects.filter(address__startswith="many-").order_by("-pk")
    paginator = EstimatedCountPaginator(queryset, 2)
    assert paginator.count >= 5 and paginator.estimated
    assert len(paginator.page(1).object_list) == 2
    # A list the planner puts at two pages or less is counted exactly (bounded).
    small = EstimatedCountPaginator(queryset.filter(address="many-0@example.com"), 50)
    assert small.count == 1 and not small.estimated
    with pytest.raises(EmptyPage):
        small.page(2)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_support_widens_the_dates_in_a_browser(live_server: Any, browser: Any, monkeypatch: Any) -> None:
    """In Chromium: the list opens on today and yesterday (selected in the filter), a search for an older
    address finds nothing there, and choosing "Any date" finds it, the search kept."""
    from selenium.webdriver.common.by import By

    from tests.browser import login, staff_user, wait

    staff_user("sue-scale", "support", monkeypatch)
    recent, old = _at(0, "recent@example.com"), _at(6, "older@example.com")
    login(browser, live_server.url, "sue-scale")
    browser.get(f"{live_server.url}{LIST}")
    selected = browser.find_element(By.CSS_SELECTOR, "#changelist-filter li.selected a[href='?range=2d']")
    assert selected.text == "Today and yesterday"
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr th a")
    assert [r.text for r in rows] == [str(recent.pk)]
    search = browser.find_element(By.ID, "searchbar")
    search.send_keys("older@example.com")
    search.submit()
    wait(browser).until(lambda d: "q=older" in d.current_url)
    assert not browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr th a")
    browser.find_element(By.LINK_TEXT, "Any date").click()
    wait(browser).until(lambda d: "range=all" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr th a")
    assert [r.text for r in rows] == [str(old.pk)]
    assert "q=older" in browser.current_url


@pytest.mark.django_db
def test_the_notification_list_keeps_to_its_default_days_too(support: Any) -> None:
    """The notification list: today and yesterday by created_at unless asked, categories without DISTINCT."""
    recent, old = _at(0, "n-recent@example.com"), _at(5, "n-old@example.com")
    url = "/admin/deliveries/notification/"

    def shown(query: str = "") -> set[str]:
        page = support.get(url + query)
        assert page.status_code == 200
        html = page.content.decode()
        return {str(d.notification_id) for d in (recent, old) if f"{url}{d.notification_id}/change/" in html}

    with CaptureQueriesContext(connection) as ctx:
        assert shown() == {str(recent.notification_id)}
    assert not [q for q in ctx.captured_queries if "DISTINCT" in q["sql"].upper()]
    assert shown("?range=7d") == {str(recent.notification_id), str(old.notification_id)}
    assert shown("?category=transactional&range=all") == {str(recent.notification_id), str(old.notification_id)}
