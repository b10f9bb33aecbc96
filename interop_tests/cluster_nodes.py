"""Broker nodes of one cluster for the interop tests: each its own process, with free loopback
ports, its own data directory, management API and node name, all on one coordination service.

`three_nodes(tmp_path)` starts one etcd member (or, with backend="zookeeper", a ZooKeeper) and
nodes "a", "b" and "c" and waits until each lists all three in /api/nodes. `start_node` starts
one node on a service the test started. A node's broker `start` after `kill` keeps its data
directory and ports, as a crashed node that comes back does.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import requests
from prometheus_client.parser import text_string_to_metric_families

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, free_port, launch
from interop_tests.coordination_services import CoordinationService, start_etcd, start_zookeeper
from interop_tests.pika_helpers import connect, parameters
from interop_tests.waiting import wait_until

SESSION_TTL = 2
NODE_CONFIG = TEST_CONFIG + """
[cluster]
session_ttl = %d
""" % SESSION_TTL
NAMES = ("a", "b", "c")


@dataclass
class ClusterNode:
    name: str
    broker: BrokerProcess
    management_port: int

    @property
    def port(self) -> int:
        return self.broker.port

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        return self.broker.url(user, password, vhost)

    def api(self, path: str) -> requests.Response:
        """GET /api/<path> as guest (at most 5 s)."""
        return requests.get(self._api_url(path), auth=("guest", "guest"), timeout=5)

    def api_json(self, path: str) -> Any:
        """GET /api/<path> as guest (at most 10 s); the decoded JSON, or requests' HTTPError."""
        reply = requests.get(self._api_url(path), auth=("guest", "guest"), timeout=10)
        reply.raise_for_status()
        return reply.json()

    def api_write(self, method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(method, self._api_url(path), json=body, auth=("guest", "guest"), timeout=120)

    def _api_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.management_port}/api/{path}"

    def live_nodes(self) -> list[str]:
        return sorted(node["name"] for node in self.api("nodes").json())

    def queue_names(self, vhost: str = "/") -> set[str]:
        return {queue["name"] for queue in self.api_json("queues") if queue["vhost"] == vhost}

    def connect(self, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
        """pika_helpers.connect to this node: one connection attempt, blocked for at most 30 s."""
        return connect(self, user, password, connection_attempts=1, blocked_connection_timeout=30)


def start_node(directory: Path, url: str, name: str, config: str = NODE_CONFIG,
               extra_args: tuple[str, ...] = (), module: str = "amqp_server") -> ClusterNode:
    """Node `name` on the coordination service at `url`, its data in `directory`/`name`;
    `module` is what it runs with `python -m` (a test harness's variant of the broker)."""
    port = free_port()
    broker = launch(directory / name, config, extra_args=(
        "--management-port", str(port), "--cluster", url, "--node-name", name, *extra_args), module=module)
    return ClusterNode(name, broker, port)


def restart_node(node: ClusterNode) -> None:
    """Start the node's process again, with the same ports, data directory and name."""
    node.broker.start()


@contextlib.contextmanager
def three_nodes(tmp_path: Path, backend: str = "etcd", service: CoordinationService | None = None,
                module: str = "amqp_server", via: dict[str, str] | None = None,
                extra_args: tuple[str, ...] = (),
                node_args: dict[str, tuple[str, ...]] | None = None) -> Iterator[dict[str, ClusterNode]]:
    """The three nodes on a new one-member etcd or ZooKeeper (`backend`), or on `service` when
    given (then left running: its starter stops it). `module`: what each node runs with
    `python -m` (a test harness's variant of the broker). `via`: the host:port a node reaches the
    service at instead of the service's own (an interop_tests/tcp_cut.py forwarder, to partition it).
    `extra_args`: more command-line flags for every node (`--default-queue-type quorum`, say);
    `node_args`: more for one node, by name (its own `--metrics-port`, say)."""
    own_service = service is None
    if service is None:
        service = start_etcd(tmp_path / "etcd") if backend == "etcd" else start_zookeeper(tmp_path / "zk")
    url = service.url(f"forwarding-{uuid.uuid4().hex[:6]}")
    nodes: dict[str, ClusterNode] = {}
    try:
        for name in NAMES:
            node_url = url if name not in (via or {}) else f"{service.scheme}://{via[name]}/{url.rsplit('/', 1)[1]}"
            nodes[name] = start_node(tmp_path, node_url, name, extra_args=(*extra_args, *(node_args or {}).get(name, ())),
                                     module=module)
        for node in nodes.values():
            wait_until(lambda node=node: node.live_nodes() == list(NAMES), f"{node.name} lists every node")
        yield nodes
    finally:
        for node in nodes.values():
            node.broker.kill()
        if own_service:
            service.stop()


def _known_everywhere(nodes: dict[str, ClusterNode], path: str, what: str) -> None:
    """Wait until every node's management API lists `path` (shared definitions reached it): a
    200, and for a listing something in it."""
    def known(node: ClusterNode) -> bool:
        answer = node.api(path)
        return answer.status_code == 200 and bool(answer.json())

    for node in nodes.values():
        wait_until(lambda node=node: known(node), f"{node.name} knows {what}")


def queue_known_everywhere(nodes: dict[str, ClusterNode], name: str) -> None:
    """Wait until every node lists queue `name` (shared definitions reached it)."""
    _known_everywhere(nodes, f"queues/%2F/{name}", f"queue {name}")


def binding_known_everywhere(nodes: dict[str, ClusterNode], exchange: str, queue: str) -> None:
    """Wait until every node lists a binding of `queue` to `exchange`. Shared definitions reach a
    node one change at a time, a binding after its queue: a node that knows the queue may still
    route a publish to its exchange nowhere."""
    _known_everywhere(nodes, f"bindings/%2F/e/{exchange}/q/{queue}", f"the binding of {queue} to {exchange}")


def exchange_known_everywhere(nodes: dict[str, ClusterNode], name: str) -> None:
    """Wait until every node lists exchange `name`."""
    _known_everywhere(nodes, f"exchanges/%2F/{name}", f"exchange {name}")


def metric_samples(metrics_port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample a node's /metrics/per-object serves (the node started with its own
    `--metrics-port`), by name and labels."""
    text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics/per-object", timeout=5).text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def pika_parameters(node: ClusterNode) -> pika.URLParameters:
    """pika's parameters for `node` as guest: one connection attempt, blocked for at most 10 s."""
    return parameters(node, connection_attempts=1, blocked_connection_timeout=10)


def drain(node: ClusterNode, queue: str) -> list[bytes]:
    """Every message left in `queue`, fetched (basic.get, auto-ack) through `node`."""
    connection = pika.BlockingConnection(pika_parameters(node))
    channel = connection.channel()
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    connection.close()
    return bodies
