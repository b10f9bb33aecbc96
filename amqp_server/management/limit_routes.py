"""/api/vhost-limits and /api/user-limits: RabbitMQ's per-vhost and per-user limits.

GET lists `{"vhost", "value"}` (`{"user", "value"}`) for those that have limits (any management
user may read them, as in RabbitMQ); PUT `.../{name}` with `{"value": N}` sets one limit,
DELETE `.../{name}` lifts it (administrators only). resource_limits.py enforces them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import list_reply, no_content, read_body, vhost_for_write, vhost_named
from amqp_server.management.policy_routes import validation_failed
from amqp_server.config.limit_definitions import USER_LIMITS, VHOST_LIMITS, LimitError, check_limits, updated


def _by_vhost(item: dict[str, Any]) -> tuple[Any]:
    return (item.get("vhost", ""),)


def _by_user(item: dict[str, Any]) -> tuple[Any]:
    return (item.get("user", ""),)


async def list_vhost_limits(request: web.Request) -> web.Response:
    user, broker = caller(request), context(request).broker
    if "vhost" in request.match_info:
        vhosts = [vhost_named(broker, request.match_info["vhost"])]
    else:
        vhosts = list(broker.vhosts.values())
    items = [
        {"vhost": vhost.name, "value": vhost.limits.as_value()}
        for vhost in vhosts
        if vhost.limits.as_value() and user.may_see_vhost(vhost.name)
    ]
    return list_reply(request, items, default_order=_by_vhost)


async def put_vhost_limit(request: web.Request) -> web.Response:
    caller(request).require_admin()
    vhost = vhost_for_write(context(request).broker, request.match_info["vhost"])
    value = await _limit_value(request)
    try:
        limits = check_limits(updated(vhost.limits.as_value(), request.match_info["name"], value), VHOST_LIMITS, "limits")
    except LimitError as error:
        raise validation_failed(error) from None  # a vhost limit is a runtime parameter in RabbitMQ
    vhost.set_limits(limits)
    return no_content()


async def delete_vhost_limit(request: web.Request) -> web.Response:
    caller(request).require_admin()
    vhost = vhost_named(context(request).broker, request.match_info["vhost"])
    vhost.set_limits(updated(vhost.limits.as_value(), request.match_info["name"], None))
    return no_content()


async def list_user_limits(request: web.Request) -> web.Response:
    """Any management user may read them, as in RabbitMQ."""
    broker = context(request).broker
    limits = broker.user_limits()
    if "user" in request.match_info:
        name = request.match_info["user"]
        if broker.access.user(name) is None:
            raise api_errors.not_found()
        limits = {name: limits[name]} if name in limits else {}
    items = [{"user": name, "value": value} for name, value in limits.items()]
    return list_reply(request, items, default_order=_by_user)


async def put_user_limit(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    name = _existing_user(request)
    value = await _limit_value(request)
    try:
        limits = check_limits(updated(broker.limits_of(name).as_value(), request.match_info["name"], value),
                              USER_LIMITS, "user-limits")
    except LimitError as error:
        # A user's limits are not a runtime parameter: RabbitMQ answers the bare text.
        raise api_errors.bad_request(str(error)) from None
    broker.set_user_limits(name, limits)
    return no_content()


async def delete_user_limit(request: web.Request) -> web.Response:
    caller(request).require_admin()
    broker = context(request).broker
    name = _existing_user(request)
    broker.set_user_limits(name, updated(broker.limits_of(name).as_value(), request.match_info["name"], None))
    return no_content()


def _existing_user(request: web.Request) -> str:
    name = request.match_info["user"]
    if context(request).broker.access.user(name) is None:
        raise api_errors.not_found()
    return name


async def _limit_value(request: web.Request) -> Any:
    """The body's "value", as sent: RabbitMQ takes a number only (rabbitmqadmin sends one)."""
    body = await read_body(request)
    if "value" not in body:
        raise api_errors.bad_request("[{key_missing,value}]")
    return body["value"]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/vhost-limits", list_vhost_limits)
    router.add_get("/api/vhost-limits/{vhost}", list_vhost_limits)
    router.add_put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    router.add_delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
    router.add_get("/api/user-limits", list_user_limits)
    router.add_get("/api/user-limits/{user}", list_user_limits)
    router.add_put("/api/user-limits/{user}/{name}", put_user_limit)
    router.add_delete("/api/user-limits/{user}/{name}", delete_user_limit)
