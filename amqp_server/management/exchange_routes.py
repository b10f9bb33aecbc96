"""/api/exchanges: list, show, declare, delete, their bindings, and publishing through one.

Declaring and deleting need the caller's configure permission on the exchange, publishing
needs write, as with AMQP. "amq.default" in a URL is the default exchange (named "").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.wire.errors import AMQPError
from amqp_server.management import api_errors, api_publish
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import (
    as_bool,
    as_table,
    created_or_updated,
    item_reply,
    json_reply,
    list_reply,
    no_content,
    read_body,
    vhost_for_write,
    vhost_named,
    vhosts_in_scope,
    visible_vhost,
)
from amqp_server.management.topology_json import all_bindings, binding_json, exchange_json

if TYPE_CHECKING:
    from amqp_server.broker.vhost import VirtualHost
    from exchanges.exchange import Exchange

DEFAULT_EXCHANGE_ALIAS = "amq.default"


def exchange_name(raw: str) -> str:
    return "" if raw == DEFAULT_EXCHANGE_ALIAS else raw


def _exchange_of(request: web.Request) -> tuple["VirtualHost", "Exchange"]:
    vhost = visible_vhost(request)
    exchange = vhost.exchanges.get(exchange_name(request.match_info["name"]))
    if exchange is None:
        raise api_errors.not_found()
    return vhost, exchange


async def list_exchanges(request: web.Request) -> web.Response:
    exchanges = [exchange_json(v, e) for v in vhosts_in_scope(request) for e in list(v.exchanges.values())]
    return list_reply(request, exchanges, paginated=True)


async def show_exchange(request: web.Request) -> web.Response:
    vhost, exchange = _exchange_of(request)
    item = exchange_json(vhost, exchange)
    item["incoming"] = []
    item["outgoing"] = []
    return item_reply(request, item)


async def put_exchange(request: web.Request) -> web.Response:
    vhost = vhost_for_write(context(request).broker, request.match_info["vhost"])
    name = request.match_info["name"]
    caller(request).require_permission("configure", vhost.name, name)
    body = await read_body(request)
    created = name not in vhost.exchanges
    try:
        vhost.declare_exchange(
            name,
            str(body.get("type") or "direct"),
            durable=as_bool(body.get("durable")),
            auto_delete=as_bool(body.get("auto_delete")),
            internal=as_bool(body.get("internal")),
            arguments=as_table(body.get("arguments")),
        )
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    return created_or_updated(created)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost, exchange = _exchange_of(request)
    caller(request).require_permission("configure", vhost.name, exchange.name or DEFAULT_EXCHANGE_ALIAS)
    try:
        vhost.delete_exchange(exchange.name, if_unused=request.query.get("if-unused") == "true")
    except AMQPError as error:
        raise api_errors.from_amqp_error(error) from None
    return no_content()


async def source_bindings(request: web.Request) -> web.Response:
    vhost, exchange = _exchange_of(request)
    bindings = [binding_json(vhost, *b) for b in all_bindings(vhost) if b[0] is exchange]
    return list_reply(request, bindings, _binding_order)


async def destination_bindings(request: web.Request) -> web.Response:
    vhost, exchange = _exchange_of(request)
    return list_reply(request, [binding_json(vhost, *b) for b in vhost.bindings() if b[1] is exchange], _binding_order)


def _binding_order(binding: dict[str, Any]) -> tuple[Any, ...]:
    return binding["source"], binding["destination"], binding["routing_key"], binding["properties_key"]


async def publish(request: web.Request) -> web.Response:
    broker = context(request).broker
    body = await read_body(request)
    # RabbitMQ checks the body's keys before it looks at the vhost or exchange.
    api_publish.require_keys(body)
    vhost = vhost_named(broker, request.match_info["vhost"])
    name = exchange_name(request.match_info["name"])
    caller(request).require_permission("write", vhost.name, name or DEFAULT_EXCHANGE_ALIAS)
    exchange = vhost.exchanges.get(name)
    if exchange is None:
        # RabbitMQ answers a publish to a missing exchange with 400, quoting the AMQP error.
        raise api_errors.bad_request(f"404 NOT_FOUND - no exchange '{name}' in vhost '{vhost.name}'")
    routing_key = body.get("routing_key")
    if not isinstance(routing_key, str):
        raise api_errors.bad_request("routing_key_not_present")
    payload = api_publish.decode_payload(body.get("payload"), str(body.get("payload_encoding", "string")))
    properties = api_publish.build_properties(as_table(body.get("properties")))
    routed = api_publish.publish(broker, vhost, exchange, routing_key, properties, payload)
    return json_reply({"routed": routed})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/exchanges", list_exchanges)
    router.add_get("/api/exchanges/{vhost}", list_exchanges)
    router.add_get("/api/exchanges/{vhost}/{name}", show_exchange)
    router.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    router.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    router.add_get("/api/exchanges/{vhost}/{name}/bindings/source", source_bindings)
    router.add_get("/api/exchanges/{vhost}/{name}/bindings/destination", destination_bindings)
    router.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
