"""Join the cluster that --cluster names, and leave it on shutdown.

Joining is: membership (cluster/membership.py), then the shared definitions
(cluster_definitions.py), which also take back the queues whose home is this node, then the
leases that place each shovel and federation link on one node (link_leases.py). Imported only
when a cluster is configured, so a single node loads no coordination client.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from amqp_server.config.settings import advertised_host
from cluster.definitions.shared import SharedDefinitions
from cluster.link_leases import LinkLeases
from cluster.links.forwarded import ForwardingChannel
from cluster.links.node_links import ClusterLinks
from cluster.replication.replicated_queues import ReplicatedQueues
from cluster import connect, parse_cluster_address
from cluster.coordinator import CoordinationUnavailable, Coordinator, VersionConflict
from cluster.membership import Membership, NodeNameInUse, NodeRecord

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.config.settings import ServerConfig

log = logging.getLogger(__name__)

# Where the cluster secret is kept when the configuration gives none.
SECRET_KEY = "link-secret"
# Leaving writes to the coordination service (leases released, keys removed) for at most this
# long in all; what it could not remove expires with the session.
LEAVE_WITHIN_S = 3.0


class ClusterJoinFailed(Exception):
    """The coordination service did not answer, or a live node already has this node's name."""


class ClusterNode:
    """This broker's place in the cluster: its coordinator session, its membership and the
    shared definitions."""

    def __init__(self, coordinator: Coordinator, membership: Membership, links: ClusterLinks,
                 definitions: SharedDefinitions, replicated: ReplicatedQueues | None,
                 link_leases: LinkLeases) -> None:
        self._coordinator = coordinator
        self.membership = membership
        self.links = links
        self.definitions = definitions
        self.replicated = replicated
        self.link_leases = link_leases

    @classmethod
    async def join(cls, config: "ServerConfig", broker: "Broker", amqp_port: int) -> "ClusterNode":
        url = config.cluster.url
        assert url, "the runtime joins a cluster only when its url is set (--cluster)"
        address = parse_cluster_address(url)
        try:
            coordinator = await connect(address, config.cluster.session_ttl)
        except CoordinationUnavailable as error:
            raise ClusterJoinFailed(str(error)) from None
        me = NodeRecord(
            name=broker.node_name,
            amqp_address=f"{advertised_host(config.host)}:{amqp_port}",
            management_address=(f"{advertised_host(config.host)}:{config.management_port}"
                                if config.management_port else ""),
            started_at=time.time(),
        )
        membership = Membership(coordinator, me, config.cluster.session_ttl)
        try:
            # Other nodes may connect as soon as this one is listed: admit them first.
            secret = config.cluster.secret or await _shared_secret(coordinator)
            broker.access.admit_cluster_links(secret)
            await membership.join()
        except NodeNameInUse as error:
            await coordinator.close()
            raise ClusterJoinFailed(str(error)) from None
        except CoordinationUnavailable as error:
            await coordinator.close()
            raise ClusterJoinFailed(str(error)) from None
        except BaseException:
            await coordinator.close()
            raise
        links = ClusterLinks(secret, lambda: {
            node.name: node.amqp_address for node in membership.live_nodes() if node.name != me.name
        })
        # A node whose session expired (even one hung with its sockets open) is given up on:
        # what waited on its links is nacked or cancelled rather than left waiting.
        membership.on_node_left(links.node_left)
        broker.joined_cluster(membership, ForwardingChannel)
        broker.reply_registry.forward_elsewhere(me.name, links.forward_reply)
        definitions = SharedDefinitions(coordinator, broker, me.name,
                                        lambda: [node.name for node in membership.live_nodes()])
        # Another node's queue is a RemoteQueue here, reaching its owner over the links, which
        # judge whether the owner holds it by its ownership key.
        definitions.set_remote_queue_factory(lambda vhost, value: links.remote_queue(
            vhost.name, value.entry["name"], owner=value.home, durable=value.entry["durable"],
            exclusive=value.exclusive, auto_delete=value.entry["auto_delete"],
            arguments=value.entry["arguments"], timers=vhost.timers))
        links.ask_owners(lambda vhost, queue: _owner_holds(definitions, vhost, queue))
        replicated = None
        if broker.committer is not None and broker.message_dir is not None:
            # Durable quorum queues are replicated (they need this node's disk for their logs).
            replicated = ReplicatedQueues(node=me.name, coordinator=coordinator, data_dir=broker.message_dir,
                                          committer=broker.committer, secret=secret,
                                          session_ttl=config.cluster.session_ttl,
                                          live_nodes=lambda: [node.name for node in membership.live_nodes()],
                                          disk_alarm=lambda: broker.alarms.disk_alarm)
            replicated.share(definitions)
            definitions.replicate_with(replicated)
            broker.replicate_queues(replicated)
        broker.share_definitions(definitions)
        # Each shovel and federation link runs on one node, under a lease (link_leases.py).
        link_leases = LinkLeases(coordinator, me.name)
        try:
            await definitions.start()
            if replicated is not None:
                await replicated.start(advertised_host(config.host))
            await link_leases.start()
        except (CoordinationUnavailable, OSError) as error:
            await link_leases.stop()
            links.close()
            if replicated is not None:
                await replicated.close()
            await definitions.stop()
            await membership.leave()
            await coordinator.close()
            raise ClusterJoinFailed(str(error)) from None
        broker.place_links(link_leases)
        log.info("joined cluster %s as %s; live nodes: %s; %d shared definitions", address.prefix, me.name,
                 ", ".join(node.name for node in membership.live_nodes()), definitions.size)
        return cls(coordinator, membership, links, definitions, replicated, link_leases)

    async def leave(self) -> None:
        """Leave the cluster in bounded time whatever the coordination service does (gone, cut
        off, slow): its keys are removed while it answers within LEAVE_WITHIN_S in all, and
        the rest (this node's ephemeral keys) expire with its session. Never raises for an
        unreachable service: a clean stop stays clean."""
        self._coordinator.hurry(LEAVE_WITHIN_S)
        # (the links stopped already: the runtime closes them first)
        await _best_effort("giving up the shovel and federation link leases", self.link_leases.stop())
        if self.replicated is not None:
            # First: a replica that leads releases its lease, so another member takes over at once.
            await _best_effort("stopping the replicas", self.replicated.close())
        self.links.close()
        await _best_effort("stopping the shared definitions", self.definitions.stop())
        await _best_effort("removing this node from the membership", self.membership.leave())
        await _best_effort("closing the session", self._coordinator.close())


async def _best_effort(what: str, step: Awaitable[None]) -> None:
    """Await one step of leaving; a coordination service that does not answer is logged (its
    keys expire with the session), not raised."""
    try:
        await step
    except CoordinationUnavailable as error:
        log.warning("leaving the cluster: %s: the coordination service did not answer (%s); this node's "
                    "keys expire with its session", what, error)


def _owner_holds(definitions: SharedDefinitions, vhost: str, queue: str) -> bool | None:
    owner = definitions.owner_of(vhost, queue)
    return None if owner is None else owner.live


async def _shared_secret(coordinator: Coordinator) -> str:
    """The cluster secret kept in the coordination service; the first node to ask makes it."""
    stored = await coordinator.get(SECRET_KEY)
    if stored is not None:
        return stored.value.decode()
    secret = secrets.token_urlsafe(32)
    try:
        await coordinator.compare_and_set(SECRET_KEY, secret.encode(), None)
    except VersionConflict as conflict:  # another node made it at the same moment
        if conflict.current is None:  # made and deleted meanwhile, which nothing does
            raise
        return conflict.current.value.decode()
    return secret
