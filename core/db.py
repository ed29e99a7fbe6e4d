"""Database helpers for the hot paths: server-side parameter binding, and bulk rows as one JSON parameter."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

import orjson
import psycopg
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection
from django.db.models import BooleanField, DateTimeField, Field, JSONField, Model, UUIDField
from django.db.models.base import ModelState

M = TypeVar("M", bound=Model)


class _LoggedCursor:
    """A psycopg cursor whose statements still show in Django's query log (assertNumQueries, debug tools)."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Any = None, **kwargs: Any) -> psycopg.Cursor[Any]:
        started = time.monotonic()
        try:
            return self._cursor.execute(sql, params, **kwargs)
        finally:
            if connection.queries_logged:
                connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


@contextmanager
def bound_cursor() -> Iterator[psycopg.Cursor[Any]]:
    """Yield a server-side-binding psycopg cursor in Django's connection and transaction.

    Django's default client-side binding renders every parameter into the SQL text: for arrays of thousands
    of values that costs more than the query. Errors are still raised as Django's database errors.
    """
    connection.ensure_connection()
    # Django opens its connections with cursor_factory=ClientCursor; ask for the plain (server-binding) one.
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        # The wrapper forwards every other attribute to the cursor, so it is used as one.
        yield cast("psycopg.Cursor[Any]", _LoggedCursor(cursor))


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} for json_rows")


def json_rows(rows: Iterable[Sequence[Any]]) -> str:
    """Encode rows of values as one JSON text, to read back with `jsonb_array_elements(%s::jsonb) AS e`.

    Each row is a JSON array (`e->>0`, `e->>1`, … cast to their types in SQL). For thousands of rows this is
    about three times cheaper than one bound array per column: psycopg dumps arrays element by element in
    Python, the encoder runs in C, and each row travels whole, so no two arrays have to be zipped in order.

    orjson encodes what the standard encoder would, to the same JSON values (datetimes and UUIDs as their
    isoformat and text, as `_encode` writes them), in a fraction of its time. What orjson refuses (an integer
    past 64 bits, a lone surrogate, a key that is not a string) goes to the standard encoder, which writes it
    as before, so PostgreSQL takes or refuses it as it always did. One value differs: a non-finite float is
    written as null, where the standard encoder wrote NaN for PostgreSQL to refuse; none reaches a row, since
    every body holding one is refused at parse time (core.bodies; docs/decisions/0086).
    """
    listed = list(rows)
    try:
        return orjson.dumps(listed, default=_encode).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(listed, separators=(",", ":"), default=_encode)


def int_array(values: Iterable[int]) -> str:
    """Return integers as a PostgreSQL array literal (`'{1,2,3}'`, bound to `%s::bigint[]`), built in C.

    Bound as a Python list, psycopg would dump the array element by element in Python.

    Match rows with `id = ANY(%s::bigint[])`, never with the semi-join `id IN (SELECT unnest(%s::bigint[]))`. The
    semi-join's plan depends on the statistics: where they predate the rows (a day partition filling in its first
    minute, a burst of queued rows into a table last analyzed when all were sent), the planner takes the table's
    side for a row or two and loops over the whole array for every row it reads: a mark of 20,000 ids took
    20-26 s. `= ANY` has no join to get wrong: a primary-key probe per id, or a hashed test per row read, under
    a second for the same (bench/stale_statistics.py).
    """
    return "{" + ",".join(map(str, map(int, values))) + "}"


def texts_param(values: Iterable[str]) -> str:
    """Return strings as one JSON parameter, read in SQL as rows with `jsonb_array_elements_text(%s::jsonb)`.

    Django's cursor quotes each element of a list into the SQL text: for a batch's thousand dedup keys, about
    11 ms of a 13 ms lookup, where this one parameter takes 2.5 ms in all.
    """
    return json.dumps(list(values))


# Beyond this many ids between a batch's lowest and highest, reading the span costs more than planning.
SPAN_PLANNED_PER_CALL = 10_000


