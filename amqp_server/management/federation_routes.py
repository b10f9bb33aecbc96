"""/api/federation-links: the federation links and their status, as rabbitmq_federation_management.

    GET    /api/federation-links                                   every link the caller may see
    GET    /api/federation-links/{vhost}                           ... of one vhost
    GET    /api/federation-links/state/down                        those neither starting nor running
    GET    /api/federation-links/{vhost}/state/down
    DELETE /api/federation-links/vhost/{vhost}/{id}/{node}/restart restart one link (204; 404 if none)

Reading needs the `monitoring` tag (or administrator), as RabbitMQ's is_authorized_monitor;
restarting needs administrator. A link is listed with RabbitMQ's fields (node, exchange or
queue, upstream_exchange or upstream_queue, type, vhost, upstream, id, status, error or
local_connection, uri, timestamp) and this broker's own: reconnects, next_attempt_in and the
message counters (amqp_server/federation/status.py). Without federation running (a broker
built without it, as in unit tests) the routes answer 404, as RabbitMQ without the plugin.

On a cluster each link runs on one node (federation.py); any node lists them all, as RabbitMQ
does: those it runs from itself, the others as the node that runs them answers (its own
/api/federation-links, asked as peer_api.py asks). A link no
node runs yet, or whose node does not answer, is listed `starting` with `node` its lease's
holder ("" for none).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.federation.federation import Federation, federation_of
from amqp_server.management import api_errors
from amqp_server.management.context import caller, context
from amqp_server.management.http_io import list_reply, no_content, vhost_named
from amqp_server.management.peer_api import ask_peers, asked_by_peer, path_segment

PREFIX = "/api/federation-links"
_UP = ("starting", "running")


def _federation(request: web.Request) -> Federation:
    federation = federation_of(context(request).broker)
    if federation is None:
        raise api_errors.not_found()
    return federation


async def _links(request: web.Request, down_only: bool) -> list[dict[str, Any]]:
    user = caller(request)
    if not user.is_monitor:
        raise api_errors.ApiError(401, "not_authorised", "Not monitor user")
    federation = _federation(request)
    name = request.match_info.get("vhost")
    if name is not None:
        vhost_named(context(request).broker, name)  # 404 if there is no such vhost
    links = federation.link_list(name)
    if not asked_by_peer(request):
        links += await _elsewhere(request, federation, name)
    if name is None:
        links = [link for link in links if user.may_see_vhost(link["vhost"])]
    if down_only:
        links = [link for link in links if link["status"] not in _UP]
    return links


def _by_vhost_and_name(item: dict[str, Any]) -> tuple[str, str, str]:
    return (item["vhost"], item.get("exchange") or item.get("queue") or "", item["upstream"])


async def _elsewhere(request: web.Request, federation: Federation, vhost: str | None) -> list[dict[str, Any]]:
    """The links other nodes of the cluster run, as they list them (see the module docstring)."""
    elsewhere = federation.elsewhere(vhost)
    if not elsewhere:
        return []
    path = PREFIX + (f"/{path_segment(vhost)}" if vhost is not None else "")
    # Their own links only: a node asked lists no other node's in turn.
    answers = await ask_peers(request, context(request).broker, {holder for _key, holder in elsewhere if holder},
                              path)
    by_id = {(node, item.get("id")): item for node, items in answers.items() if isinstance(items, list)
             for item in items if isinstance(item, dict)}
    listed = []
    for key, holder in elsewhere:
        item = by_id.get((holder or "", key.id))
        listed.append(item if item is not None else federation.waiting_json(key, holder))
    return listed


async def list_links(request: web.Request) -> web.Response:
    return list_reply(request, await _links(request, down_only=False), default_order=_by_vhost_and_name)


async def list_down_links(request: web.Request) -> web.Response:
    return list_reply(request, await _links(request, down_only=True), default_order=_by_vhost_and_name)


async def restart_link(request: web.Request) -> web.Response:
    user = caller(request)
    user.require_admin()
    federation = _federation(request)
    broker = context(request).broker
    vhost = vhost_named(broker, request.match_info["vhost"])
    if request.match_info["node"] != broker.node_name or not federation.restart(vhost.name, request.match_info["id"]):
        raise api_errors.not_found()
    return no_content()


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get(PREFIX, list_links)
    router.add_get(f"{PREFIX}/state/down", list_down_links)
    router.add_get(f"{PREFIX}/state/down/", list_down_links)
    router.add_get(PREFIX + "/{vhost}", list_links)
    router.add_get(PREFIX + "/{vhost}/state/down", list_down_links)
    router.add_delete(PREFIX + "/vhost/{vhost}/{id}/{node}/restart", restart_link)
