"""Recipients written per second: the batch endpoint beside the single PUT, and the import command, in one run.

    BENCH_NS=me .venv/bin/python bench/recipients_import.py [--batches 30] [--singles 1000] [--rows 100000] [--keep]
    BENCH_NS=me .venv/bin/python bench/recipients_import.py --http-batches 40 [--callers 4]

On a fresh bench database (bench/_common.py), through the whole API stack in process (DRF's test client with
an API key: authentication, scopes, parsing, validation, the answer): `--singles` single
`PUT /api/v1/recipients/{user_id}` calls, then `--batches` calls of `POST /api/v1/recipients/batch` of 1,000
new recipients each (email, phone, locale, time zone and a topic), then the same batches again (every item an
update). Then `manage.py import_recipients` on a CSV of `--rows` rows (1 % refused). Prints recipients per
second of each (wall clock) and the batch's ratio to the single PUT, and beside them the rate per second of this
process's own CPU time (everything but PostgreSQL's share runs in it): on a shared, loaded box the wall-clock rate
says more about the neighbours than about the code. Once loaded, the process's heap is frozen out of the garbage
collector as an API worker's is (config/wsgi.py, core/heap.py): unfrozen, the full collections a batch's
allocations trigger walked Django's and DRF's objects, a fifth of a batch's CPU that the API does not spend.

With --http-batches, the box's rate instead: the API as `make run` ships it (gunicorn, 2 processes of 16
threads, bench/_common.ApiServer) on the bench database, `--callers` concurrent HTTP clients posting
--http-batches batches of 1,000 new recipients (the bodies encoded before the clock starts), then the same
batches again as updates; it prints recipients per second of wall clock and the CPU seconds per 1,000 of every
process group on the box (API, PostgreSQL, the bench's clients).
"""

from __future__ import annotations

import http.client
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ApiServer, api_key, cleanup, group_cpu, in_parallel, log, parser, prepare, print_cpu


def _item(i: int) -> dict[str, object]:
    return {
        "user_id": f"user-{i:08d}",
        "email": f"user{i}@example.com",
        "phone": f"+4915112{i % 1_000_000:06d}",
        "locale": "de-DE",
        "timezone": "Europe/Berlin",
        "topics": ["all-users"],
    }


