"""Asking another node of the cluster for what only it holds, over its own management API.

Some figures live on one node only: the federation links it runs, the figures of the streams
its replica leads. Any node answers for them as that node does, by asking it with the caller's
own credentials (so the caller sees there exactly what it may see there) and the header
`LOCAL_ONLY`, which tells the node asked to answer from what it holds itself and ask no one
else in turn (no request goes round the cluster). A node that does not answer within
PEER_TIMEOUT_S is left out: the caller gets what this node knows, never a hang.

A web UI session (a cookie of this node's) is not valid on another node, so a request that
came with one (no Authorization header) asks no peer at all: the callers fall back to what
this node holds, without a request per peer the peer could only refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from amqp_server.broker.broker import Broker

LOCAL_ONLY = "X-Amqp-Server-Local-Only"
PEER_TIMEOUT_S = 2.0


def asked_by_peer(request: web.Request) -> bool:
    """Is this request another node's (answer from what this node holds only)?"""
    return LOCAL_ONLY in request.headers


async def ask_peers(request: web.Request, broker: "Broker", nodes: Iterable[str], path: str,
                    params: dict[str, str] | None = None) -> dict[str, Any]:
    """What each of `nodes` answers to GET `path` (with `params`), all asked at once, by node;
    None for one that does not answer 200 in time. A node that is not live or has no
    management address is left out, and so is every node for a request a peer made (no
    request goes round the cluster) or one without credentials to pass on (a UI session)."""
    if asked_by_peer(request) or "Authorization" not in request.headers:
        return {}
    addresses = {node.name: node.management_address for node in broker.other_live_nodes() if node.management_address}
    asked = sorted(node for node in set(nodes) if node in addresses)
    answers = await asyncio.gather(*(_ask(request, addresses[node], path, params) for node in asked))
    return dict(zip(asked, answers))


async def _ask(request: web.Request, address: str, path: str, params: dict[str, str] | None) -> Any | None:
    """The JSON the node at `address` (its management API's host:port) answers, or None."""
    headers = {"Authorization": request.headers["Authorization"], LOCAL_ONLY: "1"}
    try:
        timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"http://{address}{path}", headers=headers, params=params) as reply:
                if reply.status != 200:
                    return None
                return await reply.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


def path_segment(value: str) -> str:
    """`value` as one segment of an API path (a vhost or a queue name may hold `/` or `%`)."""
    return value.replace("%", "%25").replace("/", "%2F")
