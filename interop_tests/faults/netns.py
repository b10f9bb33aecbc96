"""Network namespaces made by a fault test, and the partitions it makes between them.

`Network` makes one hub namespace holding a bridge, one namespace per host (a broker node, an
etcd member), each joined to the bridge by a veth pair, and one veth pair from the test's own
namespace to the bridge, so the test's clients reach every host. Every address is in one
private /24 chosen at random among those no route of the test's namespace covers; traffic goes
only to loopback and to these addresses.

Faults are blackhole routes in the sending host's namespace (`block(src, dst)`: what `src` sends
to `dst` is dropped). A connection that was open stays open and silent, as over a real
partition; a new connection from the blocked side fails at once (the kernel refuses to send to a
blackhole route), one towards it waits for its SYN-ACK that never comes. `partition` cuts both
ways between two sides, `block` alone is a one-way cut. `heal` removes every route it added.

`close` deletes every namespace (their veths go with them) and the test's veth: call it in a
`finally` (or use the network as a context manager), so a failing test leaves nothing behind.
"""

from __future__ import annotations

import ipaddress
import json
import random
import secrets
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip ARGS`; its output. NetworkError (with ip's message) when it fails and `check`."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    """One namespace of the network: its name for the test, its namespace and its address."""

    name: str
    namespace: str
    address: str

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a program inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace]


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that no route of this namespace covers or overlaps."""
    routes = json.loads(ip("-j", "route", "show") or "[]")
    taken = []
    for route in routes:
        destination = route.get("dst", "")
        if destination and destination != "default":
            try:
                taken.append(ipaddress.ip_network(destination, strict=False))
            except ValueError:
                pass
    for _attempt in range(100):
        subnet = ipaddress.ip_network(f"10.{random.randint(64, 250)}.{random.randint(0, 255)}.0/24")
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise NetworkError("no free private /24 found")


class Network:
    """See the module docstring."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)
        self.prefix = f"amqf{self.token}"  # every namespace's name starts with it
        self.subnet = _free_subnet()
        self._addresses = self.subnet.hosts()
        self._namespaces: list[str] = []
        self._root_veth = self.prefix  # at most 15 characters: "amqf" and 6 hex digits
        self.hosts: dict[str, Host] = {}
        self._blocked: set[tuple[str, str]] = set()  # (src host, dst host) with a blackhole route
        self.client_address = ""
        try:
            self._hub = self._namespace("hub")
            ip("-n", self._hub, "link", "add", "br0", "type", "bridge")
            ip("-n", self._hub, "link", "set", "br0", "up")
            # The test's own namespace joins the bridge: its clients reach every host.
            ip("link", "add", self._root_veth, "type", "veth", "peer", "name", "up0", "netns", self._hub)
            self._plug("up0")
            self.client_address = str(next(self._addresses))
            ip("addr", "add", f"{self.client_address}/{self.subnet.prefixlen}", "dev", self._root_veth)
            ip("link", "set", self._root_veth, "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _namespace(self, name: str) -> str:
        namespace = f"{self.prefix}-{name}"
        ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        return namespace

    def _plug(self, port: str) -> None:
        ip("-n", self._hub, "link", "set", port, "master", "br0")
        ip("-n", self._hub, "link", "set", port, "up")

    def add_host(self, name: str) -> Host:
        """A new namespace `name` on the bridge, with the next address of the subnet."""
        namespace = self._namespace(name)
        port = f"p{len(self.hosts)}"
        ip("link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", port, "netns", self._hub)
        self._plug(port)
        address = str(next(self._addresses))
        ip("-n", namespace, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")
        host = Host(name, namespace, address)
        self.hosts[name] = host
        return host

    # -- faults ---------------------------------------------------------------------------

    def block(self, src: str, dst: str) -> None:
        """Drop what host `src` sends to host `dst` (a one-way cut)."""
        if (src, dst) in self._blocked:
            return
        ip("-n", self.hosts[src].namespace, "route", "add", "blackhole", f"{self.hosts[dst].address}/32")
        self._blocked.add((src, dst))

    def unblock(self, src: str, dst: str) -> None:
        if (src, dst) not in self._blocked:
            return
        ip("-n", self.hosts[src].namespace, "route", "del", "blackhole", f"{self.hosts[dst].address}/32",
           check=False)
        self._blocked.discard((src, dst))

    def partition(self, side: Iterable[str], other_side: Iterable[str]) -> None:
        """Cut every host of `side` from every host of `other_side`, both ways."""
        others = list(other_side)
        for a in side:
            for b in others:
                self.block(a, b)
                self.block(b, a)

    def heal(self) -> None:
        """Remove every cut."""
        for src, dst in list(self._blocked):
            self.unblock(src, dst)

    @property
    def blocked(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._blocked)

    # -- cleaning up ----------------------------------------------------------------------

    def close(self) -> None:
        """Delete every namespace this network made and the test's veth (idempotent)."""
        ip("link", "del", self._root_veth, check=False)
        for namespace in reversed(self._namespaces):
            ip("netns", "del", namespace, check=False)
        self._namespaces.clear()
        self.hosts.clear()
        self._blocked.clear()


def leftover_namespaces(prefix: str) -> list[str]:
    """Namespaces whose name starts with `prefix` (a test checks its network left none)."""
    listing = ip("netns", "list", check=False)
    return [line.split()[0] for line in listing.splitlines() if line.startswith(prefix)]
