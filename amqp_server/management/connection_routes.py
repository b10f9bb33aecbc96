"""/api/connections, /api/channels, /api/consumers.

Monitoring and administrator users see everything; a management user sees only connections
(and their channels) opened with their own user name. Closing a connection
(DELETE /api/connections/{name}) sends it connection.close 320 CONNECTION_FORCED with the
text from the X-Reason header, as RabbitMQ does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.connection.views import connections_of
from amqp_server.wire.errors import CONNECTION_FORCED
from amqp_server.management import api_errors
from amqp_server.management.connection_json import channel_json, connection_json, consumer_json
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import item_reply, list_reply, no_content, vhost_named
from amqp_server.metrics.broker_view import channels_of
from amqp_server.metrics.core_collector import channel_label
from amqp_server.metrics.stream_figures import consumer_offsets

if TYPE_CHECKING:
    from amqp_server.connection.connection import Connection
    from queues.consumer import Consumer
    from queues.queue import Queue

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _visible_connections(request: web.Request) -> list["Connection"]:
    user = caller(request)
    return [c for c in connections_of(context(request).broker) if user.may_see_connection(c)]


def _connection_named(request: web.Request) -> "Connection":
    wanted = request.match_info["name"]
    for connection in _visible_connections(request):
        if connection.name == wanted:
            return connection
    raise api_errors.not_found()


async def list_connections(request: web.Request) -> web.Response:
    ctx = context(request)
    return list_reply(
        request, [connection_json(c, ctx.broker.node_name, ctx.rates) for c in _visible_connections(request)], paginated=True)


async def show_connection(request: web.Request) -> web.Response:
    ctx = context(request)
    return item_reply(request, connection_json(_connection_named(request), ctx.broker.node_name, ctx.rates))


async def close_connection(request: web.Request) -> web.Response:
    connection = _connection_named(request)
    user = caller(request)
    if not user.is_admin and (connection.user is None or connection.user.name != user.name):
        raise api_errors.access_refused()
    reason = request.headers.get("X-Reason", DEFAULT_CLOSE_REASON)
    connection.close_by_broker(CONNECTION_FORCED, reason)
    return no_content()


def _connections_of_user(request: web.Request) -> list["Connection"]:
    wanted = request.match_info["user"]
    return [c for c in _visible_connections(request) if c.user is not None and c.user.name == wanted]


async def user_connections(request: web.Request) -> web.Response:
    """GET /api/connections/username/{user}: that user's connections, as far as the caller may see
    them (an unknown user has none: 200 [], as in RabbitMQ)."""
    ctx = context(request)
    return list_reply(
        request, [connection_json(c, ctx.broker.node_name, ctx.rates) for c in _connections_of_user(request)], paginated=True)


async def close_user_connections(request: web.Request) -> web.Response:
    """DELETE /api/connections/username/{user}: close every connection of that user (an
    administrator, or the user for their own), 204 even when there are none, as in RabbitMQ."""
    user = caller(request)
    if not user.is_admin and user.name != request.match_info["user"]:
        raise api_errors.access_refused()
    reason = request.headers.get("X-Reason", DEFAULT_CLOSE_REASON)
    for connection in _connections_of_user(request):
        connection.close_by_broker(CONNECTION_FORCED, reason)
    return no_content()


async def connection_channels(request: web.Request) -> web.Response:
    ctx = context(request)
    connection = _connection_named(request)
    return list_reply(request, [
        channel_json(connection, channel, ctx.broker.node_name) for channel in list(connection.channels.values())
    ])


async def list_channels(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    return list_reply(request, [
        channel_json(c, channel, ctx.broker.node_name)
        for c, channel in channels_of(ctx.broker)
        if user.may_see_connection(c)
    ], paginated=True)


async def show_channel(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    for connection, channel in channels_of(ctx.broker):
        if user.may_see_connection(connection) and channel_label(connection.name, channel.id) == request.match_info["name"]:
            return item_reply(request, channel_json(connection, channel, ctx.broker.node_name))
    raise api_errors.not_found()


async def list_consumers(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    only_vhost = None
    if "vhost" in request.match_info:
        only_vhost = vhost_named(ctx.broker, request.match_info["vhost"]).name
    offsets: dict["Queue", dict["Consumer", int]] = {}  # a stream's consumer offsets, read once per stream

    def stream_offset(consumer: "Consumer") -> int | None:
        queue = consumer.queue
        if queue not in offsets:
            offsets[queue] = consumer_offsets(queue)
        return offsets[queue].get(consumer)

    consumers = [
        consumer_json(connection, channel, consumer, ctx.broker.node_name, stream_offset(consumer))
        for connection, channel in channels_of(ctx.broker)
        for consumer in list(channel.consumers.values())
        if user.may_see_vhost_contents(consumer.queue.vhost) and user.may_see_connection(connection)
        and (only_vhost is None or consumer.queue.vhost == only_vhost)
    ]
    return list_reply(request, consumers, _by_queue_and_tag)


def _by_queue_and_tag(consumer: dict[str, Any]) -> tuple[Any, ...]:
    return consumer["queue"]["vhost"], consumer["queue"]["name"], consumer["consumer_tag"]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/connections", list_connections)
    router.add_get("/api/connections/username/{user}", user_connections)
    router.add_delete("/api/connections/username/{user}", close_user_connections)
    router.add_get("/api/connections/{name}", show_connection)
    router.add_delete("/api/connections/{name}", close_connection)
    router.add_get("/api/connections/{name}/channels", connection_channels)
    router.add_get("/api/channels", list_channels)
    router.add_get("/api/channels/{name}", show_channel)
    router.add_get("/api/consumers", list_consumers)
    router.add_get("/api/consumers/{vhost}", list_consumers)
