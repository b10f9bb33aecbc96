"""Queues in the management API's JSON shape (GET /api/queues...).

Counts are current, not sampled: `messages_ready` and `messages_unacknowledged` are the
queue's own counters at the moment of the request (RabbitMQ's lag by up to 5 s).

Byte counts, `messages_paged_out`, `memory` (an estimate) and `consumer_utilisation` (sampled
now, not averaged) come from amqp_server/metrics/queue_sizes.py; `messages_persistent`,
`message_bytes_persistent`, `message_bytes_paged_out` and `idle_since` are left out because
queues do not track them (docs/management-api.md).

`messages_delayed` is not in RabbitMQ 3.10's shape: messages waiting for a delayed retry,
neither ready nor unacked, so not in `messages` either (docs/management-api.md).

A stream has RabbitMQ's stream shape: `messages` = `messages_ready` = its records,
`messages_unacknowledged` 0, `members`/`online`/`readers`, no byte or paging items; and this
broker's `stream_first_offset`, `stream_last_offset`, `stream_segments`, `stream_disk_bytes`
(and, for one stream, `stream_segment_details` and each consumer's `stream_offset`). On a
cluster, a node that does not lead a replicated stream starts from its own replica's figures;
queue_routes.py then takes the leader's (stream_leaders.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amqp_server.connection.views import connection_of
from amqp_server.channel.channel import Channel
from amqp_server.connection.connection import Connection
from amqp_server.broker import policy_application
from amqp_server.management.connection_json import connection_details, consumer_json
from amqp_server.management.message_stats import queue_depth_counts, queue_message_counts
from amqp_server.management.rates import RateSampler
from amqp_server.metrics.broker_view import queue_depth
from amqp_server.metrics.queue_sizes import QueueSizes, queue_sizes
from amqp_server.metrics.stream_figures import StreamFigures, consumer_offsets, segment_details, stream_figures
from queues.arguments.queue_type_rules import STREAM

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost
    from queues.queue import Queue


def queue_json(
    vhost: "VirtualHost", queue: "Queue", rates: RateSampler, node: str, unacked_bytes: int = 0, running: bool = True,
    replica: StreamFigures | None = None,
) -> dict[str, Any]:
    """`unacked_bytes`: from metrics.queue_sizes.unacked_bytes_by_queue, computed once per request.
    `node` holds the queue's messages; `running` False says that node is down (in a cluster).
    `replica`: for the stand-in of a replicated stream another node leads, the figures of this
    node's replica (metrics/stream_figures.replica_figures), shown until the leader's replace
    them (stream_leaders.py)."""
    key = ("queue", vhost.name, queue.name)
    sizes = queue_sizes(queue, unacked_bytes)
    item: dict[str, Any] = {
        "arguments": queue.arguments,
        "auto_delete": queue.auto_delete,
        "consumers": queue.consumer_count,
        "durable": queue.durable,
        "exclusive": queue.exclusive,
        "memory": sizes.memory,
        "message_stats": rates.details(key, queue_message_counts(queue.stats)),
        "name": queue.name,
        "node": node,
        "state": queue_state(queue, running),
        "type": queue.settings.queue_type,  # "classic", "quorum" or "stream", as RabbitMQ shows it
        "vhost": vhost.name,
    }
    item.update(policy_application.for_queue(vhost, queue.name, queue.settings.queue_type).as_json())
    figures = stream_figures(queue) or replica
    depth = queue_depth(queue) if replica is None else (replica.messages, 0)
    item.update(rates.details(key, queue_depth_counts(*depth)))
    if queue.settings.queue_type != STREAM:
        item.update(_message_queue_items(queue, sizes))
    else:
        item.update(_stream_items(queue, figures, node, running))
    owner = queue.exclusive_owner
    if isinstance(owner, Connection):  # not an exclusive queue of another cluster node
        item["owner_pid_details"] = connection_details(owner)
    return dict(sorted(item.items()))


def _message_queue_items(queue: "Queue", sizes: QueueSizes) -> dict[str, Any]:
    """The items of a classic or quorum queue that a stream has not (RabbitMQ shows none of them
    for a stream: its records are on disk, and a delivery takes none away)."""
    return {
        "exclusive_consumer_tag": next((c.tag for c in queue.consumers() if c.exclusive), None),
        "head_message_timestamp": None,
        "consumer_utilisation": sizes.consumer_utilisation,
        "message_bytes": sizes.bytes,
        "message_bytes_ready": sizes.ready_bytes,
        "message_bytes_unacknowledged": sizes.unacked_bytes,
        "messages_delayed": queue.waiting_count,
        "single_active_consumer_tag": None,
        # Durable queues page persistent messages out to their journal; the rest are in memory.
        "messages_ready_ram": sizes.in_memory,
        "messages_unacknowledged_ram": queue.unacked_count,
        "messages_ram": sizes.in_memory + queue.unacked_count,
        "messages_paged_out": sizes.paged_out,
        "recoverable_slaves": None,
    }


def _stream_items(queue: "Queue", figures: StreamFigures | None, node: str, running: bool) -> dict[str, Any]:
    """A stream's items: RabbitMQ's (`members`, `online`, `readers`: consumers per node) and
    this broker's `stream_*` figures (metrics/stream_figures.py), null for the stand-in of a
    stream held elsewhere while neither its holder's nor a replica's figures are known here."""
    return {
        "members": [node],
        "online": [node] if running else [],
        "readers": {node: queue.consumer_count},
        **stream_figure_items(figures),
    }


def stream_figure_items(figures: StreamFigures | None) -> dict[str, Any]:
    """The `stream_*` items of a stream's (or a replica's) figures."""
    return {
        "stream_first_offset": figures.first_offset if figures is not None else None,
        "stream_last_offset": figures.last_offset if figures is not None else None,
        "stream_segments": figures.segments if figures is not None else None,
        "stream_disk_bytes": figures.disk_bytes if figures is not None else None,
    }


def queue_state(queue: "Queue", running: bool = True) -> str:
    """RabbitMQ's queue states that apply here: "running"; "down" when the node holding it is
    (a cluster); "crashed" when its journal could not write a state record (queues/journal.py)."""
    if not running:
        return "down"
    return "crashed" if queue.failure is not None else "running"


def queue_detail_json(
    vhost: "VirtualHost", queue: "Queue", rates: RateSampler, node: str, unacked_bytes: int = 0, running: bool = True,
    replica: StreamFigures | None = None, *, here: str | None = None,
) -> dict[str, Any]:
    """One queue (GET /api/queues/{vhost}/{name}): the list shape plus its consumers (on a
    cluster, those attached on this node, `here`: a stand-in's are served through the queue's
    holder, `node`, and their channels are this node's)."""
    item = queue_json(vhost, queue, rates, node, unacked_bytes, running, replica)
    offsets = consumer_offsets(queue)
    item["consumer_details"] = [
        consumer_json(connection_of(consumer.sink), consumer.sink, consumer, here or node, offsets.get(consumer))
        for consumer in queue.consumers()
        if isinstance(consumer.sink, Channel)  # a client's channel (every sink the broker makes)
    ]
    segments = segment_details(queue)
    if segments is not None:
        item["stream_segment_details"] = segments
    item["deliveries"] = []
    item["incoming"] = []
    return item
