"""This broker's own routes for the resource alarms, under /api/amqp-server/.

RabbitMQ's management API cannot change the memory high watermark or the free-disk limit
(rabbitmqctl does it over Erlang distribution), so these routes are ours; `amqp-server ctl
set_vm_memory_high_watermark` and `set_disk_free_limit` use them. As in RabbitMQ, a change
takes effect at once (the alarms are re-evaluated before the reply) and is not kept across a
restart: the `[limits]` configuration applies again.

- GET /api/amqp-server/alarms (monitoring): the alarms in effect, memory used, free disk and
  both limits, as the alarms measured them last.
- PUT /api/amqp-server/vm-memory-high-watermark (administrator): `{"relative": 0.4}` (a
  fraction of total memory, 0 to 1) or `{"absolute": 1073741824}` (bytes, or a string with
  RabbitMQ's units such as "1GiB").
- PUT /api/amqp-server/disk-free-limit (administrator): `{"absolute": 50000000}` (bytes or
  "50MB") or `{"relative": 1.5}` (times total memory, rabbitmqctl's `mem_relative`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from aiohttp import web

from amqp_server.config.settings import ConfigError, parse_byte_size
from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import item_reply, no_content, read_body

if TYPE_CHECKING:
    from amqp_server.broker.alarms import ResourceAlarms

PREFIX = "/api/amqp-server"


def alarms_json(alarms: "ResourceAlarms", node: str) -> dict[str, Any]:
    if alarms.memory_high_watermark_bytes is not None:
        watermark: dict[str, Any] = {"absolute": alarms.memory_high_watermark_bytes}
    else:
        watermark = {"relative": alarms.memory_high_watermark}
    return {
        "node": node,
        "alarms": [{"node": node, "resource": resource} for resource in sorted(alarms.active)],
        "memory_alarm": alarms.memory_alarm,
        "memory_used": alarms.memory_used,
        "memory_limit": alarms.memory_limit,
        "vm_memory_high_watermark": watermark,
        "total_memory": alarms.total_memory,
        "disk_alarm": alarms.disk_alarm,
        "disk_free": alarms.disk_free,
        "disk_free_limit": alarms.disk_free_limit,
        "measured": alarms.measured,
    }


def _one_setting(body: dict[str, Any], keys: tuple[str, str]) -> tuple[str, Any]:
    given = [key for key in keys if key in body]
    if len(given) != 1:
        raise api_errors.bad_request(f"give one of {keys[0]!r} or {keys[1]!r}")
    return given[0], body[given[0]]


def _number(value: Any, what: str, high: float | None) -> float:
    """A non-negative number, also sent as a string ("0.5") as rabbitmqadmin-style tools do."""
    number = None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None or not math.isfinite(number) or number < 0 or (high is not None and number > high):
        bound = f"between 0.0 and {high}" if high is not None else "0 or more"
        raise api_errors.bad_request(f"{what} must be a number {bound}, got {value!r}")
    return number


def _bytes(value: Any, what: str) -> int:
    try:
        return parse_byte_size(value, what)
    except ConfigError as error:
        raise api_errors.bad_request(str(error)) from None


async def show_alarms(request: web.Request) -> web.Response:
    if not caller(request).is_monitor:
        raise api_errors.ApiError(401, "not_authorised", "Not monitor user")
    broker = context(request).broker
    return item_reply(request, alarms_json(broker.alarms, broker.node_name))


async def set_memory_high_watermark(request: web.Request) -> web.Response:
    caller(request).require_admin()
    key, value = _one_setting(await read_body(request), ("relative", "absolute"))
    alarms = context(request).broker.alarms
    if key == "relative":
        alarms.set_memory_high_watermark(fraction=_number(value, "relative", high=1.0))
    else:
        alarms.set_memory_high_watermark(absolute=_bytes(value, "absolute"))
    return no_content()


async def set_disk_free_limit(request: web.Request) -> web.Response:
    caller(request).require_admin()
    key, value = _one_setting(await read_body(request), ("absolute", "relative"))
    alarms = context(request).broker.alarms
    if key == "relative":
        alarms.set_disk_free_limit(int(alarms.total_memory * _number(value, "relative", high=None)))
    else:
        alarms.set_disk_free_limit(_bytes(value, "absolute"))
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(f"{PREFIX}/alarms", show_alarms)
    router.add_put(f"{PREFIX}/vm-memory-high-watermark", set_memory_high_watermark)
    router.add_put(f"{PREFIX}/disk-free-limit", set_disk_free_limit)
