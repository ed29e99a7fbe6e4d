"""Network namespaces for the cluster tests: one per server, joined by a bridge, cut and slowed with tc.

`NetLab` makes, for one test, a private network that exists only inside namespaces the test created:

- a hub namespace holding a Linux bridge;
- one namespace per server (`add`), its interface `eth0` on the bridge through a veth pair, with the address
  10.213.<octet>.<n>/24;
- one veth pair from the machine's own namespace to the bridge, its host end addressed .254: the only
  interface (and the only route, the /24 the kernel adds for that address) the lab puts in the machine's
  namespace, so that the service, running on the host, reaches every server.

Every name starts with the test namespace (`NOTIFIER_TEST_NS`), the octet is derived from it (and skipped
while the machine already routes it), and `close` removes everything: the processes left in the namespaces
(epmd, which an Erlang node starts as a daemon), the host's veth end (its peer and route go with it) and the
namespaces. Nothing here touches another interface, route or address of the machine.

A cut is made with tc in the namespaces of the servers on both sides: their packets to the other side are
classified (u32 on the destination address) into an HTB class whose queue holds no packet (pfifo limit 0),
so they are dropped, in both directions; the host end is not filtered, so clients on the host still reach
both sides (as clients in two zones would). The kernel of this machine has no netem (nor prio, nor tc's drop
action); a slow link is an HTB rate limit on a server's egress (`cut`'s `rate`), so its packets queue. A server
made silent (`silence`: a dead host, to everyone, the host end too) has every packet dropped the same way, on its
own interface's egress and on the egress of its bridge port (what would be delivered to it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

SUBNET = "10.213"
HOST_SUFFIX = 254  # the host end's address in the lab's /24


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@dataclass(frozen=True)
class NetHost:
    """One server's namespace in the lab: its name and its address on the bridge."""

    netns: str
    address: str

    def exec_prefix(self) -> list[str]:
        """Return the argv prefix that runs a command inside this namespace."""
        return ["ip", "netns", "exec", self.netns]

    def tc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run tc on this namespace's interface (`eth0`)."""
        return subprocess.run(
            [*self.exec_prefix(), "tc", *args], capture_output=True, text=True, timeout=30, check=check
        )


