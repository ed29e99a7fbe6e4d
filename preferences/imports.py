"""Imports of recipients from CSV or JSON Lines: reading rows, mapping columns, and running an import in chunks.

One runner serves `manage.py import_recipients` and the admin's import (a Celery task on the maintenance
queue): rows are read, mapped to the batch's items (`{"user_id", "email", …, "topics"}`) and written a chunk
at a time by preferences.bulk.recipients_batch, each chunk in one transaction with the import's checkpoint
(`RecipientImport.committed_line`, its counts and the rows it refused). Killed mid-way, an import resumes after
its last committed chunk: no row is written twice and none is skipped (and writing one twice would change
nothing: rows are upserted by user id).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record
from core import progress
from preferences.bulk import batch_counts, recipients_batch
from preferences.models import RecipientImport
from preferences.serializers import RecipientBatchItemSerializer

CHUNK_ROWS = 1000
# The refused rows an import keeps to show (the counts are always whole).
MAX_REPORTED = 10_000
# The admin keeps the uploaded file in the database: bounded.
MAX_UPLOAD_BYTES = 64 * 1024 * 1024


def import_targets() -> list[str]:
    """Return the fields a file column can be mapped to: the batch item's (so the PUT's), in its order."""
    return list(RecipientBatchItemSerializer().fields)


def file_format_of(name: str, head: str) -> str:
    """Return "jsonl" or "csv": by the file's extension, else by whether its first line is a JSON object."""
    lowered = name.lower()
    if lowered.endswith((".jsonl", ".ndjson", ".json")):
        return RecipientImport.Format.JSONL
    if lowered.endswith((".csv", ".txt")):
        return RecipientImport.Format.CSV
    return RecipientImport.Format.JSONL if head.lstrip().startswith("{") else RecipientImport.Format.CSV


def file_columns(text: str, file_format: str) -> list[str]:
    """Return the columns of a file: a CSV's header, or the keys of a JSON Lines file's first 100 objects."""
    if file_format == RecipientImport.Format.CSV:
        return next(csv.reader(io.StringIO(text[:65536])), [])
    seen: dict[str, None] = {}
    for line in text.splitlines()[:100]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            seen.update(dict.fromkeys(row))
    return list(seen)


def default_mapping(columns: Iterable[str]) -> dict[str, str]:
    """Return the mapping of every column named like a recipient field (case and spaces aside) to that field."""
    targets = {t.replace("_", "").lower(): t for t in import_targets()}
    found = {}
    for column in columns:
        target = targets.get(column.replace("_", "").replace(" ", "").replace("-", "").lower())
        if target:
            found[column] = target
    return found


@dataclass
class Row:
    """One row of a file: its line number, and the item it maps to or why it cannot be read."""

    line: int
    item: dict[str, Any] | None
    problem: tuple[str, str] | None = None


def _split_topics(value: Any) -> Any:
    # A CSV cell lists topics separated by spaces, commas or semicolons; JSON gives a list.
    if isinstance(value, str):
        return [t for t in value.replace(";", " ").replace(",", " ").split() if t]
    return value


