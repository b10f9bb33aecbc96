"""A synchronous client for the management app in unit tests (no tests here).

`ManagementClient` serves `build_management_app` on its own event loop and makes blocking
requests, so a test can alternate AMQP frames (tests.frame_driver) and HTTP calls against
one in-process broker.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import test_utils

from amqp_server.broker.broker import Broker
from amqp_server.config.auth import hash_password
from amqp_server.config.settings import ManagementConfig, ServerConfig, UserConfig
from amqp_server.management.app import build_management_app
from tests.test_metrics_values import FIXED_PROCESS


class Reply:
    def __init__(self, status: int, headers: dict[str, str], text: str) -> None:
        self.status = status
        self.headers = headers
        self.text = text

    def json(self) -> Any:
        return json.loads(self.text)

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.text[:200]!r}>"


class ManagementClient:
    def __init__(self, broker: Broker, fixed_process_stats: bool = True, settings: ManagementConfig | None = None) -> None:
        """`fixed_process_stats=False` reads the real process figures and the broker's alarms;
        `settings` is the [management] configuration (defaults when None)."""
        self.broker = broker
        self.loop = asyncio.new_event_loop()
        app = build_management_app(broker, process_stats=(lambda: FIXED_PROCESS) if fixed_process_stats else None,
                                   sample_rates=False, listeners=[{"protocol": "amqp", "port": 5672}],
                                   settings=settings)
        self.app = app
        self.client = test_utils.TestClient(test_utils.TestServer(app), loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())

    def request(self, method: str, path: str, body: Any = None, user: str = "guest", password: str = "guest",
                headers: dict[str, str] | None = None, raw: bytes | None = None) -> Reply:
        async def call() -> Reply:
            data = raw if raw is not None else (json.dumps(body) if body is not None else None)
            sent = dict(headers or {})
            if data is not None:
                sent.setdefault("Content-Type", "application/json")  # as every real client of the API says
            if user:
                sent["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            async with self.client.request(method, path, data=data, headers=sent) as response:
                return Reply(response.status, dict(response.headers), await response.text())
        return self.loop.run_until_complete(call())

    def get(self, path: str, **options: Any) -> Any:
        reply = self.request("GET", path, **options)
        assert reply.status == 200, reply
        return reply.json()

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


def broker_with_users() -> Broker:
    """guest (administrator), mon (monitoring), mgmt (management, rights on "/" for "mgmt-*"
    only), plain (no tags), and vhosts "/" and "other"."""
    config = ServerConfig()
    config.users = [
        UserConfig("guest", hash_password("guest"), ["administrator"]),
        UserConfig("mon", hash_password("mon"), ["monitoring"]),
        UserConfig("mgmt", hash_password("mgmt"), ["management"]),
        UserConfig("plain", hash_password("plain"), []),
    ]
    config.vhosts = ["/", "other"]
    broker = Broker(config)
    broker.access.set_permissions("guest", "/", ".*", ".*", ".*")
    broker.access.set_permissions("guest", "other", ".*", ".*", ".*")
    broker.access.set_permissions("mgmt", "/", "^mgmt-", "^mgmt-|^amq\\.default$", "^mgmt-|^amq\\.")
    broker.access.set_permissions("plain", "/", ".*", ".*", ".*")
    return broker


@pytest.fixture
def broker() -> Broker:
    return broker_with_users()


@pytest.fixture
def api(broker: Broker) -> Iterator[ManagementClient]:
    client = ManagementClient(broker)
    yield client
    client.close()
