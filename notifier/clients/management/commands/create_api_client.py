"""Create a calling service and print its key.

`python manage.py create_api_client NAME [--project SLUG] [--categories a,b] [--scopes s1,s2|all] [--rate-limit 200/s]
[--test]`
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.scopes import parse_scopes
from notifier.clients.models import ApiClient
from notifier.clients.rate_limit import parse_rate
from notifier.clients.services import api_client_create


class Command(BaseCommand):
    """Create an API client; its key is printed once and stored only as a hash."""

    help = "Create an API client and print its API key (shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--project", default="default", help="The project the key belongs to (default: default; create_project)."
        )
        parser.add_argument("--categories", default="", help="Comma-separated allowed categories (default: all).")
        parser.add_argument(
            "--scopes", default="send", help="Comma-separated scopes, or 'all' (default: send). See docs/security.md."
        )
        parser.add_argument(
            "--rate-limit",
            default="",
            help="Requests per period, e.g. 200/s or 1000/m (default API_CLIENT_RATE_LIMIT).",
        )
        parser.add_argument("--webhook-url", default="", help="Default webhook URL for webhook-channel sends.")
        parser.add_argument(
            "--test",
            action="store_true",
            help="A test key: the whole pipeline runs, but every delivery goes to the sandbox provider.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if ApiClient.objects.filter(name=options["name"]).exists():
            raise CommandError(f"An API client named '{options['name']}' already exists.")
        categories = [c.strip() for c in options["categories"].split(",") if c.strip()]
        try:
            scopes = parse_scopes(options["scopes"])
            if options["rate_limit"]:
                parse_rate(options["rate_limit"])
            client, raw_key = api_client_create(
                name=options["name"],
                allowed_categories=categories,
                scopes=scopes,
                mode=ApiClient.Mode.TEST if options["test"] else ApiClient.Mode.LIVE,
                project=options["project"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["webhook_url"] or options["rate_limit"]:
            client.webhook_url = options["webhook_url"]
            client.rate_limit = options["rate_limit"].strip()
            client.save(update_fields=["webhook_url", "rate_limit"])
        self.stdout.write(raw_key)
