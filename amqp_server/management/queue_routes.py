"""/api/queues: list, show, declare, delete, purge, bindings, and browsing messages.

Declaring and deleting need the caller's configure permission on the queue; purging and
getting messages need read, as with AMQP. Queues made here are counted as declared and
created, deleted ones as deleted, in the same counters as AMQP's (metrics and overview).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.wire.errors import AMQPError
from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import (
    as_bool,
    as_int,
    as_table,
    created_or_updated,
    item_reply,
    json_reply,
    lazy_page_reply,
    list_reply,
    no_content,
    read_body,
    vhost_for_write,
    vhosts_in_scope,
    visible_vhost,
)
from amqp_server.management.queue_browse import browse
from amqp_server.management.queue_json import queue_detail_json, queue_json, stream_figure_items
from amqp_server.management.stream_leaders import listed_elsewhere, shown_elsewhere
from amqp_server.management.topology_json import all_bindings, binding_json
from amqp_server.metrics.queue_sizes import unacked_bytes_by_queue
from amqp_server.metrics.stream_figures import StreamFigures, log_figures, replica_figures
from queues.arguments.queue_type_rules import QUORUM, STREAM
from queues.stream_queue import StreamQueue

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker
    from amqp_server.broker.vhost import VirtualHost
    from queues.queue import Queue

MAX_NAME_LENGTH = 255


def _queue_of(request: web.Request) -> tuple["VirtualHost", "Queue"]:
    vhost = visible_vhost(request)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise api_errors.not_found()
    return vhost, queue


def _location(broker: "Broker", vhost: "VirtualHost", queue: "Queue",
              unacked_bytes: int) -> tuple[str, int, bool, StreamFigures | None]:
    """queue_json's node, unacked_bytes, running and replica arguments for `queue`."""
    node, live = broker.queue_location(vhost.name, queue.name)
    return node, unacked_bytes, live, replica_figures(broker, vhost.name, queue)


async def list_queues(request: web.Request) -> web.Response:
    ctx = context(request)
    vhosts = vhosts_in_scope(request)
    broker = ctx.broker
    unacked_bytes = unacked_bytes_by_queue(broker)
    queues = [(v, q) for v in vhosts for q in list(v.queues.values())]
    elsewhere = await listed_elsewhere(request, broker, queues, request.match_info.get("vhost"))

    def as_json(pair: tuple["VirtualHost", "Queue"]) -> dict[str, Any]:
        vhost, queue = pair
        item = queue_json(vhost, queue, ctx.rates, *_location(broker, vhost, queue, unacked_bytes.get(queue, 0)))
        return _with_replication(broker, vhost, queue, item, elsewhere.get((vhost.name, queue.name)))

    return lazy_page_reply(request, queues, lambda pair: pair[1].name, lambda pair: pair[0].name, as_json)


async def show_queue(request: web.Request) -> web.Response:
    ctx = context(request)
    vhost, queue = _queue_of(request)
    elsewhere = await shown_elsewhere(request, ctx.broker, vhost, queue)
    if vhost.queues.get(queue.name) is not queue:  # deleted or replaced while the holder was asked
        raise api_errors.not_found()
    unacked_bytes = unacked_bytes_by_queue(ctx.broker).get(queue, 0)
    location = _location(ctx.broker, vhost, queue, unacked_bytes)
    item = queue_detail_json(vhost, queue, ctx.rates, *location, here=ctx.broker.node_name)
    return item_reply(request, _with_replication(ctx.broker, vhost, queue, item, elsewhere))


