"""The one way owned rows are read and written: the owner of the work at hand, and the managers that apply it.

Every row an API key makes belongs to that key's project environment (its *owner*, an `Environment` id). Some
tables carry the owner in their own `environment_id` column; the rest are owned through their parent row (a
template version through its template, a delivery through its notification) and say so with `owner_path`.

The owner of the work at hand is a context variable:
- the API's authentication enters the key's environment for the rest of the request (and the request
  middleware leaves it again, so a thread that serves the next request starts with none);
- tasks that look rows up by a caller's name (a template key, a user id) enter the owner of the row they
  were given (`owner_scope`);
- code that spans owners (relays, sweepers, retention, a superuser's admin) runs with none.

Inside a scope, every query through an owned model's default manager is narrowed to the owner (reverse
relations too: Django builds them from the default manager), and every row created without an owner gets it.
Outside any scope nothing is narrowed, and a row created without an owner belongs to the default project's live
environment: the shell, staff scripts and tests written before projects keep working.

Why a context and not an argument on every call: a view or selector cannot forget it, and the hundreds of
lookups by key that existed before owners needed no change to become owned. Raw SQL cannot see the context:
each statement on an owned table names `environment_id` (or joins its parent's), which
tests/architecture/test_owners.py checks. PostgreSQL's row-level security would also cover raw SQL, but the
service connects as the database's owner (who bypasses policies unless every table forces them), and the send
workers and the fan-out process many owners' rows in one statement by design.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, TypeVar, cast

from django.db import models

from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID

_owner: ContextVar[int | None] = ContextVar("notifier_owner", default=None)

_Q = TypeVar("_Q", bound="OwnedQuerySet[Any]")
_M = TypeVar("_M", bound=models.Model)


def current_environment_id() -> int | None:
    """Return the environment id of the work at hand, or None outside any scope."""
    return _owner.get()


def scope_environment_id() -> int:
    """Return the environment of the work at hand; raise LookupError outside any scope.

    For lookups by a name the caller chose (a user id): every project environment may have a row of that name,
    and outside a scope the lookup would find any of them (as the inbox token's and the signed links' pages did
    before they entered their recipient's scope). Such a lookup fails loudly instead.
    """
    found = _owner.get()
    if found is None:
        raise LookupError("a lookup by a caller's name outside any owner's scope (projects.scoping.owner_scope)")
    return found


def owner_default() -> int:
    """Return the owner a new row gets when its code names none: the scope's, else the default live environment."""
    found = _owner.get()
    return DEFAULT_LIVE_ENVIRONMENT_ID if found is None else found


@contextmanager
def owner_scope(environment_id: int | None) -> Iterator[None]:
    """Run the block as the work of `environment_id` (None: of no one owner, as relays and sweepers are)."""
    token = _owner.set(environment_id)
    try:
        yield
    finally:
        _owner.reset(token)


def enter_request_owner(environment_id: int) -> None:
    """Make `environment_id` the owner of the rest of the current request (the authentication's call)."""
    _owner.set(environment_id)


def request_scope_begin() -> Token[int | None]:
    """Start a request with no owner; return the token `request_scope_end` takes."""
    return _owner.set(None)


def request_scope_end(token: Token[int | None]) -> None:
    """End a request's scope: the thread's next request starts with no owner whatever this one entered."""
    _owner.reset(token)


class OwnedQuerySet(models.QuerySet[_M]):
    """Rows of an owned model, narrowed to one owner by `of` (the scope's manager does it by itself)."""

    def of(self: _Q, environment_id: int) -> _Q:
        """Return the rows of one environment."""
        manager = self.model._default_manager
        path = getattr(manager, "owner_path", "environment_id")
        if getattr(manager, "shared_null", False):
            return self.filter(models.Q(**{path: environment_id}) | models.Q(**{f"{path}__isnull": True}))
        return self.filter(**{path: environment_id})


class OwnedManager(models.Manager[_M]):
    """The default manager of an owned model: narrows every query to the scope's owner, if there is one.

    `owner_path` is the lookup of the owner: `environment_id` on a table that carries it, else the way through
    the parent (`template__environment_id`). `shared_null`: rows without an owner are installation-wide and
    visible to every owner (suppressions from provider bounces and complaints).
    """

    _queryset_class = OwnedQuerySet

    def __init__(self, owner_path: str = "environment_id", *, shared_null: bool = False) -> None:
        super().__init__()
        self.owner_path = owner_path
        self.shared_null = shared_null

    def deconstruct(self) -> tuple[bool, str | None, str | None, tuple[Any, ...], dict[str, Any]]:
        # Migrations never see this manager (use_in_migrations is off); the arguments are spelled for Django's check.
        as_manager, path, qs_class, _, _ = super().deconstruct()
        return as_manager, path, qs_class, (self.owner_path,), {"shared_null": self.shared_null}

    def get_queryset(self) -> OwnedQuerySet[_M]:
        queryset: OwnedQuerySet[_M] = super().get_queryset()  # type: ignore[assignment]
        found = _owner.get()
        return queryset if found is None else queryset.of(found)


def owner_field(**options: Any) -> models.ForeignKey[Any, Any]:
    """Return the `environment` column of a model that carries its owner itself."""
    options.setdefault("on_delete", models.PROTECT)
    options.setdefault("related_name", "+")
    options.setdefault("db_index", False)
    # A nullable owner (installation-wide rows) is the scope's when there is one, else none.
    options.setdefault("default", current_environment_id if options.get("null") else owner_default)
    if not options.get("null"):
        # Rows inserted by SQL that names no owner (tests, staff scripts) land where the ORM's unscoped rows do.
        # The application's own statements all name it (tests/architecture/test_owners.py).
        options.setdefault("db_default", DEFAULT_LIVE_ENVIRONMENT_ID)
    return models.ForeignKey("projects.Environment", **options)


_F = TypeVar("_F", bound=Callable[..., Any])


def as_client_owner(func: _F) -> _F:
    """Run a service called with `client=` as the work of that client's environment.

    For services whose writes may run on another request's thread (the accept's group commit writes concurrent
    requests on whichever thread leads the group): the scope is the client's, whatever the thread's was.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # owner_scope's work without its generator: this wraps every accept, a single's included.
        token = _owner.set(kwargs["client"].environment_id)
        try:
            return func(*args, **kwargs)
        finally:
            _owner.reset(token)

    return cast(_F, wrapper)


def owner_id(row: Any) -> int:
    """Return the environment id of a row that carries its owner (typed: the column is NOT NULL)."""
    found: int = row.environment_id  # typed by annotation, not cast(): a call less, several times per request
    return found
