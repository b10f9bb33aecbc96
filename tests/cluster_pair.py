"""Two broker nodes in one event loop, linked as cluster nodes are, without a coordination service.

Node "a" owns the queues; node "b" holds stand-ins for them (RemoteQueue) as shared definitions
would make them, and reaches them over a real link (TCP on 127.0.0.1, the cluster secret).
Tests drive both with aio-pika in the same loop. `owner_down()` makes "a" no longer live for "b".
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqp_server.broker.broker import Broker
from cluster.links.node_links import ClusterLinks
from cluster.links.remote_queue import RemoteQueue
from amqp_server.config.settings import ServerConfig
from amqp_server.runtime.server import AMQPServer
from amqp_server.broker.vhost import VirtualHost
from cluster.links.forwarded import ForwardingChannel
from cluster.membership import NodeRecord

SECRET = "test-cluster-secret-0123456789"


class _Membership:
    """What Broker.joined_cluster reads of a membership: the live nodes."""

    def __init__(self, live: dict[str, str]) -> None:
        self.live = live

    def live_nodes(self) -> list[NodeRecord]:
        return [NodeRecord(name, address, "", 0.0) for name, address in sorted(self.live.items())]


@dataclass
class Node:
    name: str
    broker: Broker
    server: AMQPServer

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.server.port}/"

    @property
    def vhost(self) -> VirtualHost:
        return self.broker.vhosts["/"]


@dataclass
class Pair:
    a: Node
    b: Node
    live: dict[str, str] = field(default_factory=dict)  # what "b" sees as live, besides itself
    live_for_a: dict[str, str] = field(default_factory=dict)  # what "a" sees as live, besides itself
    links: dict[str, ClusterLinks] = field(default_factory=dict)  # each node's links, by node name

    def stand_in(self, name: str, *, durable: bool = True, exclusive: bool = False,
                 arguments: dict[str, Any] | None = None) -> RemoteQueue:
        """Node b's stand-in for node a's queue `name` (a declares it itself)."""
        queue = self.links["b"].remote_queue(
            "/", name, owner="a", durable=durable, exclusive=exclusive, arguments=arguments,
            timers=self.b.broker.timers)
        self.b.vhost.adopt_remote_queue(queue)
        return queue

    def owner_down(self) -> None:
        """Node a is no longer live as far as b knows (its process keeps running)."""
        self.live.pop("a", None)
        self.links["b"].node_left("a")


async def _start(name: str, data_dir: Path) -> Node:
    config = ServerConfig()
    data_dir.mkdir(parents=True, exist_ok=True)
    broker = Broker(config, message_dir=data_dir)
    broker.access.admit_cluster_links(SECRET)
    server = AMQPServer(broker, "127.0.0.1", 0)
    await server.start()
    return Node(name, broker, server)


@contextlib.asynccontextmanager
async def linked_pair(tmp_path: Path) -> AsyncIterator[Pair]:
    a = await _start("a", tmp_path / "a")
    b = await _start("b", tmp_path / "b")
    pair = Pair(a, b, {"a": f"127.0.0.1:{a.server.port}"}, {"b": f"127.0.0.1:{b.server.port}"})
    all_links = []
    for node, live in ((b, pair.live), (a, pair.live_for_a)):
        links = ClusterLinks(SECRET, lambda live=live: dict(live))
        node.broker.joined_cluster(_Membership(live), ForwardingChannel)
        pair.links[node.name] = links
        node.broker.reply_registry.forward_elsewhere(node.name, links.forward_reply)
        all_links.append(links)
    try:
        yield pair
    finally:
        for links in all_links:
            links.close()
        for node in (b, a):
            await node.server.stop()
            await node.broker.close()
