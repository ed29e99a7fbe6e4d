"""`python manage.py partitions`: the daily partitions' state, and their maintenance by hand (docs/operations.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from core import progress
from notifier.deliveries import dedup, partitions


class Command(BaseCommand):
    help = "Show the day partitions of the hot tables; create ahead, drop behind, purge old dedup keys."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--ensure", action="store_true", help="create today's and the coming days' partitions")
        parser.add_argument(
            "--drop-old", action="store_true", help="archive (PARTITION_ARCHIVE_HOOK) and drop days past the window"
        )
        parser.add_argument("--purge-dedup", action="store_true", help="delete dedup keys older than the window")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["ensure"]:
            self.stdout.write(f"created {len(partitions.ensure_partitions())} partitions")
        if options["purge_dedup"]:
            self.stdout.write(f"purged {dedup.purge_expired()} dedup keys")
        if options["drop_old"]:
            with progress.reporting(self.stderr):
                results = partitions.drop_old_days(archive=partitions.archive_hook())
            for result in results:
                self.stdout.write(
                    f"{result.day}: dropped {len(result.dropped)} partitions, carried {result.carried or 'nothing'},"
                    f" parents locked {result.lock_seconds:.3f} s"
                )
        for table in partitions.TABLES:
            days = partitions.day_partitions(table)
            span = f"{days[0]} … {days[-1]} ({len(days)} days)" if days else "none"
            self.stdout.write(f"{table}: {span}")
