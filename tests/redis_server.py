"""A private redis-server on a free loopback port, which a test may kill and restart; and the shared one's cleanup."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def delete_namespace_keys(url: str, prefix: str) -> int:
    """Delete the keys under `prefix` in the Redis at `url`; return how many.

    Never FLUSHDB on the shared server: it holds other namespaces' keys too (benchmarks, another checkout's
    tests), and flushing a few hundred thousand of them outlasts a client's socket timeout.
    """
    client = redis.Redis.from_url(url)
    deleted = 0
    for key in client.scan_iter(f"{prefix}*", count=1000):
        deleted += int(client.delete(key))
    return deleted


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One `redis-server` subprocess without persistence, on a fixed port across restarts."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary = binary
        self.port = port or free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        """Return the redis:// URL of this server (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        self._starts += 1
        log = (self.workdir / f"redis-{self.port}-{self._starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--dir", str(self.workdir),
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited early (port {self.port})")
            try:
                if client.ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not answer PING")

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): no goodbye to clients, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server if it runs (used at teardown)."""
        self.kill()
