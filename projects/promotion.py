"""Promotion from a project's `test` environment to its `live` one: what templates, layouts and workflows share.

Each kind says what an environment uses of an object (`InUse`: a template's published version, a layout's and a
workflow's newest) through a reader, and writes a new version through its own service; here are the steps
every kind takes the same way:

- `promotion_candidates`: the objects whose version in test differs from live's, each with a unified diff of
  the canonical JSON of the two, for a reviewer to read before promoting;
- `promote`: read test's version in the test environment's scope, refuse what is unknown (404) or already in
  live (400), and let the kind write it in the live environment's scope as live's next version;
- `direct_change_check`: a project with `promotion = "required"` changes its live environment only this way
  (a live key's PUT is a 409 `promotion_required`); promotion and rollback are not direct changes.

The readers and writers run inside `owner_scope` of one environment at a time: the request's own scope is the
calling key's environment, which may be either of the two.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from core.errors import ApiError
from projects.scoping import current_environment_id, owner_scope
from projects.selectors import project_environment_ids, promotion_required

T = TypeVar("T")


@dataclass(frozen=True)
class InUse:
    """The version of an object an environment uses, and what that version holds (compared and diffed as JSON)."""

    version: int
    content: dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    """An object whose version in test differs from live's: both version numbers and the diff between them."""

    kind: str
    key: str
    test_version: int
    live_version: int | None
    diff: str


# Reads what the scope's environment uses: of every object of the kind (None), or of those keys.
Reader = Callable[[Sequence[str] | None], Mapping[str, InUse]]


def canonical_json(content: Mapping[str, Any]) -> str:
    """Return the JSON a version is compared and diffed as: keys sorted, indented, one value per line."""
    return json.dumps(content, indent=2, sort_keys=True, ensure_ascii=False)


def version_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any], *, old_label: str, new_label: str) -> str:
    """Return the unified diff between the canonical JSON of two versions' content (from nothing: `old` None)."""
    before = canonical_json(old).splitlines() if old is not None else []
    lines = difflib.unified_diff(
        before, canonical_json(new).splitlines(), fromfile=old_label, tofile=new_label, lineterm=""
    )
    return "\n".join(lines) + "\n"


def promotion_diff(*, kind: str, key: str, live: InUse | None, test: InUse) -> str:
    """Return the unified diff from live's version of an object to test's (from nothing when live has none)."""
    return version_diff(
        live.content if live is not None else None,
        test.content,
        old_label=f"live/{kind}/{key}@{live.version}" if live is not None else f"live/{kind}/{key} (none)",
        new_label=f"test/{kind}/{key}@{test.version}",
    )


def promotion_candidates(
    *, environment_id: int, readers: Mapping[str, Reader], keys: Sequence[str] | None = None
) -> list[Candidate]:
    """Return what the project of `environment_id` could promote, kind by kind in the order of `readers`, by key.

    `readers` maps each kind to its reader; `keys` narrows every kind to those keys (the admin asks for one).
    """
    test_id, live_id = project_environment_ids(environment_id=environment_id)
    found: list[Candidate] = []
    for kind, read in readers.items():
        with owner_scope(test_id):
            tests = read(keys)
        with owner_scope(live_id):
            lives = read(sorted(tests))
        for key in sorted(tests):
            test, live = tests[key], lives.get(key)
            if live is not None and live.content == test.content:
                continue
            found.append(
                Candidate(
                    kind=kind,
                    key=key,
                    test_version=test.version,
                    live_version=live.version if live is not None else None,
                    diff=promotion_diff(kind=kind, key=key, live=live, test=test),
                )
            )
    return found


def promote(
    *,
    kind: str,
    key: str,
    environment_id: int,
    read: Reader,
    exists: Callable[[str], bool],
    write: Callable[[InUse], T],
) -> T:
    """Write test's version of one object as live's next version, through `write`; return what it wrote.

    `environment_id` is the caller's (either environment of the project). `read` is the kind's reader,
    `exists` says whether the scope's environment has an object of that key at all (one without a version in
    use has nothing to promote), and `write(test)` runs in the live environment's scope with what test uses.
    Raises ApiError: 404 when test has no such object, 400 `nothing_to_promote` when it has no
    version in use or live already uses the same.
    """
    test_id, live_id = project_environment_ids(environment_id=environment_id)
    with owner_scope(test_id):
        test = read([key]).get(key)
        if test is None:
            if exists(key):
                raise ApiError(
                    400,
                    "nothing_to_promote",
                    f"The {kind} '{key}' has no published version in test.",
                    {"key": ["has no published version in test"]},
                )
            raise ApiError(404, "not_found", f"No {kind} '{key}' in test.", {"key": [f"no such {kind} in test"]})
    with owner_scope(live_id):
        live = read([key]).get(key)
        if live is not None and live.content == test.content:
            raise ApiError(
                400,
                "nothing_to_promote",
                f"Live's {kind} '{key}' (version {live.version}) already is test's version {test.version}.",
                {"key": [f"live version {live.version} already is test's version {test.version}"]},
            )
        return write(test)


def direct_change_check(*, kind: str, key: str) -> None:
    """Refuse (409 `promotion_required`) a direct change in a live environment whose project requires promotion.

    The environment is the scope's (a key's PUT runs in the key's); outside any scope nothing is refused.
    """
    environment_id = current_environment_id()
    if environment_id is None:
        return
    project = promotion_required(environment_id=environment_id)
    if project is None:
        return
    raise ApiError(
        409,
        "promotion_required",
        f"Project '{project.slug}' changes its live {kind}s only by promotion from test: change the {kind} '{key}' "
        "with a test key, then promote it (POST /api/v1/promotion).",
        {"key": [f"the live {kind} changes only by promotion from test"]},
    )