def _with_replication(broker: "Broker", vhost: "VirtualHost", queue: "Queue", item: dict[str, Any],
                      elsewhere: dict[str, Any] | None = None) -> dict[str, Any]:
    """A replicated queue's item gets RabbitMQ's quorum queue fields (leader, members, online),
    and so does a replicated stream's (as RabbitMQ shows a stream's), with the figures of this
    node's replica in its `replica`. A stream's item says whose figures it shows
    (`stream_figures_node`): a stream held elsewhere gets its holder's (`elsewhere`,
    stream_leaders.py) where that node answered, else this node's replica's."""
    if queue.settings.queue_type == STREAM:
        held_here = isinstance(queue, StreamQueue)
        has_figures = held_here or item.get("stream_first_offset") is not None
        if has_figures:
            item["stream_figures_node"] = broker.node_name
        if elsewhere is not None:
            item.update(elsewhere)
    if broker.replicated is None or not queue.durable or queue.settings.queue_type not in (QUORUM, STREAM):
        return dict(sorted(item.items()))
    replication = broker.replicated.describe(vhost.name, queue.name)
    if replication is None:
        return dict(sorted(item.items()))
    item.update(replication)
    replica_log = broker.replicated.replica_stream(vhost.name, queue.name)
    if replica_log is not None and isinstance(item.get("replica"), dict):
        figures = log_figures(replica_log)
        item["replica"] = {**item["replica"], "messages": figures.messages, **stream_figure_items(figures)}
    return dict(sorted(item.items()))


async def put_queue(request: web.Request) -> web.Response:
    broker = context(request).broker
    vhost = vhost_for_write(broker, request.match_info["vhost"])
    name = request.match_info["name"]
    caller(request).require_permission("configure", vhost.name, name)
    if not name or len(name.encode()) > MAX_NAME_LENGTH:
        raise api_errors.bad_request("queue name must be 1 to 255 bytes")
    body = await read_body(request)
    try:
        _queue, created = vhost.declare_queue(
            name,
            connection=None,
            durable=as_bool(body.get("durable")),
            auto_delete=as_bool(body.get("auto_delete")),
            arguments=as_table(body.get("arguments")),
            by_client=True,
        )
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    broker.stats.queues_declared += 1
    broker.stats.queues_created += created
    return created_or_updated(created)


async def delete_queue(request: web.Request) -> web.Response:
    vhost, queue = _queue_of(request)
    caller(request).require_permission("configure", vhost.name, queue.name)
    if request.query.get("if-unused") == "true" and queue.consumer_count:
        raise api_errors.bad_request(f"queue '{queue.name}' in vhost '{vhost.name}' in use")
    if request.query.get("if-empty") == "true" and queue.message_count:
        raise api_errors.bad_request(f"queue '{queue.name}' in vhost '{vhost.name}' not empty")
    vhost.delete_queue(queue)
    return no_content()


async def purge_queue(request: web.Request) -> web.Response:
    vhost, queue = _queue_of(request)
    caller(request).require_permission("read", vhost.name, queue.name)
    queue.purge()
    return no_content()


async def get_messages(request: web.Request) -> web.Response:
    vhost = context(request).broker.vhosts.get(request.match_info["vhost"])
    if vhost is None:
        raise api_errors.access_refused()  # RabbitMQ: no permissions can exist on a missing vhost
    caller(request).require_vhost_contents(vhost.name)
    queue = vhost.queues.get(request.match_info["name"])
    if queue is None:
        raise api_errors.no_such("queue", request.match_info["name"], vhost.name, prefix="NOT_FOUND - ")
    caller(request).require_permission("read", vhost.name, queue.name)
    body = await read_body(request)
    if "ackmode" not in body:
        raise api_errors.bad_request("ackmode_not_present")
    truncate = body.get("truncate")
    messages = browse(
        queue,
        count=as_int(body.get("count"), 1),
        ackmode=str(body["ackmode"]),
        encoding=str(body.get("encoding") or "auto"),
        truncate=as_int(truncate, 0) if truncate not in (None, "") else None,
    )
    return json_reply(messages)


async def queue_bindings(request: web.Request) -> web.Response:
    vhost, queue = _queue_of(request)
    bindings = [binding_json(vhost, *b) for b in all_bindings(vhost) if b[1] is queue]
    return list_reply(request, bindings, lambda b: (b["source"] != "", b["source"], b["routing_key"]))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/queues", list_queues)
    router.add_get("/api/queues/{vhost}", list_queues)
    router.add_get("/api/queues/{vhost}/{name}", show_queue)
    router.add_put("/api/queues/{vhost}/{name}", put_queue)
    router.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    router.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    router.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    router.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
