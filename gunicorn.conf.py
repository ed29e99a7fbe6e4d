"""gunicorn settings for the API: the one place they live (Procfile, compose, Kubernetes and the image use it).

Run as `gunicorn -c gunicorn.conf.py config.wsgi`. Environment: GUNICORN_BIND (default 127.0.0.1:$PORT, PORT
default 8000; containers set 0.0.0.0:8000), WEB_WORKERS (2), WEB_THREADS (16), FORWARDED_ALLOW_IPS
(127.0.0.1: the proxies whose X-Forwarded-* headers are trusted).
"""

from __future__ import annotations

import os

from core.env import env

bind = env.str("GUNICORN_BIND") or f"127.0.0.1:{env.int('PORT', 8000)}"
workers = env.int("WEB_WORKERS", 2)
# Threads per worker: a request mostly waits, on PostgreSQL, Redis and the group writer of its process (group
# commit: the singles waiting together are written with one set of statements). More threads in flight make
# larger groups, and the send workers then receive larger bursts to combine: with 16 instead of 4, bench/floor.py
# went from 217-259 to 373-389 singles/s with p99 from 96-142 to 69-76 ms, the bare floor view unchanged
# (docs/decisions/0084-api-threads-cover-the-connections.md). Each thread holds one database connection, idle
# while it waits (docs/kubernetes.md, connection budget).
threads = env.int("WEB_THREADS", 16)
# SIGTERM: stop accepting, finish in-flight requests for up to 30 s (the container's grace period is longer).
graceful_timeout = 30
timeout = 30
# The API's statements are cancelled by PostgreSQL after 30 s (config/settings.py; workers keep no limit), so a
# request stuck behind a lock or on a hung query ends with an error within gunicorn's own timeout.
os.environ.setdefault("DATABASE_STATEMENT_TIMEOUT_SECONDS", "30")
keepalive = 5
# Recycle a worker after 100,000-110,000 requests: bounds slow leaks in any library; the jitter keeps the
# workers from restarting all at once. Metrics survive (multiprocess files; none of our gauges is per live
# process). At 1,000 a busy worker was replaced every half minute, each time a new interpreter importing Django
# (about 2 s of CPU) with cold caches: 15 % of the API's CPU at 75 requests/s (bench/singles.py).
max_requests = 100_000
max_requests_jitter = 10_000
# Only these peers may set the client address and scheme through X-Forwarded-* headers.
forwarded_allow_ips = env.str("FORWARDED_ALLOW_IPS", "127.0.0.1")
# The heartbeat file lives in memory, not on a (possibly read-only or slow) container filesystem.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None  # noqa: S108
# Access lines come from the application's own logging (notifier.access, masked, with the trace id).
accesslog = None
errorlog = "-"
# gunicorn's control socket would be created under $HOME, read-only in the image and on Kubernetes; nothing
# here uses it (signals reload and stop the server).
control_socket_disable = True
