"""No GET changes the broker: every GET route of the management API and of the Prometheus
endpoint, called as an administrator on a broker with objects of every kind, leaves the
definitions, the messages, the connections, the counters and the settings as they were.

A GET must be safe because a browser sends one for any <img> or link on any web page, with
the operator's cached credentials, and Host and Origin checks do not cover reads.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

from aiohttp import test_utils
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.broker.firehose import is_tracing
from amqp_server.management.definitions_transfer import export_definitions
from amqp_server.metrics.core_collector import channel_label
from amqp_server.metrics.http_endpoint import build_metrics_app
from amqp_server.federation.federation import Federation
from amqp_server.shovel.shovels import Shovels
from tests.frame_driver import opened_client
from tests.test_management_client import api, broker  # noqa: F401  (fixtures)
from tests.test_metrics_values import FIXED_PROCESS


def broker_state(broker: Broker) -> str:
    """Everything a GET could change, as one comparable text."""
    alarms = broker.alarms
    state: dict[str, Any] = {
        "definitions": export_definitions(broker),
        "queues": {f"{v.name}/{q.name}": [q.message_count, q.unacked_count, q.consumer_count, q.waiting_count]
                   for v in broker.vhosts.values() for q in v.queues.values()},
        "connections": sorted((c.name, str(c.state), sorted(c.channels)) for c in broker.connections),
        "stats": {name: getattr(broker.stats, name) for name in type(broker.stats).__slots__},
        "alarms": [alarms.memory_high_watermark, alarms.memory_high_watermark_bytes, alarms.disk_free_limit],
        "tracing": {v.name: is_tracing(v) for v in broker.vhosts.values()},
    }
    return json.dumps(state, sort_keys=True, default=str)


def populated(broker: Broker, api) -> tuple[Any, dict[str, str]]:
    """A queue with delivered and ready messages, an exchange, a binding, a consumer's connection;
    the values to put in each route's {placeholders}."""
    assert api.request("PUT", "/api/exchanges/%2F/audit-x", {"type": "direct", "durable": True}).status == 201
    assert api.request("PUT", "/api/queues/%2F/audit-q", {"durable": True}).status == 201
    assert api.request("POST", "/api/bindings/%2F/e/audit-x/q/audit-q", {"routing_key": "k"}).status == 201
    for kind in ("policies", "operator-policies"):
        policy = {"pattern": "^audit", "definition": {"max-length": 100}}
        assert api.request("PUT", f"/api/{kind}/%2F/audit-p", policy).status == 201
    assert api.request("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 100}).status == 204
    assert api.request("PUT", "/api/user-limits/guest/max-channels", {"value": 100}).status == 204
    # A shovel (recorded, not started: no GET may start, stop or change it).
    broker.parameters.register(Shovels(broker))
    shovel = {"src-uri": "amqp://", "src-queue": "audit-q", "dest-uri": "amqp://", "dest-queue": "audit-q2"}
    assert api.request("PUT", "/api/parameters/shovel/%2F/audit-s", {"value": shovel}).status == 201
    # Federation's components (as the runtime registers them): /api/federation-links answers.
    Federation(broker, None).register_components()
    for n in range(3):
        published = api.request("POST", "/api/exchanges/%2F/audit-x/publish",
                                {"routing_key": "k", "payload": f"m{n}", "payload_encoding": "string", "properties": {}})
        assert published.json() == {"routed": True}
    client = opened_client(broker)
    client.send(1, commands.Basic.Qos(prefetch_count=1))
    client.send(1, commands.Basic.Consume(queue="audit-q", consumer_tag="audit"))
    connection = next(iter(broker.connections))
    [binding] = [b for b in api.get("/api/bindings/%2F") if b["source"] == "audit-x"]
    return client, {
        "node": broker.node_name, "port": "5672", "protocol": "amqp", "within": "1", "unit": "days",
        "vhost": "%2F", "component": "shovel", "user": "guest",
        "source": "audit-x", "kind": "q", "destination": "audit-q", "props": binding["properties_key"],
        "connection": urllib.parse.quote(connection.name, safe=""),
        "channel": urllib.parse.quote(channel_label(connection.name, 1), safe=""),
        "path": "js/main.js",  # a web UI file
    }


def concrete(path: str, values: dict[str, str]) -> str:
    if path.startswith("/api/connections/{name}"):
        path = path.replace("{name}", values["connection"])
    elif path.startswith("/api/channels/{name}"):
        path = path.replace("{name}", values["channel"])
    elif path.startswith("/api/exchanges/"):
        path = path.replace("{name}", "audit-x")
    elif path.startswith("/api/queues/"):
        path = path.replace("{name}", "audit-q")
    elif path.startswith(("/api/policies/", "/api/operator-policies/")):
        path = path.replace("{name}", "audit-p")
    elif path.startswith(("/api/parameters/", "/api/shovels/")):
        path = path.replace("{name}", "audit-s")
    for key, value in values.items():
        path = path.replace("{" + key + "}", value)
    assert "{" not in path, path
    return path


def test_no_management_get_changes_the_broker(api, broker):
    client, values = populated(broker, api)
    before = broker_state(broker)
    answered = {}
    for route in api.app.router.routes():
        if route.method == "GET":
            path = concrete(route.resource.canonical, values)
            for query in ("", "?page=1&page_size=10&columns=name&sort=name"):
                answered[path + query] = api.request("GET", path + query).status
                assert broker_state(broker) == before, f"GET {path}{query} changed the broker"
    assert len(answered) >= 2 * 60, "every GET route was called"
    not_ok = {path: status for path, status in answered.items() if status != 200}
    # Only pagination on lists RabbitMQ does not page, and the single-object routes given a list query,
    # may answer otherwise; every route answered 200 without a query.
    assert all("?" in path for path in not_ok), not_ok
    assert client  # its consumer holds one message unacked throughout


def test_no_prometheus_scrape_changes_the_broker(api, broker):
    client, _values = populated(broker, api)
    before = broker_state(broker)
    app = build_metrics_app(broker, process_stats=lambda: FIXED_PROCESS)
    loop = asyncio.new_event_loop()
    scraper = test_utils.TestClient(test_utils.TestServer(app), loop=loop)
    loop.run_until_complete(scraper.start_server())
    try:
        for route in app.router.routes():
            if route.method == "GET":
                for query in ("", "?family=queue_coarse_metrics&family=exchange_bindings&vhost=/"):
                    async def scrape() -> int:
                        async with scraper.get(route.resource.canonical + query) as response:
                            await response.read()
                            return response.status
                    assert loop.run_until_complete(scrape()) == 200
                    assert broker_state(broker) == before, f"GET {route.resource.canonical}{query} changed the broker"
    finally:
        loop.run_until_complete(scraper.close())
        loop.close()
    assert client
