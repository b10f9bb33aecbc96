"""What the kombu (py-amqp transport) interop tests share: the URL, a connection fixture and a
way to wait for deliveries."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest
from kombu import Connection

from interop_tests.broker_process import BrokerProcess

WAIT_S = 10.0


def kombu_url(broker: BrokerProcess, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
    return broker.url(user, password, vhost).replace("amqp://", "pyamqp://", 1)


@pytest.fixture
def connection(broker: BrokerProcess) -> Iterator[Connection]:
    """A connected guest kombu connection for one test."""
    conn = Connection(kombu_url(broker), connect_timeout=WAIT_S)
    conn.connect()
    try:
        yield conn
    finally:
        conn.release()


def drain_until(conn: Connection, done: Callable[[], object], timeout: float = WAIT_S) -> None:
    """Dispatch incoming deliveries until `done()` holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail("timed out waiting for deliveries")
        try:
            conn.drain_events(timeout=min(remaining, 0.2))
        except socket.timeout:
            pass
