"""What the federation interop tests share: brokers with their management API, upstreams and
policies set over HTTP, links waited for, and messages published with confirms and read back.

A `Site` is one broker (this project's, or a RabbitMQ node from rabbitmq_nodes.py) with its AMQP
URL and its management API; the tests federate one site's exchanges and queues from another's.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import requests

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, free_port, launch
from interop_tests.waiting import wait_until


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


@dataclass
class Site:
    """A broker reached by AMQP at `amqp_url` and by its management API at `api_url`."""

    amqp_url: str
    api_url: str
    broker: Any = None  # the BrokerProcess or RabbitNode, to kill or restart

    def request(self, method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(method, self.api_url + path, json=body, auth=("guest", "guest"), timeout=10)

    def get(self, path: str) -> Any:
        reply = self.request("GET", path)
        assert reply.status_code == 200, f"GET {path}: {reply.status_code} {reply.text}"
        return reply.json()

    def put(self, path: str, body: Any) -> None:
        reply = self.request("PUT", path, body)
        assert reply.status_code in (201, 204), f"PUT {path}: {reply.status_code} {reply.text}"

    def set_upstream(self, name: str, value: dict[str, Any], vhost: str = "/") -> None:
        self.put(f"/api/parameters/federation-upstream/{quote(vhost)}/{quote(name)}", {"value": value})

    def set_policy(self, name: str, pattern: str, definition: dict[str, Any], apply_to: str = "all",
                   vhost: str = "/") -> None:
        self.put(f"/api/policies/{quote(vhost)}/{quote(name)}",
                 {"pattern": pattern, "definition": definition, "apply-to": apply_to})

    def links(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return self.get("/api/federation-links" + (f"/{quote(vhost)}" if vhost else ""))

    def link(self, kind: str, name: str) -> dict[str, Any] | None:
        for link in self.links():
            if link["type"] == kind and link.get(kind) == name:
                return link
        return None

    def wait_running(self, kind: str, name: str, within: float = 30.0) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            link = self.link(kind, name)
            return link if link is not None and link["status"] == "running" else None
        return wait_until(running, f"the federation link of {kind} {name} running: {self.links()}", within)

    def connection(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.amqp_url))


def launch_site(workdir: Path, module: str = "amqp_server", extra_args: tuple[str, ...] = ()) -> Site:
    """This project's broker with its management API on a free port. Its node (and cluster)
    name is its own, `{directory name}-{port}@{host}`: brokers federating each other on one host
    must not share one, or each takes the other's messages for its own (loops.py)."""
    port = free_port()
    name = f"{workdir.name}-{port}@{socket.gethostname().split('.')[0]}"
    process: BrokerProcess = launch(workdir, TEST_CONFIG, ("--management-port", str(port), "--node-name", name,
                                                           *extra_args), module=module)
    return Site(process.url(), f"http://127.0.0.1:{port}", process)


def rabbit_site(node: Any) -> Site:
    """A RabbitMQ node of rabbitmq_nodes.start_rabbitmq as a Site."""
    return Site(node.amqp_url(), f"http://127.0.0.1:{node.management_port}", node)


def publish_confirmed(site: Site, exchange: str, routing_key: str, bodies: list[bytes],
                      headers: dict[str, Any] | None = None) -> None:
    """Publish each body with confirms; every one confirmed (ack) or the test fails."""
    connection = site.connection()
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish(exchange, routing_key, body,
                                  pika.BasicProperties(delivery_mode=2, headers=headers), mandatory=False)
    finally:
        connection.close()


def get_all(site: Site, queue: str, expected: int, within: float = 20.0) -> list[tuple[bytes, dict[str, Any]]]:
    """Read (ack) messages from `queue` until `expected` came or nothing more arrives in time."""
    got: list[tuple[bytes, dict[str, Any]]] = []
    connection = site.connection()
    try:
        channel = connection.channel()

        def more() -> bool:
            while True:
                method, properties, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                got.append((body, dict(properties.headers or {})))
            return len(got) >= expected

        wait_until(more, f"{expected} messages in {queue} (got {len(got)})", within, every=0.1)
    finally:
        connection.close()
    return got


def consume_messages(site: Site, queue: str, expected: int, within: float = 30.0, prefetch: int = 10
                     ) -> list[bytes]:
    """Consume `expected` messages from `queue` (manual acks); fails the test if they do not come."""
    got: list[bytes] = []
    connection = site.connection()
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)

        def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            got.append(body)
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(queue, on_message)
        wait_until(lambda: len(got) >= expected, f"{expected} messages consumed from {queue} (got {len(got)})",
                   within, pump=lambda seconds: connection.process_data_events(time_limit=seconds))
    finally:
        connection.close()
    return got


def declare(site: Site, *, exchange: str | None = None, exchange_type: str = "topic", queue: str | None = None,
            binding: str | None = None) -> None:
    connection = site.connection()
    try:
        channel = connection.channel()
        if exchange is not None:
            channel.exchange_declare(exchange, exchange_type, durable=True)
        if queue is not None:
            channel.queue_declare(queue, durable=True)
        if exchange is not None and queue is not None and binding is not None:
            channel.queue_bind(queue, exchange, binding)
    finally:
        connection.close()


def sites(tmp: Path, count: int) -> Iterator[Site]:
    for n in range(count):
        yield launch_site(tmp / f"site{n}")
