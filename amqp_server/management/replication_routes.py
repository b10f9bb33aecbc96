"""This broker's routes for a replicated (quorum) queue's group: what `amqp-server ctl
add_member`, `delete_member` and `transfer_leadership` call (RabbitMQ does these through
`rabbitmq-queues`, which has no HTTP API). Administrators only.

    POST   /api/amqp-server/queues/{vhost}/{name}/members          {"node": n}   add a member
    DELETE /api/amqp-server/queues/{vhost}/{name}/members/{node}                 remove one
    POST   /api/amqp-server/queues/{vhost}/{name}/leader           {"node": n}   move leadership

A queue that is not replicated gets 400 with rabbitmq-queues' text ("Cannot add members to a
classic queue"); a change the group refuses, 400 with the reason; the coordination service out
of reach, 503. The change is in the group record when the answer comes; the leader applies it
at its next look at the record (100 ms).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from amqp_server.broker.cluster_interface import ClusterChangeRefused, CoordinationOutOfReach
from amqp_server.management import api_errors
from amqp_server.management.alarm_routes import PREFIX
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import no_content, read_body, visible_vhost
from queues.arguments.queue_type_rules import QUORUM, STREAM

if TYPE_CHECKING:
    from amqp_server.broker.cluster_interface import ReplicatedQueues

QUEUE_PATH = PREFIX + "/queues/{vhost}/{name}"
_CLASSIC_REFUSALS = {
    "add": "Cannot add members to a classic queue",
    "delete": "Cannot delete members from a classic queue",
    "transfer": "Cannot transfer leadership of a classic queue",
}


def _group_of(request: web.Request, action: str) -> tuple["ReplicatedQueues", str, str]:
    caller(request).require_admin()
    vhost = visible_vhost(request)
    name = request.match_info["name"]
    queue = vhost.queues.get(name)
    if queue is None:
        raise api_errors.no_such("queue", name, vhost.name)
    replicated = context(request).broker.replicated
    if replicated is None or not queue.durable or queue.settings.queue_type not in (QUORUM, STREAM):
        raise api_errors.bad_request(_CLASSIC_REFUSALS[action])
    return replicated, vhost.name, name


async def _node_in_body(request: web.Request) -> str:
    node = (await read_body(request)).get("node")
    if not isinstance(node, str) or not node:
        raise api_errors.bad_request("give the node's name as \"node\"")
    return node


async def _apply(change: Callable[[], Awaitable[None]]) -> web.Response:
    try:
        await change()
    except ClusterChangeRefused as refusal:
        raise api_errors.bad_request(str(refusal)) from None
    except CoordinationOutOfReach as error:
        raise api_errors.ApiError(503, "service_unavailable", f"the cluster's coordination service is out of "
                                                              f"reach: {error}") from None
    return no_content()


async def add_member(request: web.Request) -> web.Response:
    replicated, vhost, name = _group_of(request, "add")
    node = await _node_in_body(request)
    return await _apply(lambda: replicated.add_member(vhost, name, node))


async def delete_member(request: web.Request) -> web.Response:
    replicated, vhost, name = _group_of(request, "delete")
    node = request.match_info["node"]
    return await _apply(lambda: replicated.delete_member(vhost, name, node))


async def transfer_leadership(request: web.Request) -> web.Response:
    replicated, vhost, name = _group_of(request, "transfer")
    node = await _node_in_body(request)
    return await _apply(lambda: replicated.transfer_leadership(vhost, name, node))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(QUEUE_PATH + "/members", add_member)
    router.add_delete(QUEUE_PATH + "/members/{node}", delete_member)
    router.add_post(QUEUE_PATH + "/leader", transfer_leadership)
