"""Writes of many recipients at once: the batch endpoint, the import command and the admin's import.

Each item is checked alone by the PUT's own serializer (RecipientBatchItemSerializer is a subclass of it), so a
bad item fails with its field and reason and the others go on, and a field the PUT learns a batch takes too. A
plain item (valid as it stands) is taken by preferences.serializers.recipient_item_fast, which returns what the
serializer would or steps aside for it (a test holds the two equal); DRF's field machinery was four fifths of a
batch's CPU. The good items are written with one `INSERT … ON CONFLICT (user_id, environment_id) DO UPDATE` per
group of items that send the same fields (their values as one JSON parameter, core.db.insert_statement), and
their topic subscriptions with one more statement: some seventy times the rate of single PUTs per CPU second
(bench/recipients_import.py). The fields sent replace those fields, as a PUT does; the others keep their value
(a new recipient gets the model's defaults).

Recipients are read by the send path straight from the database (preferences.selectors): no per-process cache
holds them, so a bulk write has nothing to invalidate. One audit entry describes a whole batch (its counts, no
personal data), where a single PUT writes one per recipient.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import connection, transaction
from rest_framework.exceptions import ValidationError

from audit.services import audit_record
from core.db import InstanceBuilder, insert_statement, json_rows
from core.errors import validation_error
from core.serializers import thread_serializer
from preferences.models import Recipient, Subscription, Topic
from preferences.selectors import recipients_for_send
from preferences.serializers import RecipientBatchItemSerializer, recipient_item_fast
from projects.scoping import scope_environment_id


@dataclass
class ItemResult:
    """What became of one item: 201 created, 200 updated, or 400 refused with the error body's `error`."""

    user_id: str | None
    status: int
    error: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the item's result as the API answers it."""
        out: dict[str, Any] = {"user_id": self.user_id, "status": self.status}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class _Item:
    index: int
    user_id: str
    fields: dict[str, Any]
    topics: list[str] = field(default_factory=list)


def _refused(item: Any, detail: Any) -> ItemResult:
    user_id = item.get("user_id") if isinstance(item, dict) else None
    return ItemResult(user_id if isinstance(user_id, str) else None, 400, validation_error(detail))


def _validated(items: Sequence[Any], extra_topics: Sequence[str]) -> tuple[list[_Item], dict[int, ItemResult]]:
    """Check every item with the PUT's validators; return the good ones and the results of the refused ones.

    A plain item is checked by recipient_item_fast, which returns what the serializer would; the rest by the
    serializer itself, which words the errors.
    """
    validator = thread_serializer(RecipientBatchItemSerializer)
    good: list[_Item] = []
    refused: dict[int, ItemResult] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            refused[index] = _refused(item, {"non_field_errors": ["Must be an object."]})
            continue
        data = recipient_item_fast(item)
        if data is None:
            try:
                data = validator.run_validation(item)
            except ValidationError as exc:
                refused[index] = _refused(item, exc.detail)
                continue
        user_id = data.pop("user_id")
        topics = list(dict.fromkeys([*data.pop("topics", []), *extra_topics]))
        good.append(_Item(index, user_id, data, topics))
    return good, refused


def _topic_ids(
    items: list[_Item], environment_id: int, refused: dict[int, ItemResult]
) -> tuple[list[_Item], dict[str, int]]:
    """Return the items whose topics all exist (the others refused, naming the unknown keys) and the topics' ids."""
    keys = {key for item in items for key in item.topics}
    if not keys:
        return items, {}
    ids = dict(Topic.objects.filter(environment_id=environment_id, key__in=keys).values_list("key", "id"))
    kept = []
    for item in items:
        unknown = [key for key in item.topics if key not in ids]
        if unknown:
            reason = f"Unknown topic(s): {', '.join(unknown)}."
            refused[item.index] = ItemResult(item.user_id, 400, validation_error({"topics": [reason]}))
        else:
            kept.append(item)
    return kept, ids


def _rounds(items: list[_Item]) -> list[list[_Item]]:
    """Split items so that no user id appears twice in a round: the n-th item of a user id goes to round n.

    One statement cannot update a row twice; run in turn, the rounds apply a user id's items in their order.
    """
    rounds: list[list[_Item]] = []
    seen: dict[str, int] = defaultdict(int)
    for item in items:
        n = seen[item.user_id]
        seen[item.user_id] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(item)
    return rounds


