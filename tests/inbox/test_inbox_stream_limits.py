"""The inbox stream's bounds under real uvicorn processes: Last-Event-ID, concurrent streams per token and recipient."""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from notifier.inbox.tokens import inbox_token_mint
from tests.conftest import wait_for
from tests.factories import make_recipient
from tests.inbox.test_inbox_browser import SseReader, StreamServer
from tests.inbox.test_inbox_browser import stream_server as stream_server  # the fixture, shared

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"INBOX_STREAM_MAX_PER_TOKEN": "2", "INBOX_STREAM_MAX_PER_RECIPIENT": "3", "INBOX_HEARTBEAT_SECONDS": "1"}


def _request(port: int, token: str, last_event_id: str | None = None) -> tuple[int, dict[str, str], Any]:
    """GET the stream once and return the status, headers and (for an error) its JSON body; closes at once."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        extra = f"Last-Event-ID: {last_event_id}\r\n" if last_event_id is not None else ""
        request = f"GET /inbox/v1/stream?token={token} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n"
        sock.sendall(request.encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if status == 200:
            return status, headers, None
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, json.loads(rest[:length] or b"null")


def _open(port: int, token: str) -> SseReader:
    reader = SseReader(port, token)
    wait_for(lambda: reader.status, 20)
    return reader


def test_malformed_or_oversized_last_event_id_is_a_400_and_the_server_keeps_serving(
    stream_server: Callable[..., StreamServer],
) -> None:
    server = stream_server(LIMITS)
    me = make_recipient(user_id="lei-me")
    token, _ = inbox_token_mint(recipient=me, ttl_seconds=600)
    for bad in ("9" * 20, "9" * 5000, "1" * 16, "abc", "-5", "12.5", "١٢٣", "99999999999999"):
        status, _, body = _request(server.port, token, bad)
        assert status == 400, bad
        assert body["error"]["code"] == "invalid_last_event_id"
        assert "Last-Event-ID" in body["error"]["fields"]
    # Nothing of the above left a lease behind, and a good cursor still resumes.
    readers = [SseReader(server.port, token, last_event_id="1700000000000") for _ in range(2)]
    for reader in readers:
        wait_for(functools.partial(reader.of, "unread"), 20)
        assert reader.status == 200
    assert server.proc.poll() is None
    assert "Traceback" not in server.process.log()
    for reader in readers:
        reader.close()


def test_stream_attempts_count_against_the_tokens_rate(stream_server: Callable[..., StreamServer]) -> None:
    server = stream_server({**LIMITS, "INBOX_TOKEN_RATE_LIMIT": "2/h"})
    me, other = make_recipient(user_id="rate-me"), make_recipient(user_id="rate-other")
    token, _ = inbox_token_mint(recipient=me, ttl_seconds=600)
    theirs, _ = inbox_token_mint(recipient=other, ttl_seconds=600)
    # Each attempt counts once its token is verified, whatever becomes of it (here a bad Last-Event-ID).
    assert [_request(server.port, token, "abc")[0] for _ in range(2)] == [400, 400]
    status, headers, body = _request(server.port, token)
    assert status == 429
    assert set(body["error"]) == {"code", "message", "fields"} and body["error"]["code"] == "rate_limited"
    assert int(headers["retry-after"]) >= 1000
    assert _request(server.port, theirs, "abc")[0] == 400  # another user's token is not limited by it
    assert "Traceback" not in server.process.log()


def test_streams_are_limited_per_token_and_per_recipient_and_freed_on_close(
    stream_server: Callable[..., StreamServer],
) -> None:
    server = stream_server(LIMITS)
    me, other = make_recipient(user_id="lim-me"), make_recipient(user_id="lim-other")
    token_a, _ = inbox_token_mint(recipient=me, ttl_seconds=600)
    token_b, _ = inbox_token_mint(recipient=me, ttl_seconds=601)
    token_c, _ = inbox_token_mint(recipient=me, ttl_seconds=602)
    theirs, _ = inbox_token_mint(recipient=other, ttl_seconds=600)

    a1, a2 = _open(server.port, token_a), _open(server.port, token_a)
    assert (a1.status, a2.status) == (200, 200)
    status, headers, body = _request(server.port, token_a)
    assert status == 429
    assert body["error"]["code"] == "too_many_streams" and "token" in body["error"]["fields"]
    assert int(headers["retry-after"]) > 0
    # Another token of the same recipient: the third stream of that recipient is allowed, the fourth is not.
    b1 = _open(server.port, token_b)
    assert b1.status == 200
    status, _, body = _request(server.port, token_c)
    assert status == 429 and "recipient" in body["error"]["fields"]
    # Someone else is not affected.
    them = _open(server.port, theirs)
    assert them.status == 200
    # Closing a stream frees its place (the server notices the disconnect and releases the lease).
    a1.close()

    def reopened() -> bool:
        status, _, _ = _request(server.port, token_a)
        return status == 200

    wait_for(reopened, 20, interval=0.5)
    for reader in (a2, b1, them):
        reader.close()


def test_the_limit_is_shared_by_stream_processes_and_a_dead_processs_streams_expire(
    stream_server: Callable[..., StreamServer],
) -> None:
    # Leases of 6 s, renewed every 2 s: a box busy enough to stall a process for a second keeps them.
    env = {**LIMITS, "INBOX_STREAM_LEASE_SECONDS": "6"}
    first, second = stream_server(env), stream_server(env)
    me = make_recipient(user_id="lim-shared")
    token, _ = inbox_token_mint(recipient=me, ttl_seconds=600)
    held = [_open(first.port, token), _open(first.port, token)]
    assert [r.status for r in held] == [200, 200]
    status, _, body = _request(second.port, token)
    assert status == 429 and body["error"]["code"] == "too_many_streams"
    # Leases are renewed while their streams stay open: still full after more than one lease time.
    wait_for(lambda: held[0].heartbeats >= 8, 30)
    assert _request(second.port, token)[0] == 429
    # The first process dies without closing anything: its leases expire, and the place is free again.
    first.process.kill()
    first.proc.wait(timeout=10)

    def freed() -> bool:
        return _request(second.port, token)[0] == 200

    wait_for(freed, 30, interval=0.5)
    for reader in held:
        reader.close()


def test_without_redis_the_limits_are_counted_per_process(stream_server: Callable[..., StreamServer]) -> None:
    """Redis unreachable: streams still open, and one process still refuses a token's streams beyond the limit."""
    server = stream_server({**LIMITS, "REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0"})
    me = make_recipient(user_id="lim-noredis")
    token, _ = inbox_token_mint(recipient=me, ttl_seconds=600)
    held = [_open(server.port, token), _open(server.port, token)]
    assert [r.status for r in held] == [200, 200]
    status, _, body = _request(server.port, token)
    assert status == 429 and "token" in body["error"]["fields"]
    held[0].close()
    wait_for(lambda: _request(server.port, token)[0] == 200, 20, interval=0.5)
    held[1].close()


def _closed_port() -> int:
    """Return a loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
