"""Broker nodes of one cluster for the interop tests: each on free loopback ports, with its own
data directory, management API and node name, all on one coordination service."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pika
import requests

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, free_port, launch

SESSION_TTL = 2
NODE_CONFIG = TEST_CONFIG + """
[cluster]
session_ttl = %d
""" % SESSION_TTL


@dataclass
class ClusterNode:
    name: str
    broker: BrokerProcess
    management_port: int

    def api(self, path: str) -> Any:
        """GET /api/<path> as guest; the decoded JSON."""
        reply = requests.get(f"http://127.0.0.1:{self.management_port}/api/{path}", auth=("guest", "guest"), timeout=10)
        reply.raise_for_status()
        return reply.json()

    def api_write(self, method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(method, f"http://127.0.0.1:{self.management_port}/api/{path}", json=body,
                                auth=("guest", "guest"), timeout=120)

    def queue_names(self, vhost: str = "/") -> set[str]:
        return {queue["name"] for queue in self.api("queues") if queue["vhost"] == vhost}

    def connect(self, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.broker.port, credentials=pika.PlainCredentials(user, password),
            connection_attempts=1, blocked_connection_timeout=30))


def start_node(directory: Path, url: str, name: str, config: str = NODE_CONFIG,
               extra_args: tuple[str, ...] = ()) -> ClusterNode:
    port = free_port()
    broker = launch(directory / name, config, extra_args=(
        "--management-port", str(port), "--cluster", url, "--node-name", name, *extra_args))
    return ClusterNode(name, broker, port)


def restart_node(node: ClusterNode) -> None:
    """Start the node's process again, with the same ports, data directory and name."""
    node.broker.start()


def wait_until(check: Callable[[], Any], what: str, within: float = 15.0) -> Any:
    """Poll `check` until it returns something true; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"still not true after {within} s: {what}"
        time.sleep(0.05)
