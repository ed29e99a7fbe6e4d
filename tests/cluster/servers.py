"""Replicated engines on loopback for the cluster fault tests: three RabbitMQ nodes, a PostgreSQL primary with a
streaming hot standby, and a Redis master with a replica under three Sentinels.

Every process is this test's own: its own ports (free ones, picked at start), directories under one temporary
directory, node names and cookie-sharing user. Nothing here touches the machine's own services on 5432, 6379
or 5672 (or RabbitMQ's distribution port 25672). RabbitMQ runs as the `rabbitmq` user, so its nodes share that
user's Erlang cookie; PostgreSQL as `postgres` (initdb refuses root); both need the tests to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import redis

from tests.cluster.netns import NetHost, NetLab
from tests.redis_server import free_port

RABBITMQ_HOME = "/var/lib/rabbitmq"  # the rabbitmq user's home: its .erlang.cookie


def _pg_bin(name: str) -> str:
    """Return the newest installed PostgreSQL binary `name` (/usr/lib/postgresql/<version>/bin)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed")
    return found[-1]


def missing_requirements() -> str | None:
    """Return why the cluster cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "the cluster tests start RabbitMQ and PostgreSQL as their own users: run them as root"
    for user in ("rabbitmq", "postgres"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no {user} user"
    for binary in ("rabbitmq-server", "rabbitmqctl", "redis-server", "runuser"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed"
    if not glob.glob("/usr/lib/postgresql/*/bin/pg_basebackup"):
        return "PostgreSQL's server binaries are not installed"
    return None


def _own(path: Path, user: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _wait(predicate: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} within {timeout:.0f}s")


def answers_ok(url: str) -> bool:
    """Return whether `url` answers 200 within a second (a server a test started is up)."""
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _run(args: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check)


# --- RabbitMQ ----------------------------------------------------------------------------------------------------


# Every node's failure detector polls every 250 ms (RabbitMQ's default: 1 s), as docs/kubernetes.md asks of a
# deployment: a node that hangs then loses its queues' leadership within about a second (decision 0104).
ADVANCED_CONFIG = "[{aten, [{poll_interval, 250}]}].\n"


class RabbitNode:
    """One RabbitMQ node: its own name, AMQP and distribution ports, config, data and log directories."""

    def __init__(self, root: Path, name: str, net: NetHost | None = None, net_ticktime: int = 15) -> None:
        self.name = name
        # In a network namespace of its own (tests/cluster/netns.py) a node is named by its address: long names,
        # no resolver, no /etc/hosts entry. On loopback, the short name localhost.
        self.net = net
        self.host = net.address if net else "127.0.0.1"
        self.node = f"{name}@{net.address}" if net else f"{name}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.dir = _own(root / name, "rabbitmq")
        (self.dir / "rabbitmq.conf").write_text(
            # Only its own address, only AMQP: no management listener, and guest may log in (a private address).
            f"listeners.tcp.local = {self.host}:{self.port}\n"
            "loopback_users = none\n"
            # The machine's broker sits at a memory watermark of its own; five helpers share this box.
            "vm_memory_high_watermark.relative = 0.2\n"
            # A node silent for net_ticktime (15 s, not the default 60) is cut off by its peers: a hung node becomes
            # a partition within the test, and the minority side pauses itself until it sees the majority again.
            f"net_ticktime = {net_ticktime}\n"
            "cluster_partition_handling = pause_minority\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        (self.dir / "advanced.config").write_text(ADVANCED_CONFIG)
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")  # not the machine's, which fixes NODENAME
        self.proc: subprocess.Popen[bytes] | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        """Return this node's AMQP URL (default vhost, guest)."""
        return f"amqp://guest:guest@{self.host}:{self.port}//"

    def env(self) -> dict[str, str]:
        """Return the environment of this node's server and of rabbitmqctl aimed at it."""
        interface = "{" + self.host.replace(".", ",") + "}"
        return {
            "HOME": RABBITMQ_HOME,
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "beam.pid"),
            # In a namespace, its epmd (one per namespace) answers peers on the node's address too.
            "ERL_EPMD_ADDRESS": "127.0.0.1" if self.net is None else f"127.0.0.1,{self.host}",
            "RABBITMQ_USE_LONGNAME": "false" if self.net is None else "true",
            # rabbitmqctl takes a distribution port of its own from a range of ten by default: a few CLI calls hung
            # elsewhere on the machine use them all up, and every further call fails ("nodistribution").
            "RABBITMQ_CTL_DIST_PORT_MIN": "35672",
            "RABBITMQ_CTL_DIST_PORT_MAX": "35772",
            # Distribution on its own address only; a small scheduler count: three nodes share two cores with all.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"-kernel inet_dist_use_interface {interface} +S 1:1",
        }

    def ctl(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run rabbitmqctl against this node, as the rabbitmq user."""
        return _run([*self._as_rabbitmq(), "rabbitmqctl", "-q", "-n", self.node, *args], timeout=timeout, check=check)

    def _as_rabbitmq(self) -> list[str]:
        """Return the argv prefix running a command as the rabbitmq user, with this node's environment and namespace."""
        inside = self.net.exec_prefix() if self.net else []
        return [*inside, "runuser", "-u", "rabbitmq", "--", "env", *(f"{k}={v}" for k, v in self.env().items())]

    def start(self) -> None:
        """Start the node (as the rabbitmq user, so it has that user's Erlang cookie); do not wait."""
        self._starts += 1
        log = (self.dir / f"server-{self._starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [*self._as_rabbitmq(), "rabbitmq-server"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_started(self, timeout: float = 90) -> None:
        """Block until the node's rabbit application runs."""

        # await_startup fails at once while the VM is not yet registered with epmd, and on a loaded machine the CLI
        # itself may outlast its 30 s: ask again until it says yes.
        def started() -> bool:
            try:
                return self.ctl("await_startup", "--timeout", "20", timeout=30, check=False).returncode == 0
            except subprocess.TimeoutExpired:
                return False

        _wait(started, f"RabbitMQ node {self.node} started", timeout=timeout)

    def log_tail(self, lines: int = 30) -> str:
        """Return the last lines the node's server printed on its latest start."""
        path = self.dir / f"server-{self._starts}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def stop_app(self) -> None:
        """Stop the rabbit application (the VM stays): clients are cut off and new connections refused."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the rabbit application again and wait until it runs."""
        self.ctl("start_app")
        self.ctl("await_startup", "--timeout", "60", timeout=90)

    def beam_pid(self) -> int:
        """Return the node's Erlang VM process id (from its pid file)."""
        return int((self.dir / "beam.pid").read_text().strip())

    def kill(self) -> None:
        """SIGKILL the node's VM: a crash, no goodbye to clients or peers."""
        os.kill(self.beam_pid(), signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP the node's VM: it keeps its sockets but answers nothing, to peers or clients (a hung node)."""
        os.kill(self.beam_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused node."""
        os.kill(self.beam_pid(), signal.SIGCONT)

    def stop(self) -> None:
        """Kill the node if it runs (teardown)."""
        with contextlib.suppress(OSError, ValueError):
            os.kill(self.beam_pid(), signal.SIGCONT)
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError, ValueError):
                os.kill(self.beam_pid(), signal.SIGKILL)
            self.proc.wait(timeout=30)


class RabbitCluster:
    """Three RabbitMQ nodes joined into one cluster (quorum queues declared on it have three members)."""

    def __init__(
        self, root: Path, prefix: str, size: int = 3, lab: NetLab | None = None, net_ticktime: int = 15
    ) -> None:
        self.nodes = [
            RabbitNode(root, f"{prefix}{i}", lab.add(f"rabbit{i}") if lab else None, net_ticktime)
            for i in range(1, size + 1)
        ]

    @property
    def urls(self) -> str:
        """Return the Celery failover list: every node's URL, `;`-separated, the first node first."""
        return self.urls_from(self.nodes[0])

    def urls_from(self, first: RabbitNode) -> str:
        """Return the failover list starting at `first`, then the nodes after it (a client placed on that node)."""
        at = self.nodes.index(first)
        return ";".join(node.url for node in [*self.nodes[at:], *self.nodes[:at]])

    def boot(self) -> None:
        """Start every node's VM without waiting for it (`start` waits and joins them)."""
        for node in self.nodes:
            node.start()

    def start(self) -> RabbitCluster:
        """Start every node (unless `boot` did), then join the others to the first; fail unless all are members."""
        if any(node.proc is None for node in self.nodes):
            self.boot()
        for node in self.nodes:
            try:
                node.wait_started()
            except TimeoutError:
                # Three VMs booting at once beside the suite's own services: a node has missed 90 s on a busy
                # 2-core box (seen in a few CI-like runs, never twice in a row). It is started again, once.
                node.stop()
                node.start()
                try:
                    node.wait_started(timeout=120)
                except TimeoutError as exc:
                    raise TimeoutError(f"{exc}, twice; its last lines:\n{node.log_tail()}") from None
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.node)
            node.ctl("start_app")
        status = first.ctl("cluster_status", "--formatter", "json").stdout
        missing = [node.node for node in self.nodes if status.count(node.node) < 2]  # a disk node, and running
        if missing:
            raise RuntimeError(f"RabbitMQ nodes not in the cluster: {missing}\n{status}")
        return self

    def by_name(self, node: str) -> RabbitNode:
        """Return the node called `node` (as RabbitMQ names it, name@host)."""
        return next(n for n in self.nodes if n.node == node)

    def queue_members(self, via: RabbitNode | None = None) -> dict[str, tuple[str, list[str]]]:
        """Return {queue: (leader, members)} of the quorum queues, as one running node sees them."""
        node = via or self.nodes[0]
        rows = node.ctl("list_queues", "name", "type", "leader", "members", "--formatter", "json").stdout
        import json

        return {r["name"]: (r["leader"], list(r["members"])) for r in json.loads(rows) if r["type"] == "quorum"}

    def transfer_leader(self, queue: str, to: RabbitNode) -> None:
        """Make `to` the leader of the quorum queue `queue` (default vhost); wait until the cluster says so."""
        to.ctl(
            "eval",
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),'
            f" rabbit_quorum_queue:transfer_leadership(Q, '{to.node}').",
        )
        _wait(lambda: self.queue_members(to)[queue][0] == to.node, f"{to.node} leading {queue}", timeout=30)

    def stop(self) -> None:
        """Stop every node (teardown)."""
        for node in self.nodes:
            node.stop()


# --- PostgreSQL ------------------------------------------------------------------------------------------------


class PgServer:
    """One PostgreSQL server on its own port and data directory, run as the postgres user."""

    def __init__(self, root: Path, name: str, net: NetHost | None = None) -> None:
        self.name = name
        # In a network namespace of its own (tests/cluster/netns.py) the server listens on its address there.
        self.net = net
        self.host = net.address if net else "127.0.0.1"
        self.port = free_port()
        self.dir = root / name
        self.log = root / f"{name}.log"
        self.extra: list[str] = []

    def as_postgres(self) -> list[str]:
        """Return the argv prefix running a command as the postgres user (in the server's namespace)."""
        return [*(self.net.exec_prefix() if self.net else []), "runuser", "-u", "postgres", "--"]

    def _as_postgres(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([*self.as_postgres(), *args], timeout=timeout)

    def init(self) -> PgServer:
        """Create the data directory (trust on loopback and on its namespace's network, replication allowed)."""
        _own(self.dir, "postgres")
        self._as_postgres(_pg_bin("initdb"), "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync")
        if self.net:
            subnet = self.host.rsplit(".", 1)[0] + ".0/24"  # the lab's: the host end, the standby, nothing else
            with (self.dir / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {subnet} trust\nhost replication all {subnet} trust\n")
        return self

    def start(self) -> PgServer:
        """Start the server on its port (loopback only, its socket in its own directory) and wait for it."""
        options = [
            f"-p {self.port}", f"-c listen_addresses={self.host}", f"-c unix_socket_directories={self.dir}",
            "-c fsync=off", "-c shared_buffers=32MB", "-c max_connections=200", "-c wal_level=replica",
            "-c max_wal_senders=5", "-c hot_standby=on", *self.extra,
        ]  # fmt: skip
        log_fd = os.open(self.log, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o666)
        os.close(log_fd)
        os.chmod(self.log, 0o666)
        # Not through _run: the server inherits pg_ctl's standard streams, so a captured pipe would never close.
        subprocess.run(
            [*self.as_postgres(), _pg_bin("pg_ctl"), "-D", str(self.dir), "-l", str(self.log), "-o",
             " ".join(options), "-w", "-t", "60", "start"],
            check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=90,
        )  # fmt: skip
        return self

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: a crash, no checkpoint, clients cut off)."""
        if (self.dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.dir), "-m", mode, "-w", "stop", timeout=60)

    def _pids(self) -> list[int]:
        """Return the postmaster's process id and its children's (every backend and background process)."""
        postmaster = int((self.dir / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # The parent pid is the second field after the command, which is in parentheses.
                if int(stat.read_text().rpartition(")")[2].split()[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    def pause(self) -> None:
        """SIGSTOP the server and every process of it: it keeps its sockets but answers nothing (a hung host)."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        with contextlib.suppress(OSError, ValueError):
            for pid in self._pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def promote(self) -> None:
        """Promote this standby to a primary and wait until it accepts writes."""
        self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.dir), "-w", "promote")
        _wait(lambda: not self.in_recovery(), f"{self.name} promoted", timeout=30)

    def in_recovery(self) -> bool:
        """Return whether the server is a standby (in recovery)."""
        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            return bool(row and row[0])

    def conninfo(self, dbname: str) -> str:
        """Return a libpq connection string to this server alone."""
        return f"host={self.host} port={self.port} user=postgres dbname={dbname} connect_timeout=3"

    def clone(self, primary: PgServer) -> None:
        """Make this (stopped) server's data directory a fresh base backup of `primary`, set up to stream from it."""
        shutil.rmtree(self.dir, ignore_errors=True)
        _own(self.dir, "postgres")
        self.dir.chmod(0o700)
        subprocess.run(
            [*self.as_postgres(), _pg_bin("pg_basebackup"), "-h", primary.host, "-p",
             str(primary.port), "-U", "postgres", "-D", str(self.dir), "-R", "-X", "stream", "--no-sync",
             "--checkpoint=fast"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        # The source's socket lock files, copied with its data directory (its sockets live there): one of a server
        # on this port would stop this one from starting.
        for lock in self.dir.glob(".s.PGSQL.*.lock"):
            lock.unlink()


class PgPair:
    """A PostgreSQL primary and a hot standby made from it with pg_basebackup, streaming, synchronous.

    Synchronous replication (synchronous_standby_names = '*'): a commit returns once the standby has the WAL, so
    promoting the standby after the primary crashed loses no accepted notification. That is what a managed
    PostgreSQL with a standby in another zone does; with asynchronous replication the last commits before a crash
    may be lost at failover, and "accepted" would no longer mean "kept".
    """

    def __init__(self, root: Path, dbname: str, lab: NetLab | None = None) -> None:
        self.dbname = dbname
        self.primary = PgServer(root, "pg-primary", lab.add("pg-primary") if lab else None)
        self.standby = PgServer(root, "pg-standby", lab.add("pg-standby") if lab else None)

    def url(self) -> str:
        """Return the service's DATABASE_URL: both hosts, the writable one chosen by libpq."""
        return (
            f"postgres://postgres@{self.primary.host}:{self.primary.port},{self.standby.host}:{self.standby.port}/"
            f"{self.dbname}"
            "?target_session_attrs=read-write"
        )

    def start(self) -> PgPair:
        """Create and start the primary and its database, then the standby from a base backup; wait for streaming."""
        self.primary.init().start()
        with psycopg.connect(self.primary.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        self.standby.clone(self.primary)
        # Once promoted, the standby is a primary with no standby of its own: it must not wait for one.
        self.standby.extra = ["-c synchronous_standby_names=''"]
        self.standby.start()
        # Synchronous only now that the standby exists (a commit before it would wait for it forever).
        with psycopg.connect(self.primary.conninfo("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        _wait(self.streaming, "the standby streaming from the primary", timeout=30)
        return self

    def streaming(self) -> bool:
        """Return whether the primary has a synchronous standby streaming from it."""
        with psycopg.connect(self.primary.conninfo("postgres"), autocommit=True) as conn:
            rows = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
        return ("streaming", "sync") in [tuple(r) for r in rows]

    def rejoin_old_primary(self) -> None:
        """After a failover, bring the old primary (fenced: stopped) back as a standby of the promoted one.

        Re-cloned with pg_basebackup rather than pg_rewind: the old primary may hold WAL the new one never had
        (commits waiting for their synchronous acknowledgement when it went silent), and a fresh copy drops it
        without the servers having been initialised for pg_rewind (wal_log_hints or data checksums); the
        database is small enough here that the copy takes seconds. The roles are swapped: `primary` is the
        promoted server, `standby` the old primary, streaming from it asynchronously (the promoted server runs
        with no synchronous standby, as it was started).
        """
        old, new = self.primary, self.standby
        old.stop("immediate")  # the fence; a no-op when it is stopped already
        old.clone(new)
        old.start()
        self.primary, self.standby = new, old
        _wait(lambda: old.host in self.streaming_from(), "the old primary streaming from the new one", timeout=30)

    def streaming_from(self) -> list[str]:
        """Return the addresses of the standbys streaming from the primary now (synchronous or not)."""
        with psycopg.connect(self.primary.conninfo("postgres"), autocommit=True) as conn:
            rows = conn.execute("SELECT client_addr FROM pg_stat_replication WHERE state = 'streaming'").fetchall()
        return [str(row[0]) for row in rows]

    def stop(self) -> None:
        """Stop both servers (teardown)."""
        self.standby.stop()
        self.primary.stop()


# --- Redis -----------------------------------------------------------------------------------------------------


class RedisNode:
    """One redis-server (data node or Sentinel) on its own port, config file in its own directory."""

    def __init__(self, root: Path, name: str, config: Callable[[int], str], net: NetHost | None = None) -> None:
        self.name = name
        # In a network namespace of its own (tests/cluster/netns.py) the server listens on its address there.
        self.net = net
        self.host = net.address if net else "127.0.0.1"
        self.port = free_port()
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.sentinel = name.startswith("sentinel")
        (self.dir / "redis.conf").write_text(config(self.port))
        self.proc: subprocess.Popen[bytes] | None = None
        self._starts = 0

    def start(self) -> RedisNode:
        """Start the server and wait until it answers PING."""
        self._starts += 1
        log = (self.dir / f"out-{self._starts}.log").open("wb")
        inside = self.net.exec_prefix() if self.net else []
        args = [*inside, "redis-server", str(self.dir / "redis.conf"), *(["--sentinel"] if self.sentinel else [])]
        self.proc = subprocess.Popen(args, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = self.client()
        _wait(lambda: _pings(client), f"redis {self.name} answering", timeout=15)
        return self

    def client(self) -> redis.Redis:
        """Return a client of this server alone (short timeouts)."""
        return redis.Redis(
            host=self.host, port=self.port, socket_connect_timeout=0.3, socket_timeout=1, decode_responses=True
        )

    def kill(self) -> None:
        """SIGKILL the server: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    stop = kill


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


class RedisSentinelSet:
    """A Redis master, one replica of it, and three Sentinels (quorum 2) watching them under one master name.

    With `lab`, the master and the replica run in network namespaces of it (each on its address, replicating over
    the bridge) and the Sentinels on the host, beside the service: they see the data nodes as its clients do, and
    reach each other on the host end's address too (the address they announce to each other, as the data nodes
    see them).
    """

    MASTER_NAME = "notifier"

    def __init__(self, root: Path, lab: NetLab | None = None) -> None:
        # Not protected mode: with no password it would refuse every client but loopback (the lab's addresses too).
        data = 'bind {host}\nprotected-mode no\nport {port}\nsave ""\nappendonly no\ndir {dir}\n'
        nets = (lab.add("redis-a"), lab.add("redis-b")) if lab else (None, None)
        hosts = [net.address if net else "127.0.0.1" for net in nets]
        self.master = RedisNode(
            root, "redis-a", lambda port: data.format(host=hosts[0], port=port, dir=root / "redis-a"), nets[0]
        )
        self.replica = RedisNode(
            root,
            "redis-b",
            lambda port: (
                data.format(host=hosts[1], port=port, dir=root / "redis-b")
                + f"replicaof {hosts[0]} {self.master.port}\n"
            ),
            nets[1],
        )
        watched = self.master.port
        sentinel_bind = f"127.0.0.1 {lab.host_address}" if lab else "127.0.0.1"
        self.sentinels = [
            RedisNode(
                root,
                f"sentinel-{i}",
                lambda port: (
                    f"bind {sentinel_bind}\nprotected-mode no\nport {port}\n"
                    f"sentinel monitor {self.MASTER_NAME} {self.master.host} {watched} 2\n"
                    # A master silent for 2 s is down; a failover that stalls is retried after 10 s.
                    f"sentinel down-after-milliseconds {self.MASTER_NAME} 2000\n"
                    f"sentinel failover-timeout {self.MASTER_NAME} 10000\n"
                    f"sentinel parallel-syncs {self.MASTER_NAME} 1\n"
                ),
            )
            for i in range(1, 4)
        ]

    @property
    def sentinel_list(self) -> str:
        """Return REDIS_SENTINELS for the service: every Sentinel's host:port."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def start(self) -> RedisSentinelSet:
        """Start master, replica and Sentinels; wait until the Sentinels know the replica."""
        self.master.start()
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        # A Sentinel learns of replicas from the master's INFO, every 10 s, and the replica must have synced first;
        # on a loaded box three rounds were once not enough (a set-up wait, not a bound any scenario asserts).
        _wait(lambda: self.known_replicas() >= 1, "the Sentinels seeing the replica", timeout=60)
        return self

    def master_port(self) -> int | None:
        """Return the port of the master the Sentinels name now (None if none answers)."""
        for sentinel in self.sentinels:
            try:
                address = sentinel.client().sentinel_get_master_addr_by_name(self.MASTER_NAME)
            except (redis.RedisError, OSError):
                continue
            if isinstance(address, tuple | list):  # redis-py types it as tuple or bool
                return int(address[1])
        return None

    def known_replicas(self) -> int:
        """Return how many healthy replicas the first answering Sentinel knows."""
        for sentinel in self.sentinels:
            try:
                replicas = sentinel.client().sentinel_slaves(self.MASTER_NAME)
            except (redis.RedisError, OSError):
                continue
            return sum(1 for r in replicas if not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"]))
        return 0

    def node_on(self, port: int) -> RedisNode:
        """Return the data node listening on `port`."""
        return self.master if self.master.port == port else self.replica

    def stop(self) -> None:
        """Stop every server (teardown)."""
        for node in [*self.sentinels, self.replica, self.master]:
            node.stop()
