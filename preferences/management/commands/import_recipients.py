"""Import recipients from a CSV or JSON Lines file: `manage.py import_recipients FILE [--topic KEY] [--dry-run]`.

Each row is created or updated as `PUT /api/v1/recipients/{user_id}` would (the same checks), a thousand at a
time; a row that fails is reported (line, field, reason) and the others go in. Interrupted, the same command
resumes after the last chunk it committed (docs/recipients.md, "Importing").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.services import Actor
from core import progress
from preferences import imports
from preferences.models import RecipientImport
from preferences.selectors import topic_get
from projects.scoping import owner_scope
from projects.selectors import ProjectNotFound, environment_of


class Command(BaseCommand):
    """Import (or check, with --dry-run) the recipients of a file into a project environment."""

    help = "Create or update recipients from a CSV (with a header) or JSON Lines file; resumes after an interruption."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="A .csv file with a header row, or a .jsonl file of one object per line.")
        parser.add_argument("--topic", default="", help="A topic (it must exist) every imported recipient joins.")
        parser.add_argument("--dry-run", action="store_true", help="Write nothing; report what would change.")
        parser.add_argument("--project", default="default", help="The project to import into (default: default).")
        parser.add_argument("--test", action="store_true", help="Into the project's test environment (else live).")
        parser.add_argument("--format", choices=["csv", "jsonl"], help="The file's format (default: by its extension).")
        parser.add_argument(
            "--map",
            action="append",
            default=[],
            metavar="COLUMN=FIELD",
            help="Read a recipient field from a column of another name (repeatable); other columns named like a field.",
        )
        parser.add_argument("--restart", action="store_true", help="Start from the first line, not where it stopped.")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        if not path.is_file():
            raise CommandError(f"No such file: {path}")
        try:
            environment = environment_of(project=options["project"], mode="test" if options["test"] else "live")
        except ProjectNotFound as exc:
            raise CommandError(str(exc)) from None
        data = path.read_bytes()
        head = data[:65536].decode("utf-8-sig", errors="replace")
        file_format = options["format"] or imports.file_format_of(path.name, head)
        mapping = self._mapping(options["map"], imports.file_columns(head, file_format))
        if "user_id" not in mapping.values():
            raise CommandError("No column maps to user_id (name one user_id, or pass --map COLUMN=user_id).")
        with owner_scope(environment.pk):
            if options["topic"] and topic_get(key=options["topic"]) is None:
                raise CommandError(f"Unknown topic '{options['topic']}' in {environment}; create it first.")
        fingerprint = imports.fingerprint(
            data, mapping=mapping, topic_key=options["topic"], dry_run=options["dry_run"]
        )  # fmt: skip
        with path.open(encoding="utf-8-sig", newline="") as lines:
            total = imports.count_lines(lines)
        job = None if options["restart"] or options["dry_run"] else self._unfinished(environment.pk, fingerprint)
        if job is None:
            job = RecipientImport.objects.create(
                environment_id=environment.pk,
                name=path.name[:255],
                file_format=file_format,
                fingerprint=fingerprint,
                mapping=mapping,
                topic_key=options["topic"],
                dry_run=options["dry_run"],
                total_lines=total,
                created_by="import_recipients",
            )
        else:
            self.stderr.write(f"Resuming import {job.pk} after line {job.committed_line:,} of {total:,}.")
        with progress.reporting(self.stderr), path.open(encoding="utf-8-sig", newline="") as lines:
            job = imports.import_run(job, lines, audit_actor=Actor("system", name="import_recipients"))
        self._report(job)

    def _mapping(self, pairs: list[str], columns: list[str]) -> dict[str, str]:
        mapping = imports.default_mapping(columns)
        targets = set(imports.import_targets())
        for pair in pairs:
            column, _, target = pair.partition("=")
            if target not in targets:
                raise CommandError(f"--map {pair}: the field must be one of {', '.join(sorted(targets))}.")
            mapping = {c: t for c, t in mapping.items() if t != target}
            mapping[column] = target
        return mapping

    def _unfinished(self, environment_id: int, fingerprint: str) -> RecipientImport | None:
        found = RecipientImport.objects.filter(environment_id=environment_id, fingerprint=fingerprint)
        return found.exclude(status=RecipientImport.Status.DONE).order_by("-pk").first()

    def _report(self, job: RecipientImport) -> None:
        verb = "would be" if job.dry_run else "were"
        self.stdout.write(f"{job.created:,} {verb} created, {job.updated:,} {verb} updated, {job.refused:,} refused.")
        for refusal in job.refusals:
            self.stdout.write(f"line {refusal['line']}: {refusal['field']}: {refusal['reason']}")
        if job.refused > len(job.refusals):
            self.stdout.write(f"(the first {len(job.refusals):,} refused rows are listed)")
