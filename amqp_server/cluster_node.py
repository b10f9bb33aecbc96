"""Join the cluster that --cluster names, and leave it on shutdown.

Imported only when a cluster is configured, so a single node loads no coordination client.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from cluster import connect, parse_cluster_address
from cluster.coordinator import CoordinationUnavailable, Coordinator
from cluster.membership import Membership, NodeNameInUse, NodeRecord

if TYPE_CHECKING:
    from amqp_server.broker import Broker
    from amqp_server.config import ServerConfig

log = logging.getLogger(__name__)


class ClusterJoinFailed(Exception):
    """The coordination service did not answer, or a live node already has this node's name."""


class ClusterNode:
    """This broker's place in the cluster: its coordinator session and its membership."""

    def __init__(self, coordinator: Coordinator, membership: Membership) -> None:
        self._coordinator = coordinator
        self.membership = membership

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
            await membership.join()
        except NodeNameInUse as error:
            await coordinator.close()
            raise ClusterJoinFailed(str(error)) from None
        except BaseException:
            await coordinator.close()
            raise
        broker.joined_cluster(membership)
        log.info("joined cluster %s as %s; live nodes: %s", address.prefix, me.name,
                 ", ".join(node.name for node in membership.live_nodes()))
        return cls(coordinator, membership)

    async def leave(self) -> None:
        try:
            await self.membership.leave()
        finally:
            await self._coordinator.close()
