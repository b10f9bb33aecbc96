"""/api/overview, /api/nodes, /api/whoami, health checks, and the always-empty lists.

The empty lists (global parameters, topic permissions...) exist so that tools which read them as part
of a routine (rabbitmqadmin list policies, monitoring agents) get RabbitMQ's answer for a
broker that has none, instead of a 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from aiohttp import web

from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import as_int, item_reply, json_reply, list_reply, vhost_named
from amqp_server.management.node_json import node_json, overview_json, remote_node_json
from amqp_server.management.rates import SampleWindow

EMPTY_LISTS = ("/api/global-parameters", "/api/topic-permissions", "/api/extensions")
# Not here: /api/parameters (parameter_routes.py).


async def overview(request: web.Request) -> web.Response:
    return item_reply(request, overview_json(context(request), caller(request), _sample_window(request, "msg_rates"),
                                             _sample_window(request, "lengths")))


def _sample_window(request: web.Request, prefix: str) -> SampleWindow | None:
    """RabbitMQ's `{prefix}_age` and `{prefix}_incr` (seconds) query parameters; None without them."""
    age, incr = request.query.get(f"{prefix}_age"), request.query.get(f"{prefix}_incr")
    if age is None and incr is None:
        return None
    window = SampleWindow(as_int(age, 0), as_int(incr, 0))
    if window.age <= 0 or window.incr <= 0:
        raise api_errors.bad_request(f"{prefix}_age and {prefix}_incr must be positive whole seconds")
    return window


async def nodes(request: web.Request) -> web.Response:
    if not caller(request).is_monitor:
        raise api_errors.ApiError(401, "not_authorised", "Not monitor user")
    ctx = context(request)
    others = [remote_node_json(node) for node in ctx.broker.other_live_nodes()]
    return list_reply(request, [node_json(ctx), *others])


async def node(request: web.Request) -> web.Response:
    if not caller(request).is_monitor:
        raise api_errors.ApiError(401, "not_authorised", "Not monitor user")
    ctx = context(request)
    name = request.match_info["node"]
    if name == ctx.broker.node_name:
        return item_reply(request, node_json(ctx))
    for other in ctx.broker.other_live_nodes():
        if other.name == name:
            return item_reply(request, remote_node_json(other))
    raise api_errors.not_found()


async def whoami(request: web.Request) -> web.Response:
    user = caller(request)
    return json_reply({"name": user.name, "tags": user.tags})


async def cluster_name(request: web.Request) -> web.Response:
    return json_reply({"name": context(request).broker.cluster_name})


async def empty_list(request: web.Request) -> web.Response:
    return json_reply([])


def _failed(reason: str, **details: Any) -> web.Response:
    return json_reply({"status": "failed", "reason": reason, **details}, status=503)


