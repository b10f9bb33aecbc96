"""The figures of a stream another node of the cluster holds, as that node shows them.

On a cluster one node holds a stream (the leader of a replicated stream's group, or the owner
of a stream not replicated); every other node holds a stand-in, which reaches it over the
links and has no figures of its own. RabbitMQ's management shows a stream's figures on every
node, so this node asks the holder's own management API (peer_api.py): one request per holder
node for a listing, one for a single stream, with the caller's credentials. It takes the
holder's `LEADER_ITEMS` and labels them `stream_figures_node` (the holder); what is this node's
own stays: `consumer_details` (the consumers attached here, each with its `stream_offset`),
and `replica`, the figures of this node's replica of the stream.

A holder that does not answer (it is going away, a failover is under way, or the caller came
with a UI session cookie that only this node knows) leaves the figures this node's replica has
(queue_json's `replica`, labelled with this node as `stream_figures_node`), or none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.management.peer_api import ask_peers, path_segment
from queues.arguments.queue_type_rules import STREAM
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost
    from queues.queue import Queue

# What the holder's item says of the stream as a whole (every node shows the same).
LEADER_ITEMS = (
    "consumers", "message_stats", "messages", "messages_details", "messages_ready", "messages_ready_details",
    "messages_unacknowledged", "messages_unacknowledged_details", "readers",
    "stream_disk_bytes", "stream_first_offset", "stream_last_offset", "stream_segments",
)
DETAIL_ITEMS = (*LEADER_ITEMS, "stream_segment_details")
FIGURES_NODE = "stream_figures_node"  # whose copy of the stream the figures are

Key = tuple[str, str]  # (vhost, queue)


def holder_elsewhere(broker: "Broker", vhost: "VirtualHost", queue: "Queue") -> str | None:
    """The live node that holds the stream `queue` is this node's stand-in of; None for any
    other queue, and while its holder is down."""
    if queue.settings.queue_type != STREAM or isinstance(queue, StreamQueue):
        return None
    node, live = broker.queue_location(vhost.name, queue.name)
    return node if live and node != broker.node_name else None


def _taken(item: Any, node: str, names: tuple[str, ...]) -> dict[str, Any] | None:
    """The holder's items of its own stream (an item the node answered for a stand-in of its
    own, or from a replica, is not its own)."""
    if not isinstance(item, dict) or item.get(FIGURES_NODE) != node:
        return None
    return {**{name: item[name] for name in names if name in item}, FIGURES_NODE: node}


async def listed_elsewhere(request: web.Request, broker: "Broker", pairs: list[tuple["VirtualHost", "Queue"]],
                           vhost: str | None) -> dict[Key, dict[str, Any]]:
    """The holders' items of the streams among `pairs` that other nodes hold, by (vhost, name):
    each holder asked once, for its listing of `vhost` (None: every vhost)."""
    wanted: dict[str, set[Key]] = {}
    for pair_vhost, queue in pairs:
        node = holder_elsewhere(broker, pair_vhost, queue)
        if node is not None:
            wanted.setdefault(node, set()).add((pair_vhost.name, queue.name))
    if not wanted:
        return {}
    path = "/api/queues" + (f"/{path_segment(vhost)}" if vhost is not None else "")
    params = {"columns": ",".join(("vhost", "name", FIGURES_NODE, *LEADER_ITEMS))}
    found: dict[Key, dict[str, Any]] = {}
    for node, answer in (await ask_peers(request, broker, wanted, path, params)).items():
        for item in answer if isinstance(answer, list) else []:
            key = (str(item.get("vhost")), str(item.get("name"))) if isinstance(item, dict) else ("", "")
            taken = _taken(item, node, LEADER_ITEMS)
            if taken is not None and key in wanted[node]:
                found[key] = taken
    return found


async def shown_elsewhere(request: web.Request, broker: "Broker", vhost: "VirtualHost",
                          queue: "Queue") -> dict[str, Any] | None:
    """The holder's items of the one stream `queue` (this node's stand-in of it), or None."""
    node = holder_elsewhere(broker, vhost, queue)
    if node is None:
        return None
    path = f"/api/queues/{path_segment(vhost.name)}/{path_segment(queue.name)}"
    answers = await ask_peers(request, broker, [node], path, {"columns": ",".join((FIGURES_NODE, *DETAIL_ITEMS))})
    return _taken(answers.get(node), node, DETAIL_ITEMS)
