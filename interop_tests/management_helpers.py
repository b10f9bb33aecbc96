"""A broker with its management API, for tests that set policies and limits over HTTP.

Against this project's broker a module-wide broker is started with a management port. With
INTEROP_BROKER_URL pointing at RabbitMQ, its API is INTEROP_MANAGEMENT_URL (default
http://<broker host>:15672), so the same tests check RabbitMQ's behaviour. Whatever a test
sets is removed after it (`Management.cleanup`), so tests sharing a broker stay apart: each
uses its own names, and its policies match only them.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from interop_tests.broker_process import BrokerProcess, external_broker, free_port, launch


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class Management:
    """Blocking calls to one broker's management API, remembering what to undo."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        self.session.auth = ("guest", "guest")
        self._undo: list[str] = []

    def request(self, method: str, path: str, body: Any = None) -> requests.Response:
        try:
            return self.session.request(method, self.base_url + path, json=body, timeout=10)
        except requests.ConnectionError:
            # RabbitMQ's HTTP server closes a kept-alive connection now and then (after some
            # error replies); the pooled connection is gone, so the (idempotent) call goes
            # again on a new one.
            return self.session.request(method, self.base_url + path, json=body, timeout=10)

    def get(self, path: str) -> Any:
        reply = self.request("GET", path)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def put(self, path: str, body: Any) -> None:
        reply = self.request("PUT", path, body)
        assert reply.status_code in (201, 204), f"{reply.status_code} {reply.text}"
        self._undo.append(path)

    def set_policy(self, name: str, pattern: str, definition: dict[str, Any], priority: float = 0,
                   apply_to: str = "all", vhost: str = "/", operator: bool = False) -> None:
        kind = "operator-policies" if operator else "policies"
        self.put(f"/api/{kind}/{quote(vhost)}/{quote(name)}",
                 {"pattern": pattern, "definition": definition, "priority": priority, "apply-to": apply_to})

    def clear_policy(self, name: str, vhost: str = "/", operator: bool = False) -> None:
        kind = "operator-policies" if operator else "policies"
        reply = self.request("DELETE", f"/api/{kind}/{quote(vhost)}/{quote(name)}")
        assert reply.status_code == 204, reply.text

    def queue(self, name: str, vhost: str = "/") -> dict[str, Any]:
        return self.get(f"/api/queues/{quote(vhost)}/{quote(name)}")

    def add_vhost(self, name: str) -> None:
        """A vhost for this test, where guest has every permission; deleted afterwards."""
        self.put(f"/api/vhosts/{quote(name)}", {})
        self.put(f"/api/permissions/{quote(name)}/guest", {"configure": ".*", "write": ".*", "read": ".*"})

    def cleanup(self) -> None:
        """Undo every PUT of this test, the last first (a deleted vhost takes its contents along)."""
        for path in reversed(self._undo):
            self.request("DELETE", path)
        self._undo.clear()


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    """(broker, management base URL) for a test module; import it by name."""
    yield from management_broker(tmp_path_factory)


@pytest.fixture
def api(managed: tuple[BrokerProcess, str]) -> Iterator["Management"]:
    """The management API of `managed`, with what the test set undone after it."""
    yield from management_for_test(managed[1])


def management_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    """The body of a module fixture: (broker, management base URL)."""
    external = external_broker()
    if external is not None:
        yield external, os.environ.get("INTEROP_MANAGEMENT_URL", f"http://{external.host}:15672")
        return
    port = free_port()
    process = launch(tmp_path_factory.mktemp("managed"), extra_args=("--management-port", str(port)))
    try:
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def management_for_test(base_url: str) -> Iterator[Management]:
    api = Management(base_url)
    try:
        yield api
    finally:
        api.cleanup()
