"""Cluster coordination on an existing service (etcd or ZooKeeper), never a home-made one.

`connect(address)` opens the backend that a ``etcd://`` or ``zookeeper://`` address names, behind
the one `Coordinator` interface (cluster/coordinator.py). Nothing here imports amqp_server; the
broker passes in what it needs. The single-node broker never imports this package.
"""

from amqp_server.config.cluster_address import ClusterAddress, parse_cluster_address
from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, KeyValue, VersionConflict, WatchEvent,
)

__all__ = [
    "ClusterAddress", "parse_cluster_address", "Coordinator", "CoordinationUnavailable", "EventKind",
    "HistoryLost", "KeyValue", "VersionConflict", "WatchEvent", "connect",
]


async def connect(address: ClusterAddress, session_ttl: float = 5.0) -> Coordinator:
    """Open the coordinator for `address`; its ephemeral keys vanish `session_ttl` seconds after
    this process stops renewing them (a kill -9 included). The backend's client is imported here,
    only when a cluster is asked for."""
    if address.backend is address.backend.ETCD:
        from cluster.etcd import EtcdCoordinator

        return await EtcdCoordinator.open(address, session_ttl)
    from cluster.zookeeper import ZooKeeperCoordinator

    return await ZooKeeperCoordinator.open(address, session_ttl)