def _alarms_check(where: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The broker's own resource alarms (the ones that block publishers), in RabbitMQ's shape:
    503 {"status": "failed", "reason": ..., "alarms": [{"node", "resource"}]} while any is in effect."""
    async def check(request: web.Request) -> web.Response:
        broker = context(request).broker
        alarms = broker.alarms
        in_effect = [resource for resource, on in (("disk", alarms.disk_alarm), ("memory", alarms.memory_alarm)) if on]
        if in_effect:
            return _failed(f"There are alarms in effect {where}",
                           alarms=[{"node": broker.node_name, "resource": resource} for resource in in_effect])
        return json_reply({"status": "ok"})
    return check


async def ok_check(request: web.Request) -> web.Response:
    return json_reply({"status": "ok"})


async def single_node_check(request: web.Request) -> web.Response:
    """Quorum and mirror-sync criticality: never critical on a single node, as RabbitMQ says."""
    return json_reply({"status": "ok", "reason": "single node cluster"})


# What RabbitMQ accepts for AMQP 0-9-1 in the protocol-listener check (it answers "amqp").
_AMQP_PROTOCOL_NAMES = {"amqp", "amqp091", "amqp0-9-1", "amqp0.9.1"}


async def protocol_listener_check(request: web.Request) -> web.Response:
    asked = request.match_info["protocol"].lower()
    protocol = "amqp" if asked in _AMQP_PROTOCOL_NAMES else asked
    protocols = [listener["protocol"] for listener in context(request).listeners]
    if protocol in protocols:
        return json_reply({"status": "ok", "protocol": protocol})
    return _failed("No active listener", missing=protocol, protocols=protocols)


async def certificate_expiration_check(request: web.Request) -> web.Response:
    """Fails when the TLS listeners' certificate expires within the period (ok without TLS)."""
    within, unit = request.match_info["within"], request.match_info["unit"]
    if not within.isdigit():
        raise api_errors.bad_request("Invalid expiration value.")
    if unit not in _EXPIRY_UNIT_DAYS:
        raise api_errors.bad_request(f"Invalid unit: {unit}")
    tls = context(request).tls
    if tls is None:
        return json_reply({"status": "ok"})
    horizon = datetime.now(timezone.utc) + timedelta(days=int(within) * _EXPIRY_UNIT_DAYS[unit])
    not_after = tls.certificate_not_after()
    if not_after > horizon:
        return json_reply({"status": "ok"})
    expired = [{"certfile": str(tls.settings.certfile), "expires": not_after.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "protocol": listener["protocol"], "port": listener["port"]}
               for listener in context(request).listeners if listener["protocol"] in _TLS_PROTOCOLS]
    return _failed("Certificates expiring", expired=expired)


# RabbitMQ counts a month as 30 days and a year as 365.
_EXPIRY_UNIT_DAYS = {"days": 1, "weeks": 7, "months": 30, "years": 365}
_TLS_PROTOCOLS = ("amqp/ssl", "https", "https/prometheus")


async def port_listener_check(request: web.Request) -> web.Response:
    port = request.match_info["port"]
    ports = [listener["port"] for listener in context(request).listeners]
    if not port.isdigit():
        raise api_errors.bad_request(f"Invalid port: {port}")
    if int(port) in ports:
        return json_reply({"status": "ok", "port": int(port)})
    return _failed("No active listener", missing=int(port), ports=ports)


ALIVENESS_QUEUE = "aliveness-test"


async def aliveness(request: web.Request) -> web.Response:
    """RabbitMQ declares, publishes to and gets from a queue "aliveness-test"; the caller needs
    the permissions for that, and is told in RabbitMQ's words when they are missing."""
    vhost = vhost_named(context(request).broker, request.match_info["vhost"]).name
    user = caller(request)
    if not user.access.can_access_vhost(user.user, vhost):
        raise api_errors.vhost_not_authorised()
    for kind in ("configure", "write", "read"):
        if not user.access.is_permitted(user.user, vhost, kind, ALIVENESS_QUEUE):
            raise api_errors.ApiError(
                401, "not_authorised",
                f"ACCESS_REFUSED - access to queue '{ALIVENESS_QUEUE}' in vhost '{vhost}' refused for user '{user.name}'",
            )
    return json_reply({"status": "ok"})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/overview", overview)
    router.add_get("/api/nodes", nodes)
    router.add_get("/api/nodes/{node}", node)
    router.add_get("/api/whoami", whoami)
    router.add_get("/api/cluster-name", cluster_name)
    router.add_get("/api/health/checks/alarms", _alarms_check("in the cluster"))
    router.add_get("/api/health/checks/local-alarms", _alarms_check("on the node"))
    router.add_get("/api/health/checks/port-listener/{port}", port_listener_check)
    router.add_get("/api/health/checks/protocol-listener/{protocol}", protocol_listener_check)
    router.add_get("/api/health/checks/certificate-expiration/{within}/{unit}", certificate_expiration_check)
    router.add_get("/api/health/checks/virtual-hosts", ok_check)
    router.add_get("/api/healthchecks/node", ok_check)  # the pre-3.8 check that older deployments still call
    for check in ("node-is-quorum-critical", "node-is-mirror-sync-critical"):
        router.add_get(f"/api/health/checks/{check}", single_node_check)
    router.add_get("/api/aliveness-test/{vhost}", aliveness)
    for path in EMPTY_LISTS:
        router.add_get(path, empty_list)
