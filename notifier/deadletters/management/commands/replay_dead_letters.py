"""Replay dead letters from the command line: `replay_dead_letters [--all] [--channel C] [--id N ...] [--dry-run]`."""

from __future__ import annotations

import getpass
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core import progress
from notifier.deadletters.selectors import dead_letters_replayable
from notifier.deadletters.services import dead_letters_replay


def _default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in a bare container
        return "cli"


class Command(BaseCommand):
    help = "Put failed deliveries of pending dead letters back on their queues."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--all", action="store_true", help="Replay every pending dead letter.")
        parser.add_argument("--channel", choices=settings.CHANNELS, help="Only dead letters of this channel.")
        parser.add_argument(
            "--id", dest="ids", type=int, nargs="+", action="extend", metavar="N", help="Dead letter ids."
        )
        parser.add_argument("--dry-run", action="store_true", help="Only count what would be replayed.")
        parser.add_argument("--actor", default=None, help="Name recorded as who replayed (default cli:<user>).")

    def handle(self, *args: Any, **options: Any) -> None:
        ids: list[int] | None = options["ids"]
        if not ids and not options["all"]:
            raise CommandError("Give --all or --id N ...")
        if ids and options["all"]:
            raise CommandError("Give either --all or --id, not both.")
        channel = options["channel"]
        if options["dry_run"]:
            count = dead_letters_replayable(ids=ids, channel=channel).count()
            self.stdout.write(f"{count} dead letter(s) would be replayed.")
            return
        with progress.reporting(self.stderr):
            replayed = dead_letters_replay(
                ids=ids, all=options["all"], channel=channel, actor=options["actor"] or _default_actor()
            )
        self.stdout.write(self.style.SUCCESS(f"{replayed} delivery(ies) replayed."))