class NetLab:
    """Namespaces joined by a bridge in a hub namespace, reachable from the host through one veth pair."""

    def __init__(self, prefix: str) -> None:
        # Namespaces and host-side interface names must be unique on the machine (several test runs at once).
        self.prefix = f"nl-{prefix}"
        self.octet = self._free_octet(16 + zlib.crc32(prefix.encode()) % 200)
        self.hub = f"{self.prefix}-hub"
        self.host_if = f"nl{zlib.crc32(prefix.encode()):08x}"[:15]  # IFNAMSIZ: 15 characters at most
        self.hosts: list[NetHost] = []
        self._created: list[str] = []

    @property
    def host_address(self) -> str:
        """Return the host end's address: where the servers see the service's connections come from."""
        return f"{SUBNET}.{self.octet}.{HOST_SUFFIX}"

    @staticmethod
    def _free_octet(start: int) -> int:
        """Return the first 10.213.<octet>.0/24 from `start` on that the machine neither routes nor addresses."""
        routes = _ip("-o", "route", "show", "table", "all").stdout + _ip("-o", "addr").stdout
        for octet in [*range(start, 250), *range(16, start)]:
            if f"{SUBNET}.{octet}." not in routes:
                return octet
        raise RuntimeError(f"every {SUBNET}.x.0/24 is in use on this machine")

    def start(self) -> NetLab:
        """Create the hub, its bridge and the host's veth end; fail (cleaning up) if any step fails."""
        # What a run of the same test namespace killed before its finalizer left behind (only names of ours).
        self._created = [n.split()[0] for n in _ip("netns", "list").stdout.splitlines() if n.startswith(self.prefix)]
        self.close()
        try:
            self._netns_add(self.hub)
            _ip("-n", self.hub, "link", "add", "name", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            _ip("link", "add", "name", self.host_if, "type", "veth", "peer", "name", "host", "netns", self.hub)
            _ip("-n", self.hub, "link", "set", "host", "master", "br0", "up")
            _ip("addr", "add", f"{self.host_address}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
        except BaseException:
            self.close()
            raise
        return self

    def _netns_add(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)

    def add(self, name: str) -> NetHost:
        """Create a namespace for one server, on the bridge, with the next address; return it."""
        host = NetHost(f"{self.prefix}-{name}", f"{SUBNET}.{self.octet}.{len(self.hosts) + 1}")
        self._netns_add(host.netns)
        port = f"p{len(self.hosts) + 1}"
        _ip("-n", host.netns, "link", "add", "name", "eth0", "type", "veth", "peer", "name", port, "netns", self.hub)
        _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        self.hosts.append(host)
        return host

    def _shape(self, host: NetHost, rate: str, dropped: Sequence[NetHost]) -> None:
        """Replace `host`'s egress queueing: everything at `rate`, packets to `dropped` into a queue of none."""
        host.tc("qdisc", "del", "dev", "eth0", "root", check=False)
        host.tc("qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1")
        # Unlimited enough for loopback-like traffic; the burst keeps a slow rate from also starving ARP.
        host.tc("class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate", rate, "burst", "15k")
        host.tc("class", "add", "dev", "eth0", "parent", "1:", "classid", "1:2", "htb", "rate", "8bit")
        host.tc("qdisc", "add", "dev", "eth0", "parent", "1:2", "handle", "20:", "pfifo", "limit", "0")
        for other in dropped:
            host.tc("filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                    "match", "ip", "dst", f"{other.address}/32", "classid", "1:2")  # fmt: skip

    def cut(self, side: Sequence[NetHost], rate: str = "10gbit", among: Sequence[NetHost] | None = None) -> None:
        """Partition: drop every packet between `side` and the other servers (both ways); the host reaches all.

        The other servers are those of `among` (default: the whole lab); what still flows leaves each server of
        `side` and `among` at `rate` at most (a cut in a congested network when set low).
        """
        others = [h for h in (among or self.hosts) if h not in side]
        for host in side:
            self._shape(host, rate, others)
        for host in others:
            self._shape(host, rate, side)

    def _drop_all(self, netns: str, dev: str) -> None:
        """Replace `dev`'s egress queueing in `netns` by one that drops every packet (ARP too)."""
        tc = ["ip", "netns", "exec", netns, "tc"]
        subprocess.run([*tc, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=30, check=False)
        for args in (
            # Every packet is unclassified, so HTB's default class takes it: one whose queue holds none.
            ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "2"],
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:2", "htb", "rate", "8bit"],
            ["qdisc", "add", "dev", dev, "parent", "1:2", "handle", "20:", "pfifo", "limit", "0"],
        ):
            subprocess.run([*tc, *args], capture_output=True, text=True, timeout=30, check=True)

    def _bridge_port(self, host: NetHost) -> str:
        """Return the name, in the hub, of the bridge port `host`'s eth0 is the peer of."""
        return f"p{host.address.rsplit('.', 1)[1]}"

    def silence(self, host: NetHost) -> None:
        """Make `host` silent by the network: drop every packet it sends and every packet sent to it.

        Its egress (its eth0) and its ingress (the bridge port that delivers into its eth0, in the hub) both drop
        everything, whoever the peer (the host end, the other servers). Its processes keep running and keep their
        sockets; nobody hears from them and they hear from nobody: a dead host, not a closed socket (no RST, no
        ICMP). `heal` undoes it.
        """
        self._drop_all(host.netns, "eth0")
        self._drop_all(self.hub, self._bridge_port(host))

    def heal(self) -> None:
        """Remove every cut, limit and silence: back to the bridge as it was."""
        for host in self.hosts:
            host.tc("qdisc", "del", "dev", "eth0", "root", check=False)
            subprocess.run(
                ["ip", "netns", "exec", self.hub, "tc", "qdisc", "del", "dev", self._bridge_port(host), "root"],
                capture_output=True, timeout=30, check=False,
            )  # fmt: skip

    def dropped_packets(self, host: NetHost, inbound: bool = False) -> int:
        """Return how many packets `host`'s cut queue dropped so far (0 when it has none): proof a cut cut.

        `inbound`: those sent to it that `silence` dropped (its bridge port's queue) instead of those it sent.
        """
        if inbound:
            shown = subprocess.run(
                ["ip", "netns", "exec", self.hub, "tc", "-s", "qdisc", "show", "dev", self._bridge_port(host)],
                capture_output=True, text=True, timeout=30, check=False,
            ).stdout  # fmt: skip
        else:
            shown = host.tc("-s", "qdisc", "show", "dev", "eth0", check=False).stdout
        for block in shown.split("qdisc ")[1:]:
            if block.startswith("pfifo 20:"):
                return int(block.split("dropped ")[1].split(",")[0])
        return 0

    def overlimits(self, host: NetHost) -> int:
        """Return how many times `host`'s rate limit held a packet back so far (0 when it has none)."""
        shown = host.tc("-s", "class", "show", "dev", "eth0", check=False).stdout
        for block in shown.split("class htb ")[1:]:
            if block.startswith("1:1 "):
                return int(block.split("overlimits ")[1].split()[0])
        return 0

    def close(self) -> None:
        """Remove all the lab made (also after a failure): the processes in its namespaces, the veth, the namespaces."""
        for name in self._created:
            pids = _ip("netns", "pids", name, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            _ip("netns", "pids", name, check=False).stdout.strip() for name in self._created
        ):
            time.sleep(0.1)
        _ip("link", "del", self.host_if, check=False)  # its peer on the bridge goes with it, and the /24 route
        for name in reversed(self._created):
            _ip("netns", "del", name, check=False)
        self._created.clear()
        self.hosts.clear()
