"""`manage.py import_recipients`: CSV and JSON Lines, refused rows reported, dry runs, and resuming after a kill."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from audit.models import AuditEntry
from preferences.models import Recipient, RecipientImport, Subscription
from preferences.services import recipient_upsert, topic_upsert
from projects.models import DEFAULT_LIVE_ENVIRONMENT_ID
from projects.scoping import owner_scope
from projects.selectors import environment_of
from projects.services import project_create
from tests.conftest import wait_for


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("import_recipients", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _csv(path: Path, rows: int, *, bad_every: int = 100) -> list[int]:
    """Write `rows` recipients (every `bad_every`-th with a bad email); return the bad rows' line numbers."""
    bad = []
    with path.open("w") as f:
        f.write("user_id,E-Mail,phone,locale,timezone\n")
        for i in range(rows):
            line = i + 2  # the header is line 1
            if i % bad_every == bad_every - 1:
                bad.append(line)
                f.write(f"u-{i},not-an-email,,de,Europe/Berlin\n")
            else:
                f.write(f"u-{i},u{i}@example.com,+4915112{i % 1000000:06d},de,Europe/Berlin\n")
    return bad


@pytest.mark.django_db
def test_a_small_csv_with_a_topic_mapping_and_refused_rows(tmp_path: Path) -> None:
    topic_upsert(key="news", name="News")
    recipient_upsert(user_id="u-1", email="old@example.com", locale="fr")
    path = tmp_path / "people.csv"
    path.write_text(
        "id,E-Mail,locale,topics\n"
        "u-1,one@example.com,,\n"
        "u-2,two@example.com,de,deals\n"
        'u-3,"three@example.com",en-GB,\n'
        "u-4,bad,not a locale!,\n"
        "u-5,five@example.com\n"
    )
    with pytest.raises(CommandError, match="user_id"):
        _run(str(path))
    out, _ = _run(str(path), "--map", "id=user_id", "--topic", "news")
    assert out.splitlines()[0] == "1 were created, 1 were updated, 3 refused."
    assert "line 3: topics: Unknown topic(s): deals." in out
    assert "line 5: email: Enter a valid email address." in out
    assert "line 5: locale:" in out
    assert "line 6: line: Has 2 columns where the header has 4." in out
    one = Recipient.objects.get(user_id="u-1")
    assert (one.email, one.locale) == ("one@example.com", "")  # a column sent replaces the field, as a PUT
    assert Recipient.objects.get(user_id="u-3").locale == "en-GB"
    assert set(Subscription.objects.values_list("recipient__user_id", flat=True)) == {"u-1", "u-3"}
    entry = AuditEntry.objects.get(action="recipients.import")
    assert entry.changes == {"created": 1, "updated": 1, "refused": 3, "file_format": "csv"}


@pytest.mark.django_db
def test_json_lines_into_another_project_and_a_dry_run(tmp_path: Path) -> None:
    project_create(slug="shop", name="Shop")
    path = tmp_path / "people.jsonl"
    rows = [
        {"user_id": "u-1", "email": "a@example.com", "timezone": "Europe/Berlin"},
        "[1, 2]",
        {"user_id": "u-2", "phone": "+4915112345678", "tracking_opt_out": True},
    ]
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n{broken\n")
    out, _ = _run(str(path), "--project", "shop", "--test", "--dry-run")
    assert out.splitlines()[0] == "2 would be created, 0 would be updated, 2 refused."
    assert "line 2: line: Must be a JSON object." in out and "line 4: line: Not valid JSON" in out
    assert not Recipient.objects.exists()

    out, _ = _run(str(path), "--project", "shop", "--test")
    assert out.splitlines()[0] == "2 were created, 0 were updated, 2 refused."
    test_env = environment_of(project="shop", mode="test")
    assert set(Recipient.objects.values_list("environment_id", "user_id")) == {
        (test_env.pk, "u-1"),
        (test_env.pk, "u-2"),
    }
    assert Recipient.objects.get(user_id="u-2").tracking_opt_out is True
    with pytest.raises(CommandError, match="unknown project"):
        _run(str(path), "--project", "nope")


@pytest.mark.django_db(transaction=True)
def test_a_hundred_thousand_rows_killed_midway_resume_without_duplicates(
    tmp_path: Path, start_process: Callable[..., Any]
) -> None:
    """Killed mid-way (SIGKILL), the command resumes after its last committed chunk: every good row in once."""
    path = tmp_path / "big.csv"
    bad_lines = _csv(path, 100_000)
    assert len(bad_lines) == 1000
    first = start_process("import", ["manage", "import_recipients", str(path)])

    def midway() -> RecipientImport | None:
        job = RecipientImport.objects.filter(name="big.csv").first()
        return job if job is not None and 0 < job.committed_line < 50_000 else None

    wait_for(midway, timeout=120, interval=0.05)
    first.kill()
    first.proc.wait(timeout=10)
    job = RecipientImport.objects.get(name="big.csv")
    assert job.status == RecipientImport.Status.RUNNING and job.committed_line < 100_001
    written = Recipient.objects.count()
    assert 0 < written < 99_000
    assert written == job.created  # the checkpoint and the rows were committed together

    out, err = _run(str(path))
    assert f"Resuming import {job.pk} after line {job.committed_line:,}" in err
    assert out.splitlines()[0] == "99,000 were created, 0 were updated, 1,000 refused."
    reported = [line for line in out.splitlines()[1:] if line.startswith("line ")]
    assert reported == [f"line {n}: email: Enter a valid email address." for n in bad_lines]
    assert Recipient.objects.count() == 99_000
    assert Recipient.objects.filter(environment_id=DEFAULT_LIVE_ENVIRONMENT_ID).count() == 99_000
    assert not Recipient.objects.filter(email="not-an-email").exists()
    with owner_scope(DEFAULT_LIVE_ENVIRONMENT_ID):
        assert Recipient.objects.get(user_id="u-99998").email == "u99998@example.com"
    job.refresh_from_db()
    assert (job.status, job.committed_line, job.updated) == (RecipientImport.Status.DONE, 100_001, 0)
    assert AuditEntry.objects.filter(action="recipients.import").count() == 1

    # Run again once done: a new import, every row an update (idempotent by user id), still no duplicate.
    out, _ = _run(str(path))
    assert out.splitlines()[0] == "0 were created, 99,000 were updated, 1,000 refused."
    assert Recipient.objects.count() == 99_000


@pytest.mark.django_db
def test_progress_goes_to_stderr_a_line_per_chunk_and_the_result_to_stdout(tmp_path: Path, settings: Any) -> None:
    settings.PROGRESS_INTERVAL_SECONDS = 0  # a line at every count (a pipe gets plain lines, not a bar)
    path = tmp_path / "people.csv"
    _csv(path, 2500, bad_every=10_000)
    out, err = _run(str(path))
    assert out.splitlines() == ["2,500 were created, 0 were updated, 0 refused."]
    lines = err.splitlines()
    # Lines of the file (the header is one), a line after each chunk of a thousand rows, then the closing line.
    assert lines[0] == "import people.csv: started (2,501 lines)"
    counts = [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines[1:-1]]
    assert counts == ["1,001/2,501", "2,001/2,501", "2,501/2,501"]
    assert "(40 %)" in lines[1] and "lines/s" in lines[1] and "left" in lines[1]
    assert lines[-1].startswith("import people.csv: done, 2,501 lines in ")
    assert Recipient.objects.count() == 2500
