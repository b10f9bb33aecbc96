"""Asking another node of the cluster for what only it holds, over its own management API.

Some figures live on one node only: the federation links it runs, the figures of the streams
its replica leads. Any node answers for them as that node does, by asking it with the caller's
own credentials (so the caller sees there exactly what it may see there) and the header
`LOCAL_ONLY`, which tells the node asked to answer from what it holds itself and ask no one
else in turn (no request goes round the cluster). A node that does not answer within
PEER_TIMEOUT_S is left out: the caller gets what this node knows, never a hang.

A web UI session (a cookie of this node's) is not valid on another node: its requests get no
answer from peers, and the callers fall back to what this node holds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

LOCAL_ONLY = "X-Amqp-Server-Local-Only"
PEER_TIMEOUT_S = 2.0


def asked_by_peer(request: web.Request) -> bool:
    """Is this request another node's (answer from what this node holds only)?"""
    return LOCAL_ONLY in request.headers


async def ask_peer(request: web.Request, address: str, path: str,
                   params: dict[str, str] | None = None) -> Any | None:
    """The JSON that node answers to GET `path` (with `params`), or None if it does not answer
    200 in time. `address` is its management API's host:port (its membership record's)."""
    headers = {"Authorization": request.headers["Authorization"]} if "Authorization" in request.headers else {}
    headers[LOCAL_ONLY] = "1"
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
