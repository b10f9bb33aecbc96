"""This node's links to the other nodes, made on first use, and the remote queues that use them.

`ClusterLinks` is the one object forwarding needs from the cluster: which nodes are live, and
their AMQP addresses (`live_addresses`, from membership), and the cluster secret the links log
in with. Shared definitions (the node that learns of a queue owned elsewhere) make the stand-in
with `remote_queue` and put it in the vhost with `VirtualHost.adopt_remote_queue`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cluster.links.link import RETRY_AFTER_S, LinkState, NodeLink
from cluster.links.remote_queue import RemoteQueue
from queues.message import Message
from queues.timers import Timers

# node name -> "host:port" of its AMQP listener, for every live node but this one
LiveAddresses = Callable[[], dict[str, str]]
# (vhost, queue) -> whether its owner holds it now; None when the query does not know the queue
OwnerHoldsQueue = Callable[[str, str], "bool | None"]


class ClusterLinks:
    """The links of this node, one per (node, vhost), and who is live."""

    def __init__(self, secret: str, live_addresses: LiveAddresses) -> None:
        self._secret = secret
        self._live_addresses = live_addresses
        self._links: dict[tuple[str, str], NodeLink] = {}
        self._owner_holds: OwnerHoldsQueue | None = None

    def is_live(self, node: str) -> bool:
        return node in self._live_addresses()

    def ask_owners(self, owner_holds: OwnerHoldsQueue) -> None:
        """Judge a queue's availability by `owner_holds` (shared definitions know whether its
        owner took it), not only by whether the owner node is live."""
        self._owner_holds = owner_holds

    def queue_available(self, vhost: str, queue: str, owner: str) -> bool:
        """Can the owner node serve this queue now?"""
        if self._owner_holds is not None:
            holds = self._owner_holds(vhost, queue)
            if holds is not None:
                return holds
        return self.is_live(owner)

    def link(self, node: str, vhost: str) -> NodeLink | None:
        """The link to `node` for `vhost`, connecting if there is none; None while the node is
        not live, or while a failed link to it waits out RETRY_AFTER_S."""
        link = self._links.get((node, vhost))
        if link is not None:
            if link.state is not LinkState.FAILED:
                return link
            if time.monotonic() - link.failed_at < RETRY_AFTER_S:
                return None
        address = self._live_addresses().get(node)
        if address is None:
            return None
        host, _, port = address.rpartition(":")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"  # a node listening on every address is reachable on loopback here
        link = NodeLink(node, vhost, host, int(port), self._secret, self._link_failed)
        self._links[(node, vhost)] = link
        return link

    def forward_reply(self, node: str, vhost: str, message: Message) -> bool:
        """Send a direct reply-to reply to the requester's node (ReplyRegistry.forward_elsewhere);
        False when that node cannot be reached (the reply is unroutable)."""
        link = self.link(node, vhost)
        if link is None:
            return False
        link.stream.forward(message.routing_key, message)
        return True

    def _link_failed(self, link: NodeLink) -> None:
        """Kept (failed) in the table so the next attempt waits RETRY_AFTER_S."""

    def node_left(self, node: str) -> None:
        """`node` left the membership: close its links (what waited on them is nacked)."""
        for (name, _vhost), link in list(self._links.items()):
            if name == node:
                link.close()

    def links(self) -> list[NodeLink]:
        return list(self._links.values())

    def remote_queue(self, vhost: str, name: str, *, owner: str, durable: bool, exclusive: bool = False,
                     auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                     timers: Timers | None = None) -> RemoteQueue:
        """The stand-in for queue `name` of `vhost` owned by node `owner`."""
        return RemoteQueue(name, vhost, owner=owner, links=self, durable=durable, exclusive=exclusive,
                           auto_delete=auto_delete, arguments=arguments,
                           # not `timers or Timers()`: Timers has a length, so an idle one is falsy,
                           # and a stand-in given a Timers nobody drives never retries its parked consumers
                           timers=timers if timers is not None else Timers())

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