def main() -> None:
    """Run the benchmark and print the rates."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=30, help="calls of 1,000 recipients")
    p.add_argument("--singles", type=int, default=1000, help="single PUTs")
    p.add_argument("--rows", type=int, default=100_000, help="rows of the imported CSV")
    p.add_argument("--http-batches", type=int, default=0, help="measure over HTTP instead: batches of 1,000")
    p.add_argument("--callers", type=int, default=4, help="concurrent HTTP clients (with --http-batches)")
    args = p.parse_args()
    prepare(broker=False)
    if args.http_batches:
        try:
            _over_http(args.http_batches, args.callers)
        finally:
            cleanup(args.keep, broker=False)
        return
    try:
        from django.core.management import call_command
        from rest_framework.test import APIClient

        from core.heap import freeze_loaded_heap
        from core.scopes import SCOPES
        from notifier.clients.services import api_client_create
        from preferences.models import Recipient

        client, key = api_client_create(name="bench", allowed_categories=[], scopes=list(SCOPES))
        client.rate_limit = "1000000/s"  # the API's rate limit is not what is measured
        client.save(update_fields=["rate_limit"])
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        assert api.put("/api/v1/topics/all-users", {"name": "All"}, format="json").status_code == 201
        freeze_loaded_heap()  # after a first request: every view and serializer module is loaded

        log(f"{args.singles:,} single PUTs")
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(args.singles):
            body = {k: v for k, v in _item(10_000_000 + i).items() if k not in ("user_id", "topics")}
            r = api.put(f"/api/v1/recipients/single-{i}", body, format="json")
            assert r.status_code == 201, r.content
        single = args.singles / (time.perf_counter() - started)
        single_cpu = args.singles / (time.process_time() - cpu)

        rates, cpu_rates = [], []
        for label, expected in (("created", 201), ("updated", 200)):
            log(f"{args.batches} batches of 1,000 ({label})")
            started, cpu = time.perf_counter(), time.process_time()
            for b in range(args.batches):
                items = [_item(b * 1000 + i) for i in range(1000)]
                r = api.post("/api/v1/recipients/batch", {"recipients": items}, format="json")
                assert r.status_code == 200, r.content
                assert all(x["status"] == expected for x in r.json()["results"]), r.json()["results"][:3]
            rates.append(args.batches * 1000 / (time.perf_counter() - started))
            cpu_rates.append(args.batches * 1000 / (time.process_time() - cpu))

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "recipients.csv"
            with path.open("w") as f:
                f.write("user_id,email,phone,locale,timezone\n")
                for i in range(args.rows):
                    email = "broken" if i % 100 == 99 else f"import{i}@example.com"
                    f.write(f"import-{i},{email},+4915113{i % 1_000_000:06d},en,Europe/London\n")
            log(f"import_recipients of {args.rows:,} rows")
            started, cpu = time.perf_counter(), time.process_time()
            call_command("import_recipients", str(path), stdout=io.StringIO(), stderr=io.StringIO())
            imported = args.rows / (time.perf_counter() - started)
            imported_cpu = args.rows / (time.process_time() - cpu)
        total = Recipient.objects.count()
        expected_total = args.singles + args.batches * 1000 + args.rows - args.rows // 100
        assert total == expected_total, (total, expected_total)

        print()
        print(f"{'':<36} {'per second':>12} {'per CPU second':>16}  vs the single PUT")
        lines = [
            ("single PUT", single, single_cpu),
            ("batch of 1,000, new recipients", rates[0], cpu_rates[0]),
            ("batch of 1,000, updates", rates[1], cpu_rates[1]),
            ("import_recipients (CSV, 1 % bad)", imported, imported_cpu),
        ]
        for label, rate, cpu_rate in lines:
            print(f"{label:<36} {rate:>12,.0f} {cpu_rate:>16,.0f}  {rate / single:.0f}x")
    finally:
        cleanup(args.keep, broker=False)


def _post_all(port: int, headers: dict[str, str], bodies: list[str], callers: int, expected: int) -> float:
    """Post every body from `callers` concurrent clients; return the seconds taken. Every item must be `expected`."""
    import json

    def post(conn: http.client.HTTPConnection, b: int) -> str:
        conn.request("POST", "/api/v1/recipients/batch", bodies[b], headers)
        response = conn.getresponse()
        answer = response.read()
        ok = response.status == 200 and {x["status"] for x in json.loads(answer)["results"]} == {expected}
        return "" if ok else f"{response.status} {answer[:200]!r}"

    started = time.perf_counter()
    failures = [f for f in in_parallel("127.0.0.1", port, callers, len(bodies), post) if f]
    elapsed = time.perf_counter() - started
    assert not failures, failures[:3]
    return elapsed


def _over_http(batches: int, callers: int) -> None:
    """Post `batches` batches of 1,000 new recipients, then again as updates, from `callers` HTTP clients."""
    import http.client
    import json

    key = api_key()
    api = ApiServer().wait_ready()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=120)
        conn.request("PUT", "/api/v1/topics/all-users", json.dumps({"name": "All"}), headers)
        assert conn.getresponse().status == 201
        bodies = [json.dumps({"recipients": [_item(b * 1000 + i) for i in range(1000)]}) for b in range(batches)]
        print(f"\n{callers} HTTP callers, {batches} batches of 1,000, gunicorn as `make run` ships it")
        for label, expected in (("new recipients", 201), ("updates", 200)):
            before = group_cpu()
            elapsed = _post_all(api.port, headers, bodies, callers, expected)
            after = group_cpu()
            print(f"batch of 1,000 over HTTP, {label}: {batches * 1000 / elapsed:,.0f} per second")
            print_cpu(before, after, batches, per="1,000")
    finally:
        api.stop()


if __name__ == "__main__":
    main()