def span_prepare(ids: Sequence[int]) -> bool | None:
    """Return psycopg's `prepare` for a statement over `id = ANY(ids) AND id BETWEEN min AND max`.

    Prepared, such a statement reaches PostgreSQL's generic plan after a few runs, made without the values. It
    estimates a range of parameters as a fixed small fraction of the table, which can make it read every row
    between the bounds: with the statements' earlier semi-join, 200,000 rows and 24 ms to mark 2 ids, where
    planning with the values probed the primary key per id in 0.1 ms plus 0.4 ms of planning. A narrow span
    (a fan-out page, singles accepted together) keeps the prepared statement (None: psycopg's default); a wide
    one (a relay batch over a day, scheduled deliveries woken together) is planned with its values each time
    (False).
    """
    if ids and max(ids) - min(ids) > SPAN_PLANNED_PER_CALL:
        return False
    return None


class RowLoader(Generic[M]):
    """Build model instances from the columns of a raw row, without Model.__init__, for the send path.

    Django's queryset spends about 20 us per instance (signals, a setattr per field, the related-object
    populator); a batch loads 500 deliveries with their recipients. These instances are ordinary ones (saved,
    refreshed and compared as usual); the fields left out are deferred, exactly as with `.defer()`.
    """

    def __init__(self, model: type[M], *, skip: Sequence[str] = ()) -> None:
        self.model = model
        fields: list[Field[Any, Any]] = [f for f in model._meta.concrete_fields if f.attname not in skip]
        self.attnames = [f.attname for f in fields]
        self._columns = [f.column for f in fields]
        self.width = len(fields)
        # Only JSON fields convert here (Django's psycopg setup hands jsonb over as text).
        self.converters = [(i, f) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]

    def columns(self, alias: str) -> str:
        """Return the select list for this model's loaded fields under a table alias."""
        return ", ".join(f'{alias}."{column}"' for column in self._columns)

    def build(self, values: Sequence[Any]) -> M:
        """Return an instance holding `values`, in the order of `columns()`."""
        row = list(values)
        for i, field in self.converters:
            value = row[i]
            # Most preference columns hold an empty object: no JSON parse for that.
            row[i] = {} if value == "{}" else field.from_db_value(value, None, connection)
        instance = self.model.__new__(self.model)
        instance.__dict__.update(zip(self.attnames, row, strict=True))
        state = instance._state = ModelState()
        # Its rows come through `connection`, the default alias's proxy (the project routes nothing elsewhere);
        # asking the proxy for its alias per row took most of building a batch's recipients.
        state.adding, state.db = False, DEFAULT_DB_ALIAS
        return instance


class InstanceBuilder(Generic[M]):
    """Build new, unsaved model instances as `model(**values)` does, without Model.__init__, for the accept path.

    Model.__init__ with keywords looks every field up, sets each through its descriptor and sends two signals: a
    fifth of a batch item's accept, for a notification and a delivery per item. Here the defaults of the fields
    not given are worked out once (a callable default is still called per instance, as Django does), a related
    object given by name sets its id and is cached as the descriptor would cache it, and everything else is
    stored as given. The models built so have no pre_init/post_init receivers (a test holds both ways equal).
    """

    def __init__(self, model: type[M]) -> None:
        self.model = model
        fields: list[Field[Any, Any]] = list(model._meta.concrete_fields)
        # A field without a default has a constant one (None, or "" for text): only a callable default is
        # called per instance (`NOT_PROVIDED`, a class, is callable itself).
        called = [f for f in fields if f.has_default() and callable(f.default)]
        self._defaults = {f.attname: f.get_default() for f in fields if f not in called}
        self._called = [(f.attname, f) for f in called]
        self._related = {f.name: f.attname for f in fields if f.is_relation}

    def new(self, **values: Any) -> M:
        """Return an unsaved instance holding `values` (field names, or attnames) and every other field's default."""
        instance = self.model.__new__(self.model)
        state = instance._state = ModelState()
        found = instance.__dict__
        found.update(self._defaults)
        for attname, field in self._called:
            if attname not in values:
                found[attname] = field.get_default()
        for name, value in values.items():
            column = self._related.get(name)
            if column is None:
                found[name] = value
            else:
                found[column] = None if value is None else value.pk
                state.fields_cache[name] = value
                if value is not None:  # as the descriptor routes both (the project sets no database router)
                    state.db = state.db or value._state.db or DEFAULT_DB_ALIAS
                    value._state.db = value._state.db or state.db
        return instance


