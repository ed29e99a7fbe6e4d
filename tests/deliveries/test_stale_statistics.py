"""The send path's statements over lists of ids stay linear when the statistics predate the rows.

A day partition is analyzed while it holds a few finished deliveries, then thousands of queued ones arrive
(the first minute of a day, a burst after a quiet hour). Each statement's plan is read back with EXPLAIN
ANALYZE: it must read the rows it was given, not loop over the whole list for every row it reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from core.db import int_array, texts_param
from notifier.deliveries.dedup import _LOOKUP_SQL, _cutoff
from notifier.deliveries.models import Delivery
from notifier.deliveries.outbox import MARK_STILL_QUEUED_SQL, mark_published
from notifier.deliveries.partitions import DELIVERY, partition_name
from notifier.deliveries.queries import _LOAD_SQL
from notifier.deliveries.status import _CLAIM_SQL
from tests.conftest import test_database_url
from tests.factories import make_api_client, make_delivery

# Far enough past the seed's id that the copies never meet an id the sequence hands out meanwhile.
OFFSET = 100_000


def _copy(seed: Delivery, n: int, *, status: str, start: int) -> list[int]:
    """Insert `n` copies of `seed` with ids seed + start + 1.. and the given status; return their ids."""
    names = [str(f.column) for f in Delivery._meta.concrete_fields]
    columns = ", ".join(names)
    values = ", ".join(
        "d.id + %(start)s + g"
        if name == "id"
        else "d.address || '-' || (%(start)s + g)"
        if name == "address"
        else "%(status)s"
        if name == "status"
        else "NULL"
        if name == "published_at"
        else f"d.{name}"
        for name in names
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO notifier_delivery ({columns}) SELECT {values} FROM notifier_delivery d"
            " CROSS JOIN generate_series(1, %(n)s) g WHERE d.id = %(seed)s RETURNING id",
            {"start": start, "status": status, "n": n, "seed": seed.pk},
        )
        return sorted(row[0] for row in cursor.fetchall())


@pytest.fixture
def queued_unseen(db: None) -> list[int]:
    """Return 3,000 queued deliveries of today's partition, analyzed when it held 200 sent ones."""
    seed = make_delivery(status=Delivery.Status.SENT)
    _copy(seed, 200, status="sent", start=OFFSET)
    with connection.cursor() as cursor:
        cursor.execute(f'ANALYZE "{partition_name(DELIVERY, timezone.now().astimezone(UTC).date())}"')
    return _copy(seed, 3000, status="queued", start=OFFSET + 1000)


def _plan(sql: str, params: list[Any] | dict[str, Any]) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _total(node: dict[str, Any], key: str) -> float:
    """Return a per-loop figure of EXPLAIN ANALYZE over all of the node's loops."""
    return float(node.get(key, 0)) * float(node.get("Actual Loops", 1))


def _join_filter_rejects(plan: dict[str, Any]) -> float:
    return sum(_total(node, "Rows Removed by Join Filter") for node in _nodes(plan))


def _rows_read(plan: dict[str, Any], table: str) -> float:
    """Return the rows the plan's scans of `table` (its partitions) produced or filtered out."""
    return sum(
        _total(node, "Actual Rows")
        + _total(node, "Rows Removed by Filter")
        + _total(node, "Rows Removed by Index Recheck")
        for node in _nodes(plan)
        if node.get("Relation Name", "").startswith(table)
    )


def test_marking_two_published_deliveries_reads_those_two(queued_unseen: list[int]) -> None:
    ids = queued_unseen[-2:]
    plan = _plan(MARK_STILL_QUEUED_SQL, [int_array(ids), min(ids), max(ids), min(ids), max(ids)])
    assert _join_filter_rejects(plan) == 0
    # Found in the sub-select and again by the UPDATE: two rows each, not the day's 3,000 queued ones.
    assert _rows_read(plan, "notifier_delivery") <= 4


@pytest.mark.parametrize("size", [100, 3000])
@pytest.mark.parametrize("statement", ["mark", "load", "claim"])
def test_the_mark_claim_and_load_never_loop_over_the_ids_per_row(
    queued_unseen: list[int], statement: str, size: int
) -> None:
    ids = queued_unseen[:size]
    low, high = min(ids), max(ids)
    statements: dict[str, tuple[str, list[Any] | dict[str, Any]]] = {
        "mark": (MARK_STILL_QUEUED_SQL, [int_array(ids), low, high, low, high]),
        "load": (_LOAD_SQL, [int_array(ids), low, high]),
        "claim": (_CLAIM_SQL, {"ids": int_array(ids), "low": low, "high": high, "lease": 60}),
    }
    sql, params = statements[statement]
    plan = _plan(sql, params)
    # A loop over the ids for every row read would reject size x (size - 1) rows.
    assert _join_filter_rejects(plan) < size
    # A few passes over the day's rows at most (found, then updated; a scan of the whole partition is linear
    # too); a loop over the ids per row read would be size times the rows.
    assert _rows_read(plan, "notifier_delivery") <= 4 * (len(queued_unseen) + 201)


def test_the_dedup_lookup_probes_only_the_keys_asked_for(db: None) -> None:
    client = make_api_client()
    now = timezone.now()

    def keys(first: int, n: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO notifier_dedupkey (client_id, dedup_key, notification_id, request_hash, created_at)"
                " SELECT %s, 'k-' || g, gen_random_uuid(), 'h', %s FROM generate_series(%s, %s) g",
                [client.pk, now, first, first + n - 1],
            )

    keys(1, 10)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notifier_dedupkey")
    keys(11, 5000)
    wanted = [f"k-{i}" for i in range(2000, 2100)]
    plan = _plan(_LOOKUP_SQL, [texts_param(wanted), client.pk, _cutoff()])
    assert _rows_read(plan, "notifier_dedupkey") == len(wanted)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("still_queued", [True, False])
def test_the_mark_skips_a_row_locked_by_a_claim_and_never_waits(still_queued: bool) -> None:
    """A mark that waited on a claim while the claim waited on the mark's rows was a deadlock."""
    first = make_delivery(status=Delivery.Status.QUEUED)
    ids = [first.pk, *_copy(first, 2, status="queued", start=OFFSET)]
    with psycopg.connect(test_database_url(), autocommit=False) as claim:
        claim.execute("SELECT id FROM notifier_delivery WHERE id = %s FOR UPDATE", [ids[1]])
        with connection.cursor() as cursor:
            # A mark that waits fails the test here instead of hanging it.
            cursor.execute("SET lock_timeout = '5s'")
        try:
            mark_published(ids, still_queued=still_queued)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
            claim.rollback()
    marked = set(Delivery.objects.filter(pk__in=ids, published_at__isnull=False).values_list("pk", flat=True))
    assert marked == {ids[0], ids[2]}
