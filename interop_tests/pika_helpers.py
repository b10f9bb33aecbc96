"""What the pika (BlockingConnection) interop tests share.

Connecting, pumping I/O until something has happened, filling and reading
queues, and turning a broker's channel or connection close into the
(reply_code, reply_text) a test compares. Test modules import the `connection`
fixture from here by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from interop_tests.broker_process import BrokerProcess

WAIT_S = 5.0


def connect_url(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def connect(broker: BrokerProcess, user: str = "guest", password: str = "guest",
            vhost: str = "/") -> pika.BlockingConnection:
    return connect_url(broker.url(user, password, vhost))


def connection_for_test(broker: BrokerProcess, user: str = "guest",
                        password: str = "guest") -> Iterator[pika.BlockingConnection]:
    """The body of a connection fixture: yields a connection, then closes it unless the test or broker did."""
    connection = connect(broker, user, password)
    yield connection
    if connection.is_open:
        connection.close()


def channel_for_test(broker: BrokerProcess, extension: str | None = None) -> Iterator[BlockingChannel]:
    """The body of a channel fixture: yields a channel on its own connection, then closes it.

    `extension` names this broker's own feature the test needs: against an external broker
    (INTEROP_BROKER_URL pointing at RabbitMQ) the test is skipped with that reason."""
    if extension is not None and broker.is_external:
        pytest.skip(extension)
    for connection in connection_for_test(broker):
        yield connection.channel()


def pump(channel: BlockingChannel, done: Callable[[], object], timeout: float = 8.0) -> None:
    """Process the channel's events until `done()`; fail the test after `timeout` seconds."""
    if not wait_until(channel.connection, done, timeout):
        pytest.fail(f"timed out after {timeout} s")


@pytest.fixture
def connection(broker: BrokerProcess) -> Iterator[pika.BlockingConnection]:
    """A guest connection to the broker for one test."""
    yield from connection_for_test(broker)


def wait_until(connections: pika.BlockingConnection | Sequence[pika.BlockingConnection],
               condition: Callable[[], object], timeout: float = WAIT_S) -> bool:
    """Pump the I/O of one or more connections until `condition()` holds; False if `timeout` passes first."""
    pumped = [connections] if isinstance(connections, pika.BlockingConnection) else list(connections)
    deadline = time.monotonic() + timeout
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for connection in pumped:
            connection.process_data_events(time_limit=min(0.05, remaining))
    return True


def numbered_bodies(count: int) -> list[bytes]:
    """b"m1" ... b"m<count>": bodies whose order a test can check."""
    return [f"m{index}".encode() for index in range(1, count + 1)]


def publish_confirmed(connection: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    """Publish `bodies` to `queue` through the default exchange; returns once the broker confirmed them all."""
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body)
    channel.close()


def filled_queue(channel: BlockingChannel, queue: str, bodies: list[bytes]) -> str:
    """Declare an exclusive queue holding `bodies`, all routed before returning."""
    channel.queue_declare(queue, exclusive=True)
    publish_confirmed(channel.connection, queue, bodies)
    return queue


def ready_count(channel: BlockingChannel, queue: str) -> int:
    """How many messages `queue` holds ready for delivery (passive queue.declare)."""
    return channel.queue_declare(queue, passive=True).method.message_count


def wait_ready(channel: BlockingChannel, queue: str, count: int, timeout: float = WAIT_S) -> int:
    """Poll until `queue` has `count` ready messages (or the deadline passes); return the last count.

    Requeues caused by reject, nack or a closing channel are asynchronous in
    RabbitMQ, so a count check right after them must allow a moment to settle.
    """
    deadline = time.monotonic() + timeout
    while True:
        ready = ready_count(channel, queue)
        if ready == count or time.monotonic() >= deadline:
            return ready
        channel.connection.process_data_events(time_limit=0.02)


def get_all(channel: BlockingChannel, queue: str) -> list[tuple[bytes, bool]]:
    """(body, redelivered) for every message ready in `queue`, in order, taken with auto-ack basic.get."""
    found = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return found
        found.append((body, method.redelivered))


def drain(channel: BlockingChannel, queue: str) -> list[bytes]:
    """The body of every message ready in `queue`, in order, taken with auto-ack basic.get."""
    return [body for body, _ in get_all(channel, queue)]


def assert_ready_messages(channel: BlockingChannel, queue: str, expected: list[tuple[bytes, bool]]) -> None:
    """The queue's ready messages are exactly `expected` as (body, redelivered), in order."""
    wait_ready(channel, queue, len(expected))
    assert get_all(channel, queue) == expected


def channel_error(operation: Callable[[], object]) -> tuple[int, str]:
    """Run `operation`, which must make the broker close the channel; return the close's code and text."""
    with pytest.raises(ChannelClosedByBroker) as error:
        operation()
    return error.value.reply_code, error.value.reply_text


def connection_error(operation: Callable[[], object]) -> tuple[int, str]:
    """Run `operation`, which must make the broker close the connection; return the close's code and text."""
    with pytest.raises(ConnectionClosedByBroker) as error:
        operation()
    return error.value.reply_code, error.value.reply_text
