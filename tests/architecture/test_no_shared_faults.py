"""No test stops, pauses or flushes a service it did not start itself.

The test run shares PostgreSQL (5432), Redis (6379) and RabbitMQ (5672, or the node NOTIFIER_TEST_RABBITMQ_NODE
names) with every other run on the machine and with the next CI job. A test that injects a fault does it on a
server of its own, started by the fixtures that own such servers: tests/cluster/servers.py (RabbitNode, PgServer,
RedisNode: `stop_app`, `pause`, `kill`), tests/redis_server.py (RedisServer) and tests/zygote.py (the Celery
workers it forks, signalled as `Popen` signals its process). Anywhere else under tests/ the
commands that stop, pause or empty a server are refused by this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
# The fixtures that start servers of their own and may stop them: the cluster suite's servers (and its tests,
# which use only those), the private redis-server and the zygote's forked workers.
OWN_SERVERS = (TESTS / "cluster", TESTS / "redis_server.py", TESTS / "zygote.py")
# rabbitmqctl's commands that stop or cut off a node: these anywhere in a call's arguments (a wrapper too) ...
RABBITMQ_STOPPING = {
    "stop_app", "force_reset", "close_all_connections", "suspend_listeners", "set_vm_memory_high_watermark",
    "set_disk_free_limit",
}  # fmt: skip
# ... and these words only when the call is rabbitmqctl's.
RABBITMQCTL_STOPPING = RABBITMQ_STOPPING | {"stop", "shutdown", "reset", "close_connection"}
REDIS_STOPPING = ("SHUTDOWN", "DEBUG SLEEP", "CLIENT PAUSE", "FLUSHALL", "FLUSHDB", "DEBUG SEGFAULT")
REDIS_METHODS = {"client_pause", "debug_sleep", "flushall", "flushdb"}
PROGRAMS = {"pg_ctl", "pg_ctlcluster", "systemctl", "service", "pkill", "killall", "kill"}


def _strings(node: ast.AST) -> list[str]:
    """Return the string constants among a call's arguments, lists and tuples of them flattened."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple | ast.Starred):
        elements = node.elts if not isinstance(node, ast.Starred) else [node.value]
        return [s for element in elements for s in _strings(element)]
    return []


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def offences(source: str) -> list[str]:
    """Return the lines of `source` that stop, pause or empty a server, or signal a process by id."""
    found = []
    for node in ast.walk(ast.parse(source)):
        what = ""
        if isinstance(node, ast.Attribute | ast.Name) and _name(node) == "SIGSTOP":
            what = "SIGSTOP"
        elif isinstance(node, ast.Call):
            name = _name(node.func)
            args = [s for arg in node.args for s in _strings(arg)]
            words = " ".join(args).upper()
            rabbitmqctl = name in {"rabbitmqctl", "ctl"} or "rabbitmqctl" in args
            stopping = RABBITMQ_STOPPING & set(args) or (rabbitmqctl and RABBITMQCTL_STOPPING & set(args))
            # Closing the connections of one vhost touches only the run that owns it (its namespace's vhost): the
            # node, and every other run on it, go on.
            if stopping == {"close_all_connections"} and "--vhost" in args:
                stopping = set()
            if stopping:
                what = "rabbitmqctl stopping a node"
            elif args and Path(args[0].split()[0] if args[0].split() else "").name in PROGRAMS:
                what = f"{args[0]} (a server's or a process's stop)"
            elif name in REDIS_METHODS or (name == "execute_command" and words.startswith(REDIS_STOPPING)):
                what = "a Redis server stopped, paused or emptied"
            elif isinstance(node.func, ast.Attribute) and name == "kill" and _name(node.func.value) == "os":
                what = "os.kill"
        if what:
            found.append(f"{getattr(node, 'lineno', 0)}: {what}")
    return sorted(set(found))


def test_the_scanner_finds_each_kind_of_stopping_command() -> None:
    """Each way of stopping a shared service is caught, and code that only stops its own processes is not."""
    caught = [
        'rabbitmqctl("stop_app")',
        '_rabbitmq("stop_app")',
        'rabbitmqctl("stop")',
        'subprocess.run(["pg_ctl", "-D", data, "stop"])',
        'client.execute_command("DEBUG", "SLEEP", 5)',
        'client.execute_command("CLIENT PAUSE 5000")',
        'client.execute_command("SHUTDOWN", "NOSAVE")',
        "redis.Redis().flushdb()",
        "os.kill(pid, signal.SIGTERM)",
        "process.send_signal(signal.SIGSTOP)",
        'subprocess.run(["rabbitmqctl", "-n", node, "stop_app"])',
        'subprocess.run(["systemctl", "stop", "redis"])',
        'rabbitmqctl("close_all_connections", "reason")',
    ]
    for line in caught:
        assert offences(line), line
    harmless = [
        "worker.kill()",
        "os.killpg(self.proc.pid, sig)",
        "sock.shutdown(socket.SHUT_RDWR)",
        "self.server.shutdown()",
        'rabbitmqctl("add_vhost", VHOST)',
        'rabbitmqctl("close_all_connections", "--vhost", VHOST, "--limit", "10000", "a test of its own vhost")',
        'phases.append("stop")',
        "# rabbitmqctl stop_app would stop the machine's broker",
        '"""A docstring may say SIGSTOP and pg_ctl stop."""',
        'assert suppression.source == "stop"',
    ]
    for line in harmless:
        assert not offences(line), line


def test_no_test_stops_a_shared_service() -> None:
    """Outside the fixtures that start their own servers, no test source stops, pauses or flushes a server."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        if any(path == own or own in path.parents for own in OWN_SERVERS):
            continue
        lines = offences(path.read_text())
        if lines:
            found[str(path.relative_to(TESTS))] = lines
    assert found == {}, (
        "inject faults only on a server the test starts itself (tests/cluster/servers.py):\n"
        + "\n".join(f"{name}:{line}" for name, lines in found.items() for line in lines)
    )