# A concrete field always has a column (the stubs type it `str | None` for the non-concrete ones).
_COLUMNS = {f.name: cast(str, f.column) for f in Recipient._meta.concrete_fields}
_NEW_RECIPIENT = InstanceBuilder(Recipient)


def _upsert(items: list[_Item], names: tuple[str, ...], environment_id: int) -> dict[str, tuple[int, bool]]:
    """Create or update `items` (all sending the fields `names`); return {user_id: (row id, created)}."""
    new = _NEW_RECIPIENT.new
    objs = [new(environment_id=environment_id, user_id=item.user_id, **item.fields) for item in items]
    statement = insert_statement(objs)
    quote = connection.ops.quote_name
    columns = [quote(_COLUMNS[name]) for name in names]
    updates = ", ".join(
        [*(f"{c} = EXCLUDED.{c}" for c in columns), "erased_at = NULL", "updated_at = EXCLUDED.updated_at"]
    )
    sql = (
        f"{statement.sql} ON CONFLICT (user_id, environment_id) DO UPDATE SET {updates}"
        " RETURNING id, user_id, (xmax = 0)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [statement.rows])
        return {user_id: (pk, inserted) for pk, user_id, inserted in cursor.fetchall()}


_SUBSCRIBE = (
    f"INSERT INTO {Subscription._meta.db_table} (topic_id, recipient_id, created_at)"  # noqa: S608 - table name only
    " SELECT (e->>0)::bigint, (e->>1)::bigint, now() FROM jsonb_array_elements(%s::jsonb) AS e"
    " ON CONFLICT (topic_id, recipient_id) DO NOTHING"
)


def recipients_batch(
    *,
    items: Sequence[Any],
    audit_actor: Any = None,
    dry_run: bool = False,
    extra_topics: Sequence[str] = (),
    environment_id: int | None = None,
    audit_action: str = "recipients.batch",
) -> list[ItemResult]:
    """Create or update each item as `PUT /recipients/{user_id}` would, each alone; return one result per item.

    Items are `{"user_id", <the PUT's fields>, "topics": [keys]}`; the topics (and `extra_topics`, joined by
    every item) must exist, and are joined, never left. In `environment_id`, else the scope's. `dry_run`: write
    nothing, answer what would happen. With an `audit_actor`, one audit entry (`audit_action`) counts them.
    """
    owner = environment_id if environment_id is not None else scope_environment_id()
    good, refused = _validated(items, extra_topics)
    good, topic_ids = _topic_ids(good, owner, refused)
    outcome: dict[int, ItemResult] = dict(refused)
    if dry_run:
        present = set(recipients_for_send(user_ids={item.user_id for item in good}, environment_id=owner))
        for item in good:
            outcome[item.index] = ItemResult(item.user_id, 200 if item.user_id in present else 201)
            present.add(item.user_id)
        return [outcome[i] for i in range(len(items))]
    with transaction.atomic():
        pairs: list[tuple[int, int]] = []
        for round_items in _rounds(good):
            groups: dict[tuple[str, ...], list[_Item]] = defaultdict(list)
            for item in round_items:
                groups[tuple(sorted(item.fields))].append(item)
            for names, members in groups.items():
                written = _upsert(members, names, owner)
                for item in members:
                    pk, inserted = written[item.user_id]
                    outcome[item.index] = ItemResult(item.user_id, 201 if inserted else 200)
                    pairs.extend((topic_ids[key], pk) for key in item.topics)
        if pairs:
            with connection.cursor() as cursor:
                cursor.execute(_SUBSCRIBE, [json_rows(sorted(set(pairs)))])
        results = [outcome[i] for i in range(len(items))]
        if audit_actor is not None:
            audit_record(
                actor=audit_actor,
                action=audit_action,
                target_type="recipient",
                changes=batch_counts(results),
            )
    return results


def batch_counts(results: Iterable[ItemResult]) -> dict[str, int]:
    """Return how many results were created, updated and refused (what an audit entry and a report show)."""
    counts = {"created": 0, "updated": 0, "refused": 0}
    for result in results:
        counts["created" if result.status == 201 else "updated" if result.status == 200 else "refused"] += 1
    return counts
