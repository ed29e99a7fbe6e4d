"""Restore an archived day into read-only tables: `restore_day YYYY-MM-DD [--drop]`."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core import progress
from notifier.deliveries.archive import ArchiveError, restore_day, restore_drop
from notifier.deliveries.management.commands.archive_day import parse_day


class Command(BaseCommand):
    help = (
        "Load an archived day into read-only tables archive.<table>_YYYYMMDD after checking the manifest's "
        "checksums, or remove them with --drop."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("day", help="The UTC day to restore, YYYY-MM-DD.")
        parser.add_argument("--drop", action="store_true", help="Drop the day's restored tables instead.")

    def handle(self, *args: Any, **options: Any) -> None:
        day = parse_day(options["day"])
        if options["drop"]:
            dropped = restore_drop(day)
            self.stdout.write(self.style.SUCCESS(f"Dropped: {', '.join(dropped) or 'nothing restored'}."))
            return
        try:
            with progress.reporting(self.stderr):
                loaded = restore_day(day)
        except ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        for name, rows in loaded.items():
            self.stdout.write(f"archive.{name}_{day.strftime('%Y%m%d')}: {rows} rows")
        self.stdout.write(self.style.SUCCESS(f"{day.isoformat()} restored (read-only)."))
