"""/api/bindings: list, create (POST) and delete bindings between an exchange and a queue
(`/e/{source}/q/{queue}`) or another exchange (`/e/{source}/e/{destination}`).

Binding needs write permission on the destination and read on the source, as with AMQP.
A binding in a URL is named by its properties key (see topology_json.properties_key).
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.wire.errors import AMQPError
from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.exchange_routes import DEFAULT_EXCHANGE_ALIAS, exchange_name
from amqp_server.management.http_io import (
    as_table,
    item_reply,
    list_reply,
    no_content,
    read_body,
    vhost_for_write,
    vhosts_in_scope,
    visible_vhost,
)
from amqp_server.management.topology_json import all_bindings, all_bindings_json, binding_json, properties_key

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost
    from exchanges.exchange import Exchange
    from queues.queue import Queue


async def list_bindings(request: web.Request) -> web.Response:
    return list_reply(request, [b for v in vhosts_in_scope(request) for b in all_bindings_json(v)], lambda b: b["vhost"])


def _ends(request: web.Request) -> tuple["VirtualHost", "Exchange", "Queue | Exchange"]:
    vhost = visible_vhost(request)
    source = vhost.exchanges.get(exchange_name(request.match_info["source"]))
    pool: Any = vhost.queues if request.match_info["kind"] == "q" else vhost.exchanges
    destination = pool.get(request.match_info["destination"])
    if source is None or destination is None:
        raise api_errors.not_found()
    return vhost, source, destination


def _between(vhost: "VirtualHost", source: "Exchange", destination: "Queue | Exchange") -> list[dict[str, Any]]:
    return [binding_json(vhost, *b) for b in all_bindings(vhost) if b[0] is source and b[1] is destination]


def _ends_to_bind(request: web.Request) -> tuple["VirtualHost", "Exchange", "Queue | Exchange"]:
    """Both ends of a new binding, or RabbitMQ's 404 naming the first that is missing."""
    vhost = vhost_for_write(context(request).broker, request.match_info["vhost"])
    caller(request).require_vhost_contents(vhost.name)
    source_name = exchange_name(request.match_info["source"])
    source = vhost.exchanges.get(source_name)
    if source is None:
        raise api_errors.no_such("exchange", source_name, vhost.name)
    is_queue = request.match_info["kind"] == "q"
    destination_name = request.match_info["destination"]
    destination = (vhost.queues if is_queue else vhost.exchanges).get(destination_name)
    if destination is None:
        raise api_errors.no_such("queue" if is_queue else "exchange", destination_name, vhost.name)
    return vhost, source, destination


async def bindings_between(request: web.Request) -> web.Response:
    # RabbitMQ lists no bindings (200 []) when the vhost or either end does not exist.
    try:
        vhost, source, destination = _ends(request)
    except api_errors.ApiError as error:
        if error.status != 404:
            raise
        return list_reply(request, [])
    return list_reply(request, _between(vhost, source, destination), lambda b: (b["routing_key"], b["properties_key"]))


async def create_binding(request: web.Request) -> web.Response:
    vhost, source, destination = _ends_to_bind(request)
    user = caller(request)
    user.require_permission("write", vhost.name, destination.name)
    user.require_permission("read", vhost.name, source.name or DEFAULT_EXCHANGE_ALIAS)
    body = await read_body(request)
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise api_errors.bad_request("routing_key must be a string")
    arguments = as_table(body.get("arguments"))
    try:
        vhost.bind(source, destination, routing_key, arguments)
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    location = f"{urllib.parse.quote(destination.name, safe='')}/{properties_key(routing_key, arguments)}"
    return web.Response(status=201, headers={"Location": location})


def _binding_named(request: web.Request) -> tuple["VirtualHost", "Exchange", "Queue | Exchange", dict[str, Any]]:
    vhost, source, destination = _ends(request)
    wanted = request.match_info["props"]
    for binding in _between(vhost, source, destination):
        if binding["properties_key"] == wanted:
            return vhost, source, destination, binding
    raise api_errors.not_found()


async def show_binding(request: web.Request) -> web.Response:
    return item_reply(request, _binding_named(request)[3])


async def delete_binding(request: web.Request) -> web.Response:
    vhost, source, destination, binding = _binding_named(request)
    user = caller(request)
    user.require_permission("write", vhost.name, destination.name)
    user.require_permission("read", vhost.name, source.name or DEFAULT_EXCHANGE_ALIAS)
    try:
        vhost.unbind(source, destination, binding["routing_key"], binding["arguments"])
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/bindings", list_bindings)
    router.add_get("/api/bindings/{vhost}", list_bindings)
    between = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
    router.add_get(between, bindings_between)
    router.add_post(between, create_binding)
    router.add_get(between + "/{props}", show_binding)
    router.add_delete(between + "/{props}", delete_binding)