def _insert_expression(field: Field[Any, Any], index: int) -> str:
    """Return the SQL that reads `field`'s value from element `index` of the JSON row `e`, cast to its type."""
    db_type = field.db_type(connection)
    if field.get_internal_type() == "JSONField":
        return f"CASE WHEN jsonb_typeof(e->{index}) = 'null' THEN NULL ELSE e->{index} END"
    if db_type and db_type.endswith("[]"):
        return f"ARRAY(SELECT jsonb_array_elements_text(e->{index}))::{db_type}"
    return f"(e->>{index})::{db_type}"


_PLAIN = (str, int)


def _as_is(value: Any) -> Any:
    return value


def _aware_iso(value: datetime) -> Any:
    # A naive datetime is get_prep_value's to warn about and make aware: None sends it there.
    return value.isoformat() if value.tzinfo is not None else None


def _prepared(field: Field[Any, Any]) -> tuple[type, Callable[[Any], Any]] | None:
    """Return (type, encode) where a value of exactly that type needs no get_prep_value, only encoding.

    What get_prep_value returns for such a value is the value itself, and `encode` gives what json_rows would
    write of it (a datetime as isoformat, a UUID as its text): calling neither per value saves about a sixth of
    building a notification's and a delivery's rows. A field type not listed here (or a subclass of a listed
    one: it may prepare differently) goes through get_prep_value for every value but None, str and int.
    """
    kind = type(field)
    if kind is DateTimeField:
        return datetime, _aware_iso
    if kind is UUIDField:
        return uuid.UUID, str
    if kind is BooleanField:
        return bool, _as_is
    if kind is JSONField:
        return dict, _as_is  # nested in the row, read back with e->index (see _insert_expression)
    return None


@dataclass(frozen=True)
class _InsertPlan:
    """What insert_rows needs of a model, worked out once per model: its fields and the INSERT statement."""

    pk: Any
    generated: bool
    fields: list[Any]
    stamped: list[Any]
    sql: str
    returning: str
    # Per field, in `fields` order: (field, attname, the type needing no preparation, its encoder) (_prepared).
    columns: list[tuple[Any, str, type | None, Callable[[Any], Any] | None]]


_insert_plans: dict[type[Model], _InsertPlan] = {}


def _insert_plan(model: type[Model]) -> _InsertPlan:
    """Return the model's insert plan; built on first use (the SQL's column types cost more than a row)."""
    plan = _insert_plans.get(model)
    if plan is not None:
        return plan
    meta = model._meta
    pk = meta.pk
    generated = pk is not None and pk.get_internal_type() in {"AutoField", "BigAutoField", "SmallAutoField"}
    fields = [f for f in meta.concrete_fields if not (generated and f is pk)]
    stamped = [f for f in fields if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)]
    # A concrete field always has a column (the stubs type it `str | None` for the non-concrete ones).
    columns = ", ".join(connection.ops.quote_name(cast(str, f.column)) for f in fields)
    values = ", ".join(_insert_expression(f, i) for i, f in enumerate(fields))
    table = connection.ops.quote_name(meta.db_table)
    sql = f"INSERT INTO {table} ({columns}) SELECT {values} FROM jsonb_array_elements(%s::jsonb) AS e"  # noqa: S608
    returning = f" RETURNING {connection.ops.quote_name(cast(str, pk.column))}" if generated else ""
    encoded = [(f, f.attname, *(_prepared(f) or (None, None))) for f in fields]
    plan = _InsertPlan(
        pk=pk, generated=generated, fields=fields, stamped=stamped, sql=sql, returning=returning, columns=encoded
    )
    _insert_plans[model] = plan
    return plan


@dataclass(frozen=True)
class InsertStatement(Generic[M]):
    """One INSERT … SELECT of model instances: its SQL (no RETURNING), its one parameter, and what to finish.

    For a caller that writes it as part of a larger statement (a data-modifying CTE): `returning` is the
    clause that gives back a database-generated primary key, to hand with the ids to `saved`.
    """

    objs: Sequence[M]
    sql: str
    rows: str
    returning: str

    def saved(self, ids: Sequence[Any] | None = None) -> None:
        """Mark the instances saved, setting their generated primary keys from `ids` (insert order)."""
        plan = _insert_plan(type(self.objs[0]))
        if plan.generated:
            if ids is None or len(ids) != len(self.objs):
                raise ValueError("one generated id per inserted row is needed")
            for obj, value in zip(self.objs, ids, strict=True):
                setattr(obj, plan.pk.attname, value)
        alias = connection.alias
        for obj in self.objs:
            obj._state.adding = False
            obj._state.db = alias


