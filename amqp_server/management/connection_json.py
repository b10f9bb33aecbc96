"""Connections, channels and consumers in the management API's JSON shapes.

Names follow RabbitMQ: a connection is "client_ip:port -> server_ip:port", a channel is its
connection's name and " (n)". Per-connection byte counts and per-channel message counters are
not kept by the broker, so `recv_oct`/`send_oct` and channel `message_stats` are left out
rather than reported as zero.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqp_server.metrics.broker_view import unconfirmed_count
from amqp_server.metrics.core_collector import channel_label
from amqp_server.wire.states import ConnectionState

if TYPE_CHECKING:
    from amqp_server.channel.channel import Channel
    from amqp_server.connection.connection import Connection
    from amqp_server.management.rates import RateSampler
    from queues.consumer import Consumer



def _split_address(address: str) -> tuple[str, int | None]:
    host, _, port = address.rpartition(":")
    return host, int(port) if port.isdigit() else None


def _state(channel: "Channel") -> str:
    return channel.state.value  # RabbitMQ's names: running, closing, closed


def connection_state(connection: "Connection") -> str:
    """RabbitMQ's connection state (rabbit_reader's `state` info item): "blocked" once a resource
    alarm has stopped reading from it, "blocking" while an alarm is in effect and it has not
    published since (its next publish blocks it), "flow" while a congested queue holds back its
    publishes, else "running" (or the handshake or closing state it is in)."""
    if connection.state is not ConnectionState.OPEN:
        # Before its protocol header a connection is "starting" too.
        return "starting" if connection.state is ConnectionState.AWAIT_HEADER else connection.state.value
    return connection.flow.management_state


def connection_traffic(connection: "Connection") -> dict[str, int]:
    """The byte counters whose rates RabbitMQ shows (recv_oct_details, send_oct_details)."""
    return {"recv_oct": connection.received_bytes, "send_oct": connection.sent_bytes}


def connection_json(connection: "Connection", node: str, rates: "RateSampler") -> dict[str, Any]:
    local = connection.local_address
    host, port = _split_address(local) if local else ("", None)
    properties = connection.client_properties
    user = connection.user.name if connection.user else ""
    return {
        "auth_mechanism": connection.mechanism or None,  # null until the client logged in
        "channel_max": connection.channel_max,
        "channels": len(connection.channels),
        "client_properties": properties,
        "frame_max": connection.frame_max,
        "host": host,
        "name": connection.name,
        "node": node,
        **_tls_items(connection),
        "peer_host": connection.peer_host,
        "peer_port": connection.peer_port,
        "port": port,
        "protocol": connection.protocol.name,  # "AMQP 0-9-1", or "AMQP 0-8"
        "state": connection_state(connection),
        "timeout": connection.heartbeat,
        "type": "network",
        "user": user,
        "user_provided_name": properties.get("connection_name"),
        "user_who_performed_action": user,
        "vhost": connection.vhost.name if connection.vhost else None,
        "connected_at": connection.connected_at_ms,
        "recv_cnt": connection.received_reads,
        "send_cnt": connection.sent_writes,
        "send_pend": 0,  # written at once by the event loop; nothing waits in a send queue
        **rates.details(("connection", connection.name), connection_traffic(connection)),
    }


def _tls_items(connection: "Connection") -> dict[str, Any]:
    """RabbitMQ's ssl* and peer_cert_* items: null on a plain connection."""
    tls = connection.tls
    if tls is None:
        return {"ssl": False, "ssl_cipher": None, "ssl_hash": None, "ssl_key_exchange": None, "ssl_protocol": None,
                "peer_cert_issuer": None, "peer_cert_subject": None, "peer_cert_validity": None}
    return {"ssl": True, "ssl_cipher": tls.cipher, "ssl_hash": tls.hash, "ssl_key_exchange": tls.key_exchange,
            "ssl_protocol": tls.protocol, "peer_cert_issuer": tls.peer_cert_issuer,
            "peer_cert_subject": tls.peer_cert_subject, "peer_cert_validity": tls.peer_cert_validity}


def connection_details(connection: "Connection") -> dict[str, Any]:
    """How channels and exclusive queues name the connection they belong to."""
    return {"name": connection.name, "peer_host": connection.peer_host, "peer_port": connection.peer_port}


def channel_json(connection: "Connection", channel: "Channel", node: str) -> dict[str, Any]:
    user = connection.user.name if connection.user else ""
    return {
        "acks_uncommitted": channel.uncommitted_acks,
        "confirm": channel.confirms is not None,
        "connection_details": connection_details(connection),
        "consumer_count": len(channel.consumers),
        "global_prefetch_count": channel.global_prefetch_count,
        "messages_unacknowledged": len(channel.unacked),
        "messages_uncommitted": channel.uncommitted_messages,
        "messages_unconfirmed": unconfirmed_count(channel),
        "name": channel_label(connection.name, channel.id),
        "node": node,
        "number": channel.id,
        "prefetch_count": channel.prefetch_count,
        "state": _state(channel),
        "transactional": channel.transactional,
        "user": user,
        "user_who_performed_action": user,
        "vhost": channel.vhost.name if channel.vhost else None,
    }


def consumer_json(connection: "Connection", channel: "Channel", consumer: "Consumer", node: str,
                  stream_offset: int | None = None) -> dict[str, Any]:
    """`stream_offset`: for a consumer of a stream, the offset it reads next (this broker's item,
    not RabbitMQ's; metrics/stream_figures.consumer_offsets); left out for other consumers."""
    connection_name = connection.name
    item: dict[str, Any] = {
        "arguments": consumer.arguments,
        "ack_required": not consumer.no_ack,
        "active": True,
        "activity_status": "up",
        "channel_details": {
            "connection_name": connection_name,
            "name": channel_label(connection_name, channel.id),
            "node": node,
            "number": channel.id,
            "peer_host": connection.peer_host,
            "peer_port": connection.peer_port,
            "user": connection.user.name if connection.user else "",
        },
        "consumer_tag": consumer.tag,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch_count,
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost},
    }
    if stream_offset is not None:
        item["stream_offset"] = stream_offset
    return item
