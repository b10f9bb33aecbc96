"""/api/shovels: the shovels' status and restarts, as RabbitMQ's rabbitmq_shovel_management.

    GET    /api/shovels                                  every shovel in a vhost the caller may enter
    GET    /api/shovels/{vhost}                          one vhost's (404 if it does not exist)
    GET    /api/shovels/vhost/{vhost}/{name}             [that shovel] (404 if none)
    DELETE /api/shovels/vhost/{vhost}/{name}             delete a dynamic shovel (its parameter)
    DELETE /api/shovels/vhost/{vhost}/{name}/restart     stop and start it again (204)

Each needs the monitoring tag (or administrator), as RabbitMQ's. A status is RabbitMQ's
`{"node", "timestamp", "name", "vhost", "type", "state", ...}` with `src_uri`, `dest_uri`,
`src_queue`... while running and `reason` once terminated, then this broker's `reconnects`,
`reconnect_delay`, `last_error`, `last_error_time` and message counts (amqp_server/shovel/).
The shovels themselves are the "shovel" runtime parameter component.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import json_reply, list_reply, no_content, vhost_named
from amqp_server.shovel.definition import COMPONENT
from amqp_server.shovel.shovels import Shovels


def _shovels(request: web.Request) -> Shovels:
    component = context(request).broker.parameters.component(COMPONENT)
    if not isinstance(component, Shovels):
        raise api_errors.not_found()  # as RabbitMQ without the shovel plugin
    return component


def _require_monitor(request: web.Request) -> None:
    if not caller(request).is_monitor:
        raise api_errors.ApiError(401, "not_authorised", "Not monitor user")


def _by_vhost_and_name(item: dict[str, Any]) -> tuple[str, str]:
    return (item["vhost"], item["name"])


async def list_shovels(request: web.Request) -> web.Response:
    _require_monitor(request)
    shovels = _shovels(request)
    user = caller(request)
    if "vhost" in request.match_info:
        vhost = vhost_named(context(request).broker, request.match_info["vhost"])
        items = shovels.statuses(vhost.name) if user.is_admin or user.may_see_vhost_contents(vhost.name) else []
    else:
        items = [item for item in shovels.statuses()
                 if user.is_admin or user.may_see_vhost_contents(item["vhost"])]
    return list_reply(request, items, default_order=_by_vhost_and_name)


def _addressed(request: web.Request) -> tuple[Shovels, str, str]:
    _require_monitor(request)
    shovels = _shovels(request)
    vhost = vhost_named(context(request).broker, request.match_info["vhost"]).name
    caller(request).require_vhost(vhost)
    name = request.match_info["name"]
    if not shovels.exists(vhost, name):
        raise api_errors.not_found()
    return shovels, vhost, name


async def show_shovel(request: web.Request) -> web.Response:
    shovels, vhost, name = _addressed(request)
    return json_reply([item for item in shovels.statuses(vhost) if item["name"] == name])


async def delete_shovel(request: web.Request) -> web.Response:
    shovels, vhost, name = _addressed(request)
    if shovels.is_static(vhost, name):
        raise api_errors.bad_request(f"shovel '{name}' in vhost '{vhost}' is static: it is defined in the "
                                     "configuration file")
    context(request).broker.parameters.unset(vhost, COMPONENT, name)
    return no_content()


async def restart_shovel(request: web.Request) -> web.Response:
    shovels, vhost, name = _addressed(request)
    if not await shovels.restart(vhost, name):
        raise api_errors.bad_request(f"shovel '{name}' in vhost '{vhost}' runs on another node of the cluster: "
                                     "restart it there")
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/shovels", list_shovels)
    router.add_get("/api/shovels/{vhost}", list_shovels)
    router.add_get("/api/shovels/vhost/{vhost}/{name}", show_shovel)
    router.add_delete("/api/shovels/vhost/{vhost}/{name}", delete_shovel)
    router.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", restart_shovel)
