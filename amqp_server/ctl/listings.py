"""The list_* commands: which API resource each reads, its columns, and rabbitmqctl's defaults.

Column names are rabbitmqctl's info items. Most are the same key in the API's JSON; the rest
have an extractor here. This broker has no Erlang processes, so the `pid` columns of
connections and channels show their names (what close_connection accepts), and queue pids
are empty.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amqp_server.ctl.api_client import quote

Extractor = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class Listing:
    title: str  # printed before the table unless --quiet; {vhost} / {arg} are filled in
    path: str  # the API resource; {vhost} / {arg} are filled in (quoted)
    defaults: tuple[str, ...]
    columns: tuple[str, ...]  # every column the command accepts
    extractors: dict[str, Extractor] = field(default_factory=dict)
    needs_arg: str | None = None  # a required positional argument before the columns (e.g. user)
    accepts_columns: bool = True
    only: Callable[[dict[str, Any]], bool] | None = None  # which items of the resource are listed (all if None)

    def value(self, item: dict[str, Any], column: str) -> Any:
        extractor = self.extractors.get(column)
        return extractor(item) if extractor is not None else item.get(column)

    def listed(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The items of the resource this command lists."""
        return items if self.only is None else [item for item in items if self.only(item)]

    def resolve(self, vhost: str, arg: str | None) -> tuple[str, str]:
        """(title, API path) for this invocation."""
        title = self.title.format(vhost=vhost, arg=arg)
        path = self.path.format(vhost=quote(vhost), arg=quote(arg or ""))
        return title, path


def _nested(key: str, inner: str) -> Extractor:
    return lambda item: (item.get(key) or {}).get(inner)


def _constant(value: Any) -> Extractor:
    return lambda item: value


# rabbitmqctl prints the protocol as an Erlang tuple (the version of the framing module spoken:
# a client that sent AMQP 0-9's header speaks 0-9-1).
_PROTOCOL_TUPLES = {"AMQP 0-9-1": "{0,9,1}", "AMQP 0-8": "{0,8,0}"}


def _protocol(item: dict[str, Any]) -> Any:
    protocol = item.get("protocol")
    return _PROTOCOL_TUPLES.get(protocol, protocol) if isinstance(protocol, str) else protocol


def _json(key: str) -> Extractor:
    """A value rabbitmqctl prints as compact JSON (a policy's definition)."""
    return lambda item: json.dumps(item.get(key), separators=(",", ":"))


def _message_bytes(item: dict[str, Any]) -> Any:
    if "message_bytes" in item:
        return item["message_bytes"]
    parts = [item.get("message_bytes_ready"), item.get("message_bytes_unacknowledged")]
    return sum(part for part in parts if isinstance(part, int)) if any(p is not None for p in parts) else None


def _policy_listing(title: str, path: str) -> Listing:
    """rabbitmqctl's policy tables: fixed columns, the definition as compact JSON."""
    columns = ("vhost", "name", "pattern", "apply-to", "definition", "priority")
    return Listing(title=title, path=path, defaults=columns, columns=columns,
                   extractors={"definition": _json("definition")}, accepts_columns=False)


