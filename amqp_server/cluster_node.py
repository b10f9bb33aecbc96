"""Join the cluster that --cluster names, and leave it on shutdown.

Imported only when a cluster is configured, so a single node loads no coordination client.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING

from cluster import connect, parse_cluster_address
from amqp_server.cluster_links import ClusterLinks
from cluster.coordinator import CoordinationUnavailable, Coordinator, VersionConflict
from cluster.membership import Membership, NodeNameInUse, NodeRecord

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.config import ServerConfig

log = logging.getLogger(__name__)

# Where the cluster secret is kept when the configuration gives none.
SECRET_KEY = "link-secret"


class ClusterJoinFailed(Exception):
    """The coordination service did not answer, or a live node already has this node's name."""


class ClusterNode:
    """This broker's place in the cluster: its coordinator session and its membership."""

    def __init__(self, coordinator: Coordinator, membership: Membership, links: ClusterLinks) -> None:
        self._coordinator = coordinator
        self.membership = membership
        self.links = links

    @classmethod
    async def join(cls, config: "ServerConfig", broker: "Broker", amqp_port: int) -> "ClusterNode":
        address = parse_cluster_address(config.cluster.url)
        try:
            coordinator = await connect(address, config.cluster.session_ttl)
        except CoordinationUnavailable as error:
            raise ClusterJoinFailed(str(error)) from None
        me = NodeRecord(
            name=broker.node_name,
            amqp_address=f"{config.host}:{amqp_port}",
            management_address=f"{config.host}:{config.management_port}" if config.management_port else "",
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
        broker.joined_cluster(membership, links)
        broker.reply_registry.forward_elsewhere(me.name, links.forward_reply)
        log.info("joined cluster %s as %s; live nodes: %s", address.prefix, me.name,
                 ", ".join(node.name for node in membership.live_nodes()))
        return cls(coordinator, membership, links)

    async def leave(self) -> None:
        self.links.close()
        try:
            await self.membership.leave()
        finally:
            await self._coordinator.close()


async def _shared_secret(coordinator: Coordinator) -> str:
    """The cluster secret kept in the coordination service; the first node to ask makes it."""
    stored = await coordinator.get(SECRET_KEY)
    if stored is not None:
        return stored.value.decode()
    secret = secrets.token_urlsafe(32)
    try:
        await coordinator.compare_and_set(SECRET_KEY, secret.encode(), None)
    except VersionConflict as conflict:  # another node made it at the same moment
        return conflict.current.value.decode()
    return secret
