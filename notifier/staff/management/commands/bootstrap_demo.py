"""`python manage.py bootstrap_demo`: a demo project with keys, template and recipient for a first run (idempotent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from core.scopes import SCOPES
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create, api_client_rotate_key
from preferences.services import recipient_upsert
from projects.models import Project
from projects.scoping import owner_scope
from projects.services import project_create
from templates_app.models import Template
from templates_app.services import template_put

DEMO_PROJECT = "demo"

DEMO_CONTENT = {
    "en": {
        "email": {
            "subject": "Order {{ order_id }} shipped",
            "text": "Hello! Your order {{ order_id }} is on its way.",
            "html": "<p>Hello! Your order <b>{{ order_id }}</b> is on its way.</p>",
        },
        "push": {"title": "Shipped", "body": "Order {{ order_id }} is on its way", "data": {"order": "{{ order_id }}"}},
        "sms": {"text": "Order {{ order_id }} shipped"},
        "inapp": {"title": "Order shipped", "body": "Order {{ order_id }} is on its way"},
        "webhook": {"body": {"event": "order.shipped", "order": "{{ order_id }}"}},
    },
    "de": {
        "email": {
            "subject": "Bestellung {{ order_id }} versandt",
            "text": "Hallo! Deine Bestellung {{ order_id }} ist unterwegs.",
            "html": "<p>Hallo! Deine Bestellung <b>{{ order_id }}</b> ist unterwegs.</p>",
        }
    },
}


class Command(BaseCommand):
    """Create what a newcomer needs to send a first notification, and print the demo API keys."""

    help = (
        "Create the project 'demo' with a live and a test API key, and in both environments the template "
        "'order_shipped' and the recipient 'u-42', if missing."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if not Project.objects.filter(slug=DEMO_PROJECT).exists():
            project_create(slug=DEMO_PROJECT, name="Demo")
        for name, mode, file_name in (("demo", "live", "demo-api-key"), ("demo-test", "test", "demo-test-api-key")):
            client, raw_key = self._key(name=name, mode=mode, file_name=file_name)
            with owner_scope(client.environment_id):
                if not Template.objects.filter(key="order_shipped").exists():
                    template_put(
                        key="order_shipped", category="transactional", default_locale="en", content=DEMO_CONTENT
                    )
                recipient_upsert(user_id="u-42", email="u42@example.com", phone="+15005550006", locale="en")
            self.stdout.write(f"Demo API key, {mode} (also in var/{file_name}): {raw_key}")
        if settings.DEBUG or settings.INBOX_DEMO_ENABLED:
            page = f"{settings.INBOX_PUBLIC_URL}/inbox/demo/?project={DEMO_PROJECT}"
            self.stdout.write(f"Live inbox of u-42 in a browser: {page}")

    def _key(self, *, name: str, mode: str, file_name: str) -> tuple[ApiClient, str]:
        """Return the demo client `name` and its raw key (kept in var/), creating or re-keying it if needed."""
        key_file = Path(settings.BASE_DIR) / "var" / file_name
        # A demo client made before projects stays where it is (the default project): its key file still works.
        client = ApiClient.objects.filter(name=name).first()
        if client is None:
            client, raw_key = api_client_create(name=name, scopes=list(SCOPES), mode=mode, project=DEMO_PROJECT)
        elif key_file.exists():
            raw_key = key_file.read_text().strip()
        else:
            raw_key = api_client_rotate_key(client=client)
        # The demo key may do everything (it is for trying the whole API), also when made before scopes existed.
        if set(client.scopes) != set(SCOPES):
            client.scopes = list(SCOPES)
            client.save(update_fields=["scopes"])
        key_file.parent.mkdir(exist_ok=True)
        key_file.write_text(raw_key + "\n")
        key_file.chmod(0o600)
        return client, raw_key