LISTINGS: dict[str, Listing] = {
    "list_queues": Listing(
        title="Listing queues for vhost {vhost} ...",
        path="/api/queues/{vhost}",
        defaults=("name", "messages"),
        columns=(
            "name", "durable", "auto_delete", "arguments", "policy", "pid", "owner_pid", "exclusive",
            "exclusive_consumer_pid", "exclusive_consumer_tag", "messages_ready", "messages_unacknowledged",
            "messages", "messages_ready_ram", "messages_unacknowledged_ram", "messages_ram", "messages_persistent",
            "message_bytes", "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_ram",
            "message_bytes_persistent", "head_message_timestamp", "disk_reads", "disk_writes", "consumers",
            "consumer_utilisation", "consumer_capacity", "memory", "slave_pids", "synchronised_slave_pids", "state",
            "type", "leader", "members", "online",
            # amqp-server's, of a stream (the management API's items; docs/streams.md "Operations")
            "stream_first_offset", "stream_last_offset", "stream_segments", "stream_disk_bytes",
        ),
        extractors={
            "pid": _constant(None),
            "owner_pid": _nested("owner_pid_details", "name"),
            "exclusive_consumer_pid": _constant(None),
            "message_bytes": _message_bytes,
        },
    ),
    "list_exchanges": Listing(
        title="Listing exchanges for vhost {vhost} ...",
        path="/api/exchanges/{vhost}",
        defaults=("name", "type"),
        columns=("name", "type", "durable", "auto_delete", "internal", "arguments", "policy"),
    ),
    "list_bindings": Listing(
        title="Listing bindings for vhost {vhost}...",
        path="/api/bindings/{vhost}",
        defaults=("source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"),
        columns=("source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"),
        extractors={
            "source_name": lambda item: item.get("source"),
            "source_kind": _constant("exchange"),
            "destination_name": lambda item: item.get("destination"),
            "destination_kind": lambda item: item.get("destination_type"),
        },
    ),
    "list_connections": Listing(
        title="Listing connections ...",
        path="/api/connections",
        defaults=("user", "peer_host", "peer_port", "state"),
        columns=(
            "pid", "name", "port", "host", "peer_port", "peer_host", "ssl", "ssl_protocol", "ssl_key_exchange",
            "ssl_cipher", "ssl_hash", "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity", "state",
            "channels", "protocol", "auth_mechanism", "user", "vhost", "timeout", "frame_max", "channel_max",
            "client_properties", "recv_oct", "recv_cnt", "send_oct", "send_cnt", "send_pend", "connected_at",
        ),
        extractors={"pid": lambda item: item.get("name"), "protocol": _protocol},
    ),
    "list_channels": Listing(
        title="Listing channels ...",
        path="/api/channels",
        defaults=("pid", "user", "consumer_count", "messages_unacknowledged"),
        columns=(
            "pid", "connection", "name", "number", "user", "vhost", "transactional", "confirm", "consumer_count",
            "messages_unacknowledged", "messages_uncommitted", "acks_uncommitted", "messages_unconfirmed",
            "prefetch_count", "global_prefetch_count",
        ),
        extractors={"pid": lambda item: item.get("name"), "connection": _nested("connection_details", "name")},
    ),
    "list_consumers": Listing(
        title="Listing consumers in vhost {vhost} ...",
        path="/api/consumers/{vhost}",
        defaults=("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments"),
        columns=(
            "queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active",
            "activity_status", "arguments",
        ),
        extractors={"queue_name": _nested("queue", "name"), "channel_pid": _nested("channel_details", "name")},
    ),
    # rabbitmq-streams' list_stream_consumers, for the AMQP 0-9-1 consumers of streams: a
    # consumer has a tag (not a stream-protocol subscription id), `offset` is the one it reads
    # next, and its arguments stand for the subscription properties.
    "list_stream_consumers": Listing(
        title="Listing stream consumers ...",
        path="/api/consumers/{vhost}",
        defaults=("stream", "consumer_tag", "offset"),
        columns=("stream", "consumer_tag", "offset", "connection_pid", "channel_pid", "prefetch_count", "active",
                 "activity_status", "arguments"),
        extractors={
            "stream": _nested("queue", "name"),
            "offset": lambda item: item.get("stream_offset"),
            "connection_pid": _nested("channel_details", "connection_name"),
            "channel_pid": _nested("channel_details", "name"),
        },
        only=lambda item: "stream_offset" in item,  # the API gives it to the consumers of streams only
    ),
    "list_users": Listing(
        title="Listing users ...",
        path="/api/users",
        defaults=("user", "tags"),
        columns=("user", "tags"),
        extractors={"user": lambda item: item.get("name")},
        accepts_columns=False,
    ),
    "list_vhosts": Listing(
        title="Listing vhosts ...",
        path="/api/vhosts",
        defaults=("name",),
        columns=("name", "description", "tags", "default_queue_type", "tracing", "cluster_state"),
    ),
    "list_permissions": Listing(
        title='Listing permissions for vhost "{vhost}" ...',
        path="/api/vhosts/{vhost}/permissions",
        defaults=("user", "configure", "write", "read"),
        columns=("user", "configure", "write", "read"),
        accepts_columns=False,
    ),
    "list_policies": _policy_listing('Listing policies for vhost "{vhost}" ...', "/api/policies/{vhost}"),
    "list_operator_policies": _policy_listing(
        'Listing operator policy overrides for vhost "{vhost}" ...', "/api/operator-policies/{vhost}"
    ),
    "list_user_permissions": Listing(
        title='Listing permissions for user "{arg}" ...',
        path="/api/users/{arg}/permissions",
        defaults=("vhost", "configure", "write", "read"),
        columns=("vhost", "configure", "write", "read"),
        needs_arg="username",
        accepts_columns=False,
    ),
}
