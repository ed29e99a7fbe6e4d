"""A 60 MB body to every endpoint family of the real servers (gunicorn for the API, uvicorn for the browser
inbox) is a 413 before it is read: the answer comes while the body is still being sent, with or without a
Content-Length, and the server process's memory stays flat. A charset Python cannot decode with is a 415 on every
URL of both."""

from __future__ import annotations

import functools
import json
import select
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.conftest import ServerProcess, free_port, wait_for

BODY_BYTES = 60 * 1024 * 1024
PIECE = 256 * 1024
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
FAMILIES = [
    ("/api/v1/notifications", JSON),
    ("/api/v1/notifications/batch", JSON),
    ("/callbacks/twilio", FORM),
    ("/callbacks/ses", "text/plain"),
    ("/inbox/v1/messages/read-all", JSON),
]
# Generous: a server that buffered the bodies would grow by about 60 MB per request.
RSS_GROWTH_BOUND = 40 * 1024 * 1024


def _up(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200
    except OSError:
        return False


def post_huge(port: int, path: str, content_type: str, *, chunked: bool) -> tuple[int, dict[str, Any], int]:
    """Send a 60 MB POST piece by piece until the server answers; return (status, body, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {BODY_BYTES}\r\n"
    sock.sendall(head.encode() + b"\r\n")
    piece = b"x" * PIECE
    frame = f"{PIECE:x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    sent = 0
    try:
        while sent < BODY_BYTES:
            readable, writable, _ = select.select([sock], [sock], [], 30)
            if readable:
                break  # the answer (or the close) came before the whole body: it was not waited for
            if writable:
                sock.sendall(frame)
                sent += PIECE
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = b""
    try:
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    finally:
        sock.close()
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1])
    return status, json.loads(body[: _length(answer)] or b"{}"), sent


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _rss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


@pytest.fixture(scope="module")
def servers(django_db_setup: None) -> Iterator[dict[str, tuple[int, list[int]]]]:
    """gunicorn as the Procfile runs it (one worker) and uvicorn on config.asgi: {name: (port, pids to watch)}.

    Shared by the module's tests (none changes what the servers hold): starting both took 13 s a test.
    """
    api_port, stream_port = free_port(), free_port()
    env = {"LOG_LEVEL": "WARNING", "LOG_REQUESTS": "false", "WEB_WORKERS": "1", "WEB_THREADS": "2"}
    gunicorn = ServerProcess(
        "api", ["gunicorn", "-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{api_port}", "config.wsgi"], env
    )
    uvicorn = ServerProcess(
        "stream", ["uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(stream_port)], env
    )
    try:
        for port in (api_port, stream_port):
            wait_for(functools.partial(_up, port), timeout=90)
        workers = [child.pid for child in psutil.Process(gunicorn.proc.pid).children()]
        assert workers, "gunicorn has no worker"
        yield {"gunicorn": (api_port, workers), "uvicorn": (stream_port, [uvicorn.proc.pid])}
    finally:
        gunicorn.stop()
        uvicorn.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_a_60_mb_body_is_a_413_unread_and_memory_stays_flat(
    servers: dict[str, tuple[int, list[int]]], server: str
) -> None:
    port, pids = servers[server]
    # Warm up every path once (imports, URL resolution, first connections), then take the baseline.
    for path, _ in FAMILIES:
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST"), timeout=30)
        except urllib.error.HTTPError:
            pass  # 400/401/403: what an empty body gets
    before = _rss(pids)
    for path, content_type in FAMILIES:
        for chunked in (False, True):
            status, body, sent = post_huge(port, path, content_type, chunked=chunked)
            assert status == 413, (server, path, chunked, status, body)
            assert body["error"]["code"] == "payload_too_large"
            if not chunked:
                # Refused on its Content-Length: answered long before the body was through.
                assert sent < BODY_BYTES, (server, path)
    growth = _rss(pids) - before
    # Shown with `pytest -s`: the figure docs/api.md quotes.
    print(f"{server}: RSS {before / 2**20:.1f} MB before, grew {growth / 2**20:+.1f} MB over 10 bodies of 60 MB")
    assert growth < RSS_GROWTH_BOUND, f"{server} grew by {growth / 2**20:.1f} MB"
    assert _up(port)


def _post_chunked(port: int, path: str, body: bytes, key: str) -> tuple[int, dict[str, Any]]:
    """POST a body in chunks of 7 bytes with no Content-Length; return (status, body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode())
    for start in range(0, len(body), 7):
        piece = body[start : start + 7]
        sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
    sock.sendall(b"0\r\n\r\n")
    answer = b""
    while data := sock.recv(65536):
        answer += data
    sock.close()
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    return int(head_bytes.split(b" ", 2)[1]), json.loads(rest[: _length(answer)])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_a_chunked_body_within_the_limit_is_read_whole(servers: dict[str, tuple[int, list[int]]], server: str) -> None:
    from core.scopes import SCOPES
    from notifier.clients.services import api_client_create
    from notifier.deliveries.models import Notification
    from templates_app.services import template_put

    _, key = api_client_create(name=f"chunked-{server}", scopes=list(SCOPES))
    template_put(key="hello", category="transactional", default_locale="en", content={"en": {"sms": {"text": "Hi"}}})
    body = {"recipient": {"user_id": "u-1", "phone": "+14155550100"}, "template": "hello", "channels": ["sms"]}
    status, answer = _post_chunked(servers[server][0], "/api/v1/notifications", json.dumps(body).encode(), key)
    assert status == 202, answer
    assert Notification.objects.filter(pk=answer["id"]).exists()


def _call(port: int, method: str, path: str, content_type: str) -> tuple[int, dict[str, Any]]:
    """Send one request with this Content-Type (and a small JSON body on a POST); return (status, JSON body)."""
    data = b"{}" if method == "POST" else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"{}")
        except ValueError:
            return exc.code, {"raw": raw[:200].decode("latin-1")}


# Names Python does not know, codecs that are no text encoding (Django takes them), and Python's own codecs
# whose decoders fail in ways Django does not catch.
UNDECODABLE_CHARSETS = ["rot13", "bz2_codec", "hex", "undefined", "punycode", "idna", "foo-bar-unknown"]
# Unauthenticated and authenticated URLs, with and without a body, a query string, percent escapes.
CHARSET_REQUESTS = [
    ("GET", "/healthz?probe=%20x"),
    ("GET", "/api/v1/notifications?limit=1"),
    ("POST", "/api/v1/notifications"),
    ("POST", "/inbox/v1/messages/read-all?x=a..b"),
    ("GET", "/admin/login/?next=/admin/"),
    ("POST", "/callbacks/ses"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["gunicorn", "uvicorn"])
def test_a_charset_python_cannot_decode_with_is_a_415_on_every_url(
    servers: dict[str, tuple[int, list[int]]], server: str
) -> None:
    port = servers[server][0]
    for charset in UNDECODABLE_CHARSETS:
        for method, path in CHARSET_REQUESTS:
            status, body = _call(port, method, path, f"application/json; charset={charset}")
            assert status == 415, (server, charset, method, path, status, body)
            assert set(body["error"]) == {"code", "message", "fields"}
            assert body["error"]["code"] == "unsupported_media_type"
            assert charset in body["error"]["message"]
    # A charset Python decodes with is served as before, however it is spelled.
    for charset in ("utf-8", "UTF8", "iso-8859-1"):
        assert _call(port, "GET", "/healthz?probe=%20x", f"application/json; charset={charset}")[0] == 200
    assert _up(port)
