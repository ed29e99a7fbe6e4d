"""The delivery admin's list at the size of a fortnight of traffic: no full count, a default date range.

Django's admin counts the whole filtered list (`COUNT(*)` over every partition) on each page and builds the
choices of a filter on a plain column with `SELECT DISTINCT` over the whole table. With 20 million deliveries
those are the slowest statements a support person waits for. Here instead:

- `EstimatedCountPaginator` takes the planner's estimate of the filtered list (EXPLAIN: no scan) and counts
  exactly only when that is two pages or less (a bounded count); the page shows "about N" for an estimate.
  Pages stop at `MAX_PAGES`.
- `CreatedRangeFilter` shows today and yesterday (UTC) unless asked for 7 or 14 days or any date, and
  `CreatedDayFilter` one given day; both cut by the table's partition key (a delivery's id carries its day,
  a notification's created_at is its key: notifier/deliveries/partitions.py), so the plan reads only those days'
  partitions. The notification list uses the same, with a fixed category filter.
- `ChoicesFilter` filters channel, priority and provider on fixed choices (the settings), without DISTINCT.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, date, timedelta
from functools import cached_property
from typing import Any, cast

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from notifier.deliveries import partitions

# Deep pages are OFFSET scans: past this a support person narrows the filter instead.
MAX_PAGES = 200


def _today() -> date:
    return timezone.now().astimezone(UTC).date()


def planner_estimate(queryset: QuerySet[Any]) -> int:
    """Return the planner's estimate of the rows `queryset` returns (EXPLAIN: planned, not run)."""
    sql, params = queryset.order_by().query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):  # a driver that does not decode json
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts a large list: exact up to two pages, the planner's estimate beyond."""

    estimated = False

    @cached_property
    def count(self) -> int:
        """Return the planner's estimate when it is large, else the exact count (bounded: it stops at two pages).

        The estimate first: a bounded count of a rare filter (one delivery in a thousand) still scans until it
        has found its rows, twice what the page itself reads.
        """
        bound = 2 * self.per_page
        queryset = cast("QuerySet[Any]", self.object_list)  # the admin paginates querysets
        estimate = planner_estimate(queryset)
        if estimate > bound:
            self.estimated = True
            return estimate
        exact = queryset.order_by()[: bound + 1].count()
        if exact <= bound:
            return exact
        self.estimated = True  # the planner thought fewer: more than two pages, how many is not known
        return bound + 1

    @property
    def count_display(self) -> str:
        """Return the count with thousands separators (the page says "about" it when estimated)."""
        return f"{self.count:,}"

    @cached_property
    def num_pages(self) -> int:
        """Return the number of pages, at most MAX_PAGES."""
        if self.count == 0:
            return 1
        return min(math.ceil(self.count / self.per_page), MAX_PAGES)

    def page(self, number: Any) -> Page:
        """Return a full page (an estimated count must not cut the page short)."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], number, self)


def _days(queryset: QuerySet[Any], table: str, first: date, last: date) -> QuerySet[Any]:
    """Keep the rows of `table` from day `first` to day `last`, cut by its partition key (pruned plans)."""
    key = partitions.KEYS[table]
    low, high = partitions.day_bounds(table, first)[0], partitions.day_bounds(table, last)[1]
    return queryset.filter(**{f"{key}__gte": low, f"{key}__lt": high})


class CreatedRangeFilter(admin.SimpleListFilter):
    """Rows of the last days (by their partition key: a delivery's id carries its day); today and yesterday
    unless asked."""

    title = "created (UTC)"
    table = partitions.DELIVERY
    parameter_name = "range"
    DEFAULT = "2d"
    DAYS = {"2d": 2, "7d": 7, "14d": 14}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Return the ranges offered."""
        return [
            ("2d", "Today and yesterday"),
            ("7d", "Last 7 days"),
            ("14d", "Last 14 days"),
            ("all", "Any date"),
        ]

    def __init__(self, request: HttpRequest, params: Any, model: Any, model_admin: Any) -> None:
        # A chosen day overrides the range (and the range's links drop the day).
        self.day_chosen = bool(request.GET.get(CreatedDayFilter.parameter_name))
        super().__init__(request, params, model, model_admin)

    def value(self) -> str:
        """Return the range asked for, or the default."""
        return str(super().value() or self.DEFAULT)

    def choices(self, changelist: Any) -> Any:
        """Offer the ranges, the default one selected when none is asked for (no "All": that is "Any date")."""
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup and not self.day_chosen,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}, ["day"]),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Keep the range's days; nothing when a day is chosen (CreatedDayFilter) or any date is asked."""
        value = self.value()
        if value == "all" or self.day_chosen:
            return queryset
        if value not in self.DAYS:
            raise IncorrectLookupParameters(f"range: {value!r} is not one of 2d, 7d, 14d, all")
        today = _today()
        return _days(queryset, self.table, today - timedelta(days=self.DAYS[value] - 1), today)


class CreatedDayFilter(admin.SimpleListFilter):
    """Rows of one UTC day: the days that have partitions, or any day given as ?day=YYYY-MM-DD."""

    title = "day (UTC)"
    parameter_name = "day"
    table = partitions.DELIVERY

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Return the days with a partition, newest first (read from the catalog, not from the rows)."""
        days = [d for d in partitions.day_partitions(self.table) if d <= _today()]
        return [(d.isoformat(), d.isoformat()) for d in reversed(days)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Keep the deliveries of the day asked for."""
        value = self.value()
        if not value:
            return queryset
        try:
            day = date.fromisoformat(value)
        except ValueError:
            raise IncorrectLookupParameters(f"day: {value!r} is not a date (YYYY-MM-DD)") from None
        return _days(queryset, self.table, day, day)


class ChoicesFilter(admin.SimpleListFilter):
    """Filter a plain text column on fixed choices, instead of Django's SELECT DISTINCT over the whole table."""

    field = ""

    def values(self) -> list[str]:
        """Return the values offered."""
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Return the values offered, as (value, label)."""
        return [(v, v) for v in self.values()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Keep the rows with the value asked for (any value may be given in the URL)."""
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class ChannelFilter(ChoicesFilter):
    """The delivery's channel."""

    title = parameter_name = field = "channel"

    def values(self) -> list[str]:
        """Return the channels."""
        return list(settings.CHANNELS)


class PriorityFilter(ChoicesFilter):
    """The delivery's priority."""

    title = parameter_name = field = "priority"

    def values(self) -> list[str]:
        """Return the priorities."""
        return ["high", "normal", "low"]


class ProviderFilter(ChoicesFilter):
    """The provider that sent the delivery: the configured ones (another can be given in the URL)."""

    title = parameter_name = field = "provider"

    def values(self) -> list[str]:
        """Return the configured providers, and the sandbox."""
        configured = {p for names in settings.CHANNEL_PROVIDERS.values() for p in names}
        return sorted(configured | {"sandbox"})


class NotificationCreatedRangeFilter(CreatedRangeFilter):
    """Notifications of the last days (by created_at, their partition key)."""

    table = partitions.NOTIFICATION


class NotificationCreatedDayFilter(CreatedDayFilter):
    """Notifications of one UTC day."""

    table = partitions.NOTIFICATION


class CategoryFilter(ChoicesFilter):
    """The notification's category: the configured ones."""

    title = parameter_name = field = "category"

    def values(self) -> list[str]:
        """Return the configured categories."""
        return sorted(settings.NOTIFIER_CATEGORIES)
