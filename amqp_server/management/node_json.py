"""The overview, the node, vhosts, users and permissions in the management API's JSON shapes."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from amqp_server.connection.views import connections_of
from amqp_server.broker.access_control import User
from amqp_server.config.auth import HASHING_ALGORITHM
from amqp_server.config.settings import PermissionConfig
from amqp_server.broker.firehose import is_tracing
from amqp_server.management.context import OVERVIEW_KEY, ManagementContext
from amqp_server.management.http_io import vhosts_visible_to
from amqp_server.management.message_stats import broker_message_counts, queue_depth_counts, queue_message_counts
from amqp_server.management.rates import SampleWindow
from amqp_server.metrics import identity
from amqp_server.metrics.broker_view import take_snapshot, vhost_totals
from amqp_server.metrics.process_stats import uptime_seconds

if TYPE_CHECKING:
    from amqp_server.broker.stats import BrokerStats
    from amqp_server.management.caller import Caller
    from amqp_server.broker.vhost import VirtualHost
    from amqp_server.broker.cluster_interface import NodeRecord

EXCHANGE_TYPES = [
    {"name": "direct", "description": "AMQP direct exchange, as per the AMQP specification", "enabled": True},
    {"name": "fanout", "description": "AMQP fanout exchange, as per the AMQP specification", "enabled": True},
    {"name": "headers", "description": "AMQP headers exchange, as per the AMQP specification", "enabled": True},
    {"name": "topic", "description": "AMQP topic exchange, as per the AMQP specification", "enabled": True},
    # Declared here by federation links of downstream brokers (exchanges/federation_upstream.py).
    {"name": "x-federation-upstream", "description": "Federation upstream helper exchange",
     "internal_purpose": "federation", "enabled": True},
]
AUTH_MECHANISMS = [
    {"name": "PLAIN", "description": "SASL PLAIN authentication mechanism", "enabled": True},
    {"name": "AMQPLAIN", "description": "QPid AMQPLAIN mechanism", "enabled": True},
]
# RabbitMQ's defaults with rates_mode "basic".
SAMPLE_RETENTION_POLICIES = {"global": [600, 3600, 28800, 86400], "basic": [600, 3600], "detailed": [600]}


def _versions() -> dict[str, Any]:
    return {
        "management_version": identity.RABBITMQ_COMPATIBLE_VERSION,
        "product_name": identity.PRODUCT_NAME,
        "product_version": identity.PRODUCT_VERSION,
        "rabbitmq_version": identity.RABBITMQ_COMPATIBLE_VERSION,
        "erlang_version": identity.RUNTIME_VERSION,
        "erlang_full_version": identity.RUNTIME_VERSION,
    }


def _listeners(ctx: ManagementContext) -> list[dict[str, Any]]:
    node = ctx.broker.node_name
    return [
        {"node": node, "protocol": listener["protocol"], "ip_address": ctx.broker.config.host,
         "port": listener["port"], "socket_opts": {}}
        for listener in ctx.listeners
    ]


def overview_json(ctx: ManagementContext, caller: "Caller", msg_rates_window: SampleWindow | None = None,
                  lengths_window: SampleWindow | None = None) -> dict[str, Any]:
    """Broker-wide figures for monitoring users; a user with the management tag only sees the
    queues, exchanges and connections of their own vhosts and connections. The windows add
    RabbitMQ's `samples` to `message_stats` and `queue_totals` (monitoring users only, whose
    figures are the broker-wide ones the history holds)."""
    broker = ctx.broker
    rates = ctx.rates
    stats = broker.stats
    if caller.is_monitor:
        snapshot = take_snapshot(broker)
        message_stats = rates.details(OVERVIEW_KEY, broker_message_counts(stats, snapshot.queue_stats),
                                      msg_rates_window)
        queue_totals = rates.details(OVERVIEW_KEY, queue_depth_counts(snapshot.messages_ready,
                                                                       snapshot.messages_unacked), lengths_window)
        object_totals = {
            "channels": snapshot.channels,
            "connections": snapshot.connections,
            "consumers": snapshot.consumers,
            "exchanges": snapshot.exchanges,
            "queues": snapshot.queues,
        }
    else:
        vhosts = vhosts_visible_to(broker, caller)
        own = [c for c in connections_of(broker) if caller.may_see_connection(c)]
        ready = sum(vhost_totals(v)["messages_ready"] for v in vhosts)
        unacked = sum(vhost_totals(v)["messages_unacknowledged"] for v in vhosts)
        message_stats = {}
        queue_totals = queue_depth_counts(ready, unacked)
        object_totals = {
            "channels": sum(len(c.channels) for c in own),
            "connections": len(own),
            "consumers": sum(q.consumer_count for v in vhosts for q in v.queues.values()),
            "exchanges": sum(len(v.exchanges) for v in vhosts),
            "queues": sum(len(v.queues) for v in vhosts),
        }
    overview = {
        **_versions(),
        "rates_mode": "basic",
        "sample_retention_policies": SAMPLE_RETENTION_POLICIES,
        "exchange_types": EXCHANGE_TYPES,
        "cluster_name": broker.cluster_name,
        "release_series_support_status": "supported",
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": message_stats,
        "churn_rates": rates.details(OVERVIEW_KEY, _churn(stats)) if caller.is_monitor else {},
        "queue_totals": queue_totals,
        "object_totals": object_totals,
        "statistics_db_event_queue": 0,
        "node": broker.node_name,
        "listeners": _listeners(ctx),
        "contexts": [],
    }
    return overview


def _churn(stats: BrokerStats) -> dict[str, int]:
    return {
        "channel_closed": stats.channels_closed,
        "channel_created": stats.channels_opened,
        "connection_closed": stats.connections_closed,
        "connection_created": stats.connections_opened,
        "queue_created": stats.queues_created,
        "queue_declared": stats.queues_declared,
        "queue_deleted": stats.queues_deleted,
    }


def node_json(ctx: ManagementContext) -> dict[str, Any]:
    """The node as /api/nodes shows it. Memory and disk figures, limits and alarms are the
    broker's resource alarms' own (broker.alarms), so they agree with what blocks publishers."""
    broker = ctx.broker
    process = ctx.process_stats()
    alarms = broker.alarms
    config_file = broker.config.config_file
    node = {
        "name": broker.node_name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "os_pid": str(os.getpid()),
        # Before the monitor's first check (or without one) the process sample stands in.
        "mem_used": alarms.memory_used if alarms.measured else process.resident_memory_bytes,
        "mem_limit": alarms.memory_limit,
        "mem_alarm": alarms.memory_alarm,
        "mem_calculation_strategy": "rss",
        "disk_free": alarms.disk_free if alarms.measured else process.disk_free_bytes,
        "disk_free_limit": alarms.disk_free_limit,
        "disk_free_alarm": alarms.disk_alarm,
        "fd_used": process.open_fds,
        "fd_total": process.max_fds,
        "sockets_used": len(broker.connections),
        "sockets_total": process.max_tcp_sockets,
        "proc_used": 1,
        "proc_total": 1,
        "run_queue": 0,
        "processors": os.cpu_count() or 1,
        "uptime": int(uptime_seconds() * 1000),
        "partitions": [],
        "rates_mode": "basic",
        "net_ticktime": 60,
        "exchange_types": EXCHANGE_TYPES,
        "auth_mechanisms": AUTH_MECHANISMS,
        "applications": [
            {"name": identity.PRODUCT_NAME, "description": "A RabbitMQ-compatible AMQP 0-9-1 broker",
             "version": identity.PRODUCT_VERSION},
        ],
        "contexts": [],
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "config_files": [str(config_file)] if config_file else [],
        "log_files": ["<stderr>"],
        "db_dir": str(broker.config.data_dir),
        "cluster_links": [],
    }
    node.update(ctx.rates.details(OVERVIEW_KEY, _churn(broker.stats)))
    return node


def remote_node_json(node: "NodeRecord") -> dict[str, Any]:
    """Another live cluster node as /api/nodes lists it: what its membership record says. Its
    resource figures live on that node (its own /api/nodes); none are invented here."""
    return {
        "name": node.name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "amqp_address": node.amqp_address,
        "management_address": node.management_address,
        "started_at": int(node.started_at * 1000),
        "partitions": [],
    }


def vhost_json(ctx: ManagementContext, vhost: "VirtualHost") -> dict[str, Any]:
    key = ("vhost", vhost.name)
    totals = vhost_totals(vhost)
    metadata = ctx.broker.vhost_metadata.get(vhost.name, {})
    description, tags = metadata.get("description", ""), list(metadata.get("tags", []))
    item = {
        "name": vhost.name,
        "description": description,
        "tags": tags,
        "metadata": {"description": description, "tags": list(tags)},
        "default_queue_type": vhost.default_queue_type,  # the broker's default_queue_type
        "tracing": is_tracing(vhost),
        "cluster_state": {ctx.broker.node_name: "running"},
        "message_stats": ctx.rates.details(key, queue_message_counts(vhost.queue_stats_total(), include_publish=False)),
    }
    item.update(ctx.rates.details(key, totals))
    return item


def user_json(user: User, limits: dict[str, int] | None = None) -> dict[str, Any]:
    """`limits`: the user's max-connections and max-channels where set (Broker.user_limits)."""
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": HASHING_ALGORITHM,
        "tags": list(user.tags),
        "limits": dict(limits or {}),
    }


def permission_json(permission: PermissionConfig) -> dict[str, Any]:
    return {
        "user": permission.user,
        "vhost": permission.vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }
