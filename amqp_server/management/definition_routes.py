"""/api/definitions: export (GET) and import (POST), whole broker or one vhost (administrator only)."""

from __future__ import annotations

from aiohttp import web

from amqp_server.management.context import caller, context
from amqp_server.management.definitions_import import import_definitions
from amqp_server.management.definitions_transfer import export_definitions, export_vhost_definitions
from amqp_server.management.http_io import json_reply, no_content, read_body, vhost_for_write
from amqp_server.management.request_guard import declares_json, unsupported_media_type


async def get_definitions(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    if "vhost" in request.match_info:
        return json_reply(export_vhost_definitions(broker, vhost_for_write(broker, request.match_info["vhost"], status=400)))
    return json_reply(export_definitions(broker))


async def post_definitions(request: web.Request) -> web.Response:
    """An import must say it is JSON even without a body (RabbitMQ's 415 comes after the
    administrator check and before the vhost's 404). 204 when everything was applied, as
    RabbitMQ answers; 200 with {"not_applied": [...]} naming what this broker cannot honour."""
    caller(request).require_admin()
    if not declares_json(request):
        return unsupported_media_type()
    broker = context(request).broker
    only_vhost = None
    if "vhost" in request.match_info:
        only_vhost = vhost_for_write(broker, request.match_info["vhost"]).name
    not_applied = import_definitions(broker, await read_body(request), only_vhost)
    if not_applied:
        return json_reply({"not_applied": not_applied})
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/definitions", get_definitions)
    router.add_post("/api/definitions", post_definitions)
    router.add_get("/api/definitions/{vhost}", get_definitions)
    router.add_post("/api/definitions/{vhost}", post_definitions)
