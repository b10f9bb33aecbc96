"""/api/vhosts: list, show, create and delete virtual hosts (writes need administrator).

PUT with `{"tracing": true|false}` switches the vhost's firehose (amqp_server/broker/firehose.py), as
RabbitMQ's API does; like RabbitMQ, the switch does not survive a restart.
"""

from __future__ import annotations

from aiohttp import web

from amqp_server.connection.views import connections_of
from amqp_server.broker.firehose import set_tracing
from amqp_server.management.connection_json import channel_json, connection_json
from amqp_server.management.context import caller, context
from amqp_server.management.definitions_transfer import vhost_metadata_of
from amqp_server.management.http_io import (
    as_bool,
    created_or_updated,
    item_reply,
    list_reply,
    no_content,
    read_body,
    vhost_named,
    vhosts_visible_to,
)
from amqp_server.management.node_json import permission_json, vhost_json
from amqp_server.metrics.broker_view import channels_of

FULL_ACCESS = ".*"


async def list_vhosts(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    return list_reply(request, [vhost_json(ctx, v) for v in vhosts_visible_to(ctx.broker, user)], paginated=True)


async def show_vhost(request: web.Request) -> web.Response:
    caller(request).require_admin()  # RabbitMQ 3.10 shows a single vhost to administrators only
    ctx = context(request)
    return item_reply(request, vhost_json(ctx, vhost_named(ctx.broker, request.match_info["vhost"])))


async def put_vhost(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    user.require_admin()
    body = await read_body(request)
    name = request.match_info["vhost"]
    created = name not in ctx.broker.vhosts
    vhost = ctx.broker.add_vhost(name)
    # RabbitMQ replaces description and tags on every PUT: a body without them clears them.
    ctx.broker.set_vhost_metadata(name, *vhost_metadata_of(body))
    if "tracing" in body:
        set_tracing(vhost, as_bool(body["tracing"]), ctx.broker.node_name)
    if created:
        # RabbitMQ grants the creating user full permissions on a vhost made through the API.
        ctx.broker.access.set_permissions(user.name, name, FULL_ACCESS, FULL_ACCESS, FULL_ACCESS)
        ctx.broker.save_definitions()
    return created_or_updated(created)


async def delete_vhost(request: web.Request) -> web.Response:
    ctx = context(request)
    caller(request).require_admin()
    vhost = vhost_named(ctx.broker, request.match_info["vhost"])
    ctx.broker.delete_vhost(vhost.name)
    return no_content()


async def vhost_permissions(request: web.Request) -> web.Response:
    ctx = context(request)
    caller(request).require_admin()
    vhost = vhost_named(ctx.broker, request.match_info["vhost"])
    return list_reply(request, [permission_json(p) for p in ctx.broker.access.permissions() if p.vhost == vhost.name])


async def vhost_topic_permissions(request: web.Request) -> web.Response:
    """Always empty: this broker has no topic permissions."""
    caller(request).require_admin()
    vhost_named(context(request).broker, request.match_info["vhost"])
    return list_reply(request, [])


async def vhost_connections(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    vhost = vhost_named(ctx.broker, request.match_info["vhost"])
    return list_reply(request, [
        connection_json(c, ctx.broker.node_name, ctx.rates)
        for c in connections_of(ctx.broker)
        if c.vhost is vhost and user.may_see_connection(c)
    ])


async def vhost_channels(request: web.Request) -> web.Response:
    ctx, user = context(request), caller(request)
    vhost = vhost_named(ctx.broker, request.match_info["vhost"])
    return list_reply(request, [
        channel_json(c, channel, ctx.broker.node_name)
        for c, channel in channels_of(ctx.broker)
        if channel.vhost is vhost and user.may_see_connection(c)
    ])


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/vhosts", list_vhosts)
    router.add_get("/api/vhosts/{vhost}", show_vhost)
    router.add_put("/api/vhosts/{vhost}", put_vhost)
    router.add_delete("/api/vhosts/{vhost}", delete_vhost)
    router.add_get("/api/vhosts/{vhost}/permissions", vhost_permissions)
    router.add_get("/api/vhosts/{vhost}/topic-permissions", vhost_topic_permissions)
    router.add_get("/api/vhosts/{vhost}/connections", vhost_connections)
    router.add_get("/api/vhosts/{vhost}/channels", vhost_channels)

