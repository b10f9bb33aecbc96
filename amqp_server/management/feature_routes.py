"""/api/feature-flags and /api/auth: what tools ask before they talk to a RabbitMQ node.

Feature flags are RabbitMQ 3.10's names for what the node can do; this broker lists only
those that describe it (enabled) plus the two management-agent flags RabbitMQ ships disabled,
so an upgrade checker sees no flag left to enable. /api/auth tells the web UI how to log in
(basic auth, no OAuth/UAA) and, as in RabbitMQ, needs no credentials.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from amqp_server.management.context import caller
from amqp_server.management.http_io import json_reply, list_reply

AUTH_PATH = "/api/auth"

# (name, description, doc_url, state, provided_by), RabbitMQ 3.10's texts.
_FLAGS = (
    ("drop_unroutable_metric", "Count unroutable publishes to be dropped in stats", "", "disabled",
     "rabbitmq_management_agent"),
    ("empty_basic_get_metric", "Count AMQP `basic.get` on empty queues in stats", "", "disabled",
     "rabbitmq_management_agent"),
    ("implicit_default_bindings", "Default bindings are now implicit, instead of being stored in the database", "",
     "enabled", "rabbit"),
    ("quorum_queue", "Support queues of type `quorum`", "https://www.rabbitmq.com/quorum-queues.html", "enabled",
     "rabbit"),
    ("virtual_host_metadata", "Virtual host metadata (description, tags, etc)", "", "enabled", "rabbit"),
)


def feature_flags_json() -> list[dict[str, Any]]:
    return [
        {"name": name, "desc": desc, "doc_url": doc_url, "state": state, "stability": "stable", "provided_by": by}
        for name, desc, doc_url, state, by in _FLAGS
    ]


async def feature_flags(request: web.Request) -> web.Response:
    caller(request).require_admin()
    return list_reply(request, feature_flags_json(), lambda flag: flag["name"])


async def auth(request: web.Request) -> web.Response:
    return json_reply({"enable_uaa": False, "uaa_client_id": "", "uaa_location": ""})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/api/feature-flags", feature_flags)
    router.add_get(AUTH_PATH, auth)