def _mapped(source: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    item = {target: source[column] for column, target in mapping.items() if column in source}
    if "topics" in item:
        item["topics"] = _split_topics(item["topics"])
    return item


def read_rows(lines: Iterable[str], file_format: str, mapping: dict[str, str]) -> Iterator[Row]:
    """Yield the rows of a file's lines (numbered from 1, the CSV header included) mapped to batch items."""
    if file_format == RecipientImport.Format.CSV:
        reader = csv.reader(iter(lines))
        header = next(reader, None)
        if header is None:
            return
        for values in reader:
            if not any(values):
                continue
            if len(values) != len(header):
                reason = f"Has {len(values)} columns where the header has {len(header)}."
                yield Row(reader.line_num, None, ("line", reason))
                continue
            yield Row(reader.line_num, _mapped(dict(zip(header, values, strict=True)), mapping))
        return
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Row(number, None, ("line", f"Not valid JSON ({exc.msg} at column {exc.colno})."))
            continue
        except ValueError:  # not UTF-8 text after all
            yield Row(number, None, ("line", "Not valid JSON."))
            continue
        if not isinstance(data, dict):
            yield Row(number, None, ("line", "Must be a JSON object."))
            continue
        yield Row(number, _mapped(data, mapping))


def fingerprint(data: bytes, *, mapping: dict[str, str], topic_key: str, dry_run: bool) -> str:
    """Return the hex SHA-256 naming an import of these bytes with these options (how a rerun finds it again)."""
    digest = hashlib.sha256(data)
    digest.update(json.dumps([mapping, topic_key, dry_run], sort_keys=True).encode())
    return digest.hexdigest()


def _chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _refusals(rows: list[Row], results: dict[int, Any]) -> list[dict[str, Any]]:
    """Return the refused rows of a chunk as [{"line", "field", "reason"}], one per field refused."""
    found = []
    for row in rows:
        if row.problem is not None:
            found.append({"line": row.line, "field": row.problem[0], "reason": row.problem[1]})
            continue
        result = results.get(row.line)
        if result is not None and result.status == 400:
            for name, reasons in result.error["fields"].items():
                found.append({"line": row.line, "field": name, "reason": " ".join(reasons)})
    return found


def import_run(job: RecipientImport, lines: Iterable[str], *, audit_actor: Any = None) -> RecipientImport:
    """Run (or resume) an import over the lines of its file; return it finished (done, or failed if it raised).

    Rows up to `job.committed_line` were written by an earlier run and are skipped. Each chunk of CHUNK_ROWS rows
    is written in one transaction with the import's new checkpoint and counts; before each, the import's row
    is locked and its checkpoint read again, so two runs of one import never write a chunk twice. A dry run
    writes no recipient, only its counts and the refused rows. One audit entry counts a finished import.
    """
    RecipientImport.objects.filter(pk=job.pk).update(status=RecipientImport.Status.RUNNING, error="")
    extra_topics = [job.topic_key] if job.topic_key else []
    rows = read_rows(lines, job.file_format, job.mapping)
    skipped = (row for row in rows if row.line > job.committed_line)
    remaining = max(job.total_lines - job.committed_line, 0) or None
    try:
        with progress.task(f"import {job.name}", total=remaining, unit="lines") as work:
            last_line = job.committed_line
            for chunk in _chunks(skipped, CHUNK_ROWS):
                readable = [row for row in chunk if row.item is not None]
                with transaction.atomic():
                    locked = RecipientImport.objects.select_for_update().get(pk=job.pk)
                    if locked.committed_line >= chunk[-1].line:
                        continue  # another run of this import wrote this chunk meanwhile
                    results = recipients_batch(
                        items=[row.item for row in readable],
                        dry_run=job.dry_run,
                        extra_topics=extra_topics,
                        environment_id=job.environment_id,
                    )
                    by_line = {row.line: result for row, result in zip(readable, results, strict=True)}
                    counts = batch_counts(results)
                    refusals = _refusals(chunk, by_line)
                    locked.created += counts["created"]
                    locked.updated += counts["updated"]
                    locked.refused += counts["refused"] + sum(1 for row in chunk if row.problem is not None)
                    room = MAX_REPORTED - len(locked.refusals)
                    if room > 0:
                        locked.refusals = [*locked.refusals, *refusals[:room]]
                    locked.committed_line = chunk[-1].line
                    locked.save(update_fields=["created", "updated", "refused", "refusals", "committed_line"])
                work.advance(chunk[-1].line - last_line)
                last_line = chunk[-1].line
    except Exception as exc:
        RecipientImport.objects.filter(pk=job.pk).update(status=RecipientImport.Status.FAILED, error=str(exc)[:2000])
        raise
    with transaction.atomic():
        job = RecipientImport.objects.select_for_update().get(pk=job.pk)
        job.status = RecipientImport.Status.DONE
        job.finished_at = timezone.now()
        job.committed_line = max(job.committed_line, job.total_lines)
        job.save(update_fields=["status", "finished_at", "committed_line"])
        if audit_actor is not None and not job.dry_run:
            counts = {"created": job.created, "updated": job.updated, "refused": job.refused}
            audit_record(
                actor=audit_actor, action="recipients.import", target_type="recipient_import", target_id=job.pk,
                changes={**counts, "file_format": job.file_format},
            )  # fmt: skip
    return job


def count_lines(lines: Iterable[str]) -> int:
    """Return how many lines there are (a file's progress is counted in lines)."""
    return sum(1 for _ in lines)
