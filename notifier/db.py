"""Database helpers for the hot paths: server-side parameter binding, and bulk rows as one JSON parameter."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection


class _LoggedCursor:
    """A psycopg cursor whose statements still show in Django's query log (assertNumQueries, debug tools)."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Any = None, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return self._cursor.execute(sql, params, **kwargs)
        finally:
            if connection.queries_logged:
                connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


@contextmanager
def bound_cursor() -> Iterator[Any]:
    """Yield a server-side-binding psycopg cursor in Django's connection and transaction.

    Django's default client-side binding renders every parameter into the SQL text: for arrays of thousands
    of values that costs more than the query. Errors are still raised as Django's database errors.
    """
    connection.ensure_connection()
    # Django opens its connections with cursor_factory=ClientCursor; ask for the plain (server-binding) one.
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield _LoggedCursor(cursor)


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__} for json_rows")


def json_rows(rows: Iterable[Sequence[Any]]) -> str:
    """Encode rows of values as one JSON text, to read back with `json_array_elements(%s::json) AS e`.

    Each row is a JSON array (`e->>0`, `e->>1`, … cast to their types in SQL). For thousands of rows this is
    about three times cheaper than one bound array per column: psycopg dumps arrays element by element in
    Python, json.dumps runs in C, and each row travels whole, so no two arrays have to be zipped in order.
    """
    return json.dumps(list(rows), separators=(",", ":"), default=_encode)


def int_array(values: Iterable[int]) -> str:
    """Return integers as a PostgreSQL array literal (`'{1,2,3}'`, bound to `%s::bigint[]`), built in C.

    Bound as a Python list, psycopg would dump the array element by element in Python.
    """
    return "{" + ",".join(map(str, map(int, values))) + "}"
