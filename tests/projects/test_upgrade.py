"""Upgrading an installation from before projects: everything lands in the project `default`, clients by their mode,
and the partitioned delivery log gains its owner column without a partition rewritten.

Runs the real migrations in a database of its own (the test database stays as it is): migrate to the state before
projects, write rows as that release did, migrate to the head, read what came of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings

from tests.conftest import ROOT

BEFORE_PROJECTS = [
    *("contenttypes", "auth", "admin", "sessions", "django_celery_beat", "audit"),
    *("campaigns", "deadletters", "dispatch", "staff", "statusevents"),
    "deliveries 0002", "preferences 0001", "templates_app 0001", "workflows 0001", "channels_app 0001", "clients 0001",
]  # fmt: skip


@pytest.fixture
def old_database() -> Iterator[str]:
    """Return the URL of a new database migrated to the state before projects; drop it afterwards."""
    db = settings.DATABASES["default"]
    name = f"{db['TEST']['NAME']}_upgrade"
    admin = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{name}"
    _migrate(url, *BEFORE_PROJECTS)
    yield url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# `migrate` to each target in turn ("app" or "app migration"; none given: every app to its head), as
# `manage.py migrate <target>` would, in one process: seventeen of those paid Django's start-up and the migration
# graph's loading seventeen times (the set-up took 77 s and the test 88 s of CPU; now 8 s and 21 s).
_MIGRATE_EACH = """
import sys
import django
django.setup()
from django.core.management import call_command
for target in sys.argv[1:] or [""]:
    call_command("migrate", *target.split(), interactive=False, verbosity=0)
"""


def _migrate(url: str, *targets: str) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": url.replace("postgresql://", "postgres://"),
        "DEVELOPMENT": "true",
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    done = subprocess.run(
        [sys.executable, "-c", _MIGRATE_EACH, *targets],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _client(conn: psycopg.Connection, name: str, mode: str) -> int:
    row = conn.execute(
        "INSERT INTO notifier_apiclient (name, key_prefix, key_hash, allowed_categories, webhook_url, webhook_secret,"
        " is_active, mode, created_at) VALUES (%s, 'p', %s, '{}', '', '', true, %s, now()) RETURNING id",
        [name, uuid.uuid4().hex, mode],
    ).fetchone()
    assert row is not None
    return int(row[0])


def _notification_with_delivery(conn: psycopg.Connection, client_id: int, recipient_id: int) -> None:
    notification_id = uuid.uuid4()  # not a UUIDv7: the row is where its created_at says, today's partition
    conn.execute(
        "INSERT INTO notifier_notification (id, request_hash, category, template_key, channels, payload, user_id,"
        " priority, locale, status, fanout_processed, trace_id, created_at, updated_at, client_id, recipient_id)"
        " VALUES (%s, '', 'transactional', 'welcome', '{email}', '{}', 'u-1', 'high', '', 'accepted', 0, '', now(),"
        " now(), %s, %s)",
        [notification_id, client_id, recipient_id],
    )
    conn.execute(
        "INSERT INTO notifier_delivery (notification_id, recipient_id, channel, priority, address, status, reason,"
        " provider, provider_message_id, attempts, last_error, created_at, updated_at)"
        " VALUES (%s, %s, 'email', 'high', 'u1@example.com', 'sent', '', 'sandbox', '', 1, '', now(), now())",
        [notification_id, recipient_id],
    )


@pytest.mark.slow
def test_an_installation_from_before_projects_moves_into_the_default_project(old_database: str) -> None:
    with psycopg.connect(old_database, autocommit=True) as conn:
        live = _client(conn, "billing", "live")
        staging = _client(conn, "billing-staging", "test")
        recipient = conn.execute(
            "INSERT INTO preferences_recipient (user_id, email, phone, locale, timezone, webhook_url, opted_out,"
            " channel_prefs, category_prefs, created_at, updated_at)"
            " VALUES ('u-1', 'u1@example.com', '', '', '', '', false, '{}', '{}', now(), now()) RETURNING id"
        ).fetchone()
        assert recipient is not None
        for client_id in (live, staging):
            _notification_with_delivery(conn, client_id, int(recipient[0]))
        conn.execute(
            "INSERT INTO preferences_suppression (channel, address, reason, source, created_at) VALUES"
            " ('email', 'bounced@example.com', '', 'bounce', now()),"
            " ('email', 'asked@example.com', '', 'manual', now())"
        )
        # The files of the partitioned tables' partitions: a rewrite would give each a new one.
        files_query = (
            "SELECT c.relname, c.relfilenode FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname IN ('notifier_notification', 'notifier_delivery')"
        )
        files_before: dict[str, int] = dict(conn.execute(files_query).fetchall())
    assert len(files_before) >= 2

    _migrate(old_database)

    with psycopg.connect(old_database, autocommit=True) as conn:
        assert conn.execute("SELECT id, slug FROM projects_project").fetchall() == [(1, "default")]
        assert sorted(conn.execute("SELECT id, name FROM projects_environment").fetchall()) == [
            (1, "live"),
            (2, "test"),
        ]
        clients: dict[str, int] = dict(conn.execute("SELECT name, environment_id FROM notifier_apiclient").fetchall())
        assert clients == {"billing": 1, "billing-staging": 2}
        by_client: dict[int, int] = dict(
            conn.execute("SELECT client_id, environment_id FROM notifier_notification").fetchall()
        )
        assert by_client == {live: 1, staging: 2}
        deliveries = conn.execute(
            "SELECT n.client_id, d.environment_id FROM notifier_delivery d JOIN notifier_notification n"
            " ON n.id = d.notification_id"
        ).fetchall()
        assert sorted(deliveries) == sorted([(live, 1), (staging, 2)])
        assert conn.execute("SELECT environment_id FROM preferences_recipient").fetchall() == [(1,)]
        suppressions: dict[str, int | None] = dict(
            conn.execute("SELECT address, environment_id FROM preferences_suppression").fetchall()
        )
        assert suppressions == {"bounced@example.com": None, "asked@example.com": 1}
        assert dict(conn.execute(files_query).fetchall()) == files_before
        # A project made afterwards takes the next ids, after the default's fixed ones.
        row = conn.execute(
            "INSERT INTO projects_project (slug, name, promotion, email_from, email_reply_to, sms_sender,"
            " default_layout, rate_limit, provider_accounts, weight, created_at)"
            " VALUES ('shop', 'Shop', 'direct', '', '', '', '', '', '{}', 1, now()) RETURNING id"
        ).fetchone()
        assert row is not None and row[0] == 2
