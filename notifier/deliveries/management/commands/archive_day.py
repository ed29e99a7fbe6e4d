"""Export one day of the delivery log to the archive: `archive_day YYYY-MM-DD`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core import progress
from notifier.deliveries.archive import ArchiveError, archive_day


def parse_day(value: str) -> dt.date:
    """Return the date of a YYYY-MM-DD argument, or raise a CommandError that says what is wrong."""
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"day: {value!r} is not a date (YYYY-MM-DD)") from None


class Command(BaseCommand):
    help = "Export the notifications, deliveries and delivery events of one UTC day to the archive (S3)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("day", help="The UTC day to export, YYYY-MM-DD.")

    def handle(self, *args: Any, **options: Any) -> None:
        day = parse_day(options["day"])
        try:
            with progress.reporting(self.stderr):
                manifest = archive_day(day)
        except ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        for name, table in manifest["tables"].items():
            self.stdout.write(f"{name}: {table['rows']} rows, {len(table['files'])} file(s), {table['bytes']} bytes")
        self.stdout.write(self.style.SUCCESS(f"{day.isoformat()} archived (schema v{manifest['schema_version']})."))