def insert_statement(objs: Sequence[M]) -> InsertStatement[M]:
    """Return the INSERT of model instances, their values as one JSON parameter (see insert_rows).

    Every concrete field is written, so a field added to the model later is written too; `auto_now` and
    `auto_now_add` are applied (one timestamp for all the rows, written at one moment).
    """
    if not objs:
        raise ValueError("nothing to insert")
    plan = _insert_plan(type(objs[0]))
    columns = plan.columns
    # One stamp per statement: pre_save on the first row, copied to the rest.
    stamps = [(field.attname, field.pre_save(objs[0], True)) for field in plan.stamped]
    rows = []
    for obj in objs:
        values = obj.__dict__
        values.update(stamps)
        row = []
        for field, attname, prepared, encode in columns:
            value = values[attname] if attname in values else field.value_from_object(obj)
            kind = type(value)
            # A str, an int or None is what get_prep_value would return for it (and what the cast reads back);
            # skipping the call for them halves the cost of a row.
            if value is None or kind in _PLAIN:
                row.append(value)
                continue
            if kind is prepared:
                encoded = encode(value)  # type: ignore[misc]  # set together with `prepared`
                if encoded is not None:
                    row.append(encoded)
                    continue
            row.append(field.get_prep_value(value))
        rows.append(row)
    return InsertStatement(objs=objs, sql=plan.sql, rows=json_rows(rows), returning=plan.returning)


def insert_rows(objs: Sequence[M]) -> None:
    """INSERT model instances with one statement, their values as one JSON parameter; set generated ids.

    What `bulk_create` does, at a fraction of its cost for a thousand rows: Django compiles one placeholder per
    value (a thousand rows of twenty fields is twenty thousand), this sends one. A database-generated primary
    key comes back (RETURNING, in insert order, as bulk_create relies on too).
    """
    if not objs:
        return
    statement = insert_statement(objs)
    with bound_cursor() as cursor:
        cursor.execute(statement.sql + statement.returning, [statement.rows])
        statement.saved([value for (value,) in cursor.fetchall()] if statement.returning else None)


def close_old_task_connections(sender: Any = None, **_kwargs: Any) -> None:
    """Close this thread's database connections past DATABASE_CONN_MAX_AGE or broken, as Django does per request.

    Connected to Celery's task_prerun and task_postrun in place of the Django fix-up's unconditional close
    (config/celery.py). Eager tasks run inside their caller's transaction and are left alone.
    """
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    close_old_connections()


def estimated_rows(relation: str) -> int | None:
    """Return the planner's row estimate of `relation`, summed over its partitions; None when none is known.

    From pg_class.reltuples (kept by ANALYZE and autovacuum): no scan, so it costs the same for a day and for
    a fortnight of 20 million rows. A partition never analysed (-1) counts as unknown, not as empty.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(c.reltuples) FILTER (WHERE c.reltuples >= 0)"
            " FROM pg_partition_tree(to_regclass(%s)) AS t JOIN pg_class AS c ON c.oid = t.relid"
            " WHERE t.isleaf",
            [relation],
        )
        row = cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0])


# Guards of a batch of maintenance next to the live traffic: a batch that cannot get its locks quickly gives up
# instead of queueing behind (and in front of) the live traffic, and no statement runs away.
MAINTENANCE_LOCK_TIMEOUT = "5s"
MAINTENANCE_STATEMENT_TIMEOUT = "60s"


def limit_maintenance_transaction() -> None:
    """Bound the current transaction's lock waits and statements for a maintenance batch (SET LOCAL)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{MAINTENANCE_LOCK_TIMEOUT}'")
        cursor.execute(f"SET LOCAL statement_timeout = '{MAINTENANCE_STATEMENT_TIMEOUT}'")
