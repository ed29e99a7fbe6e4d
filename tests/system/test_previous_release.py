"""The previous release's send workers run beside the new API, on the new schema, during a deploy.

A deploy migrates first and replaces the processes one by one (docs/operations.md, "Deploys: expand, then
contract"): for a while the new API publishes to workers of the previous release, which read and write the
schema the new migrations left. Until releases are tagged, the previous release is the commit just before the
newest migration (what a deploy of that migration replaces); once a `v*` tag exists, the newest tag. Its tree
is taken from git (`git archive`) and its workers run from it with this checkout's dependencies.
"""

from __future__ import annotations

import functools
import subprocess
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path

import httpx
import pytest
from django.db.models import Count

from channels_app.models import SandboxMessage
from notifier.clients.models import ApiClient
from notifier.clients.services import api_client_create
from notifier.deliveries.models import Delivery
from preferences.models import Recipient
from templates_app.services import template_put
from tests.conftest import ROOT, ServerProcess, free_port, wait_for

EMAIL_QUEUES = ["email.high", "email.low"]
MIGRATIONS = ["*/migrations/0*.py", "notifier/*/migrations/0*.py"]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def previous_release() -> str:
    """Return the commit of the previous release: the newest `v*` tag, or the commit before the newest migration."""
    tags = _git("tag", "--list", "v*", "--sort=-creatordate").split()
    if tags:
        return _git("rev-parse", f"{tags[0]}^{{commit}}")
    newest_migration = _git("log", "-1", "--diff-filter=A", "--format=%H", "--", *MIGRATIONS)
    return _git("rev-parse", f"{newest_migration}^")


@pytest.fixture(scope="module")
def previous_tree() -> Iterator[tuple[str, Path]]:
    """The previous release's files in a temporary directory, removed afterwards."""
    try:
        commit = previous_release()
    except subprocess.CalledProcessError as error:
        if _git("rev-parse", "--is-shallow-repository") == "true":
            pytest.skip(f"a shallow clone holds no history to take the previous release from: {error.stderr}")
        raise
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="notifier-previous-") as root:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        yield commit, Path(root)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_previous_release_workers_send_what_the_new_api_accepts_once_each(
    previous_tree: tuple[str, Path],
    start_process: Callable[..., ServerProcess],
    start_worker: Callable[..., ServerProcess],
) -> None:
    """New API, the previous release's workers alone, then beside new ones: every accept sent exactly once."""
    commit, tree = previous_tree
    assert commit != _git("rev-parse", "HEAD"), "the previous release is this commit: the test would prove nothing"
    template_put(
        key="receipt", category="transactional", default_locale="en",
        content={"en": {"email": {"subject": "Receipt {{ n }}", "text": "Order {{ n }}"}}},
    )  # fmt: skip
    Recipient.objects.bulk_create([Recipient(user_id=f"r-{i}", email=f"r{i}@example.com") for i in range(10)])
    client, raw_key = api_client_create(name="deploy")
    ApiClient.objects.filter(pk=client.pk).update(rate_limit="100000/s")
    port = free_port()
    env = {"GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_WORKERS": "1", "WEB_THREADS": "4", "LOG_LEVEL": "WARNING"}
    start_process("api", ["gunicorn", "-c", "gunicorn.conf.py", "config.wsgi:application"], env)
    url = f"http://127.0.0.1:{port}"
    wait_for(functools.partial(_answers, url), timeout=60)
    old = start_worker(EMAIL_QUEUES, cwd=tree)
    assert str(tree) in Path(f"/proc/{old.proc.pid}/cwd").resolve().as_posix(), "the worker runs the old tree"

    answers: Counter[int] = Counter()
    keys: list[str] = []

    def send(first: int, count: int) -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {raw_key}"}, timeout=30) as http:
            for n in range(first, first + count):
                body = {
                    "recipient": {"user_id": f"r-{n % 10}"}, "template": "receipt", "payload": {"n": n},
                    "dedup_key": f"deploy-{n}", "priority": "high" if n % 3 == 0 else "normal",
                }  # fmt: skip
                answers[http.post(f"{url}/api/v1/notifications", json=body).status_code] += 1
                keys.append(f"deploy-{n}")

    send(0, 40)
    wait_for(lambda: Delivery.objects.filter(status="sent").count() == 40, timeout=90, interval=0.5)
    start_worker(EMAIL_QUEUES)  # the new release's worker joins: both consume the same queues
    send(40, 40)
    wait_for(lambda: Delivery.objects.filter(status="sent").count() == 80, timeout=90, interval=0.5)

    assert answers == {202: 80}, answers
    per_key = dict(
        Delivery.objects.filter(notification__dedup_key__in=keys, status="sent")
        .values_list("notification__dedup_key")
        .annotate(n=Count("id"))
    )
    assert per_key == dict.fromkeys(keys, 1), {k: n for k, n in per_key.items() if n != 1}
    assert SandboxMessage.objects.count() == 80
    assert not SandboxMessage.objects.filter(send_count__gt=1).exists(), "a delivery reached the provider twice"
    assert "succeeded" in old.log(), "the previous release's worker sent nothing"
    print(f"previous release {commit[:10]}: 80 accepted, 80 sent, 0 twice")
