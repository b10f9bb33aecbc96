"""What the pika (BlockingConnection) interop tests share.

Connecting (the one `connect` of the pika tests), pumping I/O while a test waits,
filling and reading queues, and turning a broker's channel or connection close
into the (reply_code, reply_text) a test compares. Test modules import the
`connection` fixture from here by name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import AMQPError, ChannelClosedByBroker, ConnectionClosedByBroker

from interop_tests.broker_process import BrokerProcess, Reachable
from interop_tests.waiting import poll

WAIT_S = 5.0


def parameters(to: Reachable | str, user: str = "guest", password: str = "guest", vhost: str = "/", *,
               label: str | None = None, **settings: Any) -> pika.URLParameters:
    """pika's parameters for `to` (a broker, a cluster node, or an amqp:// URL, which then says
    the user and vhost) as `user` on `vhost`. `label` names the connection (the client property
    connection_name, which the management API and list_connections show); `settings` sets pika's
    other parameters by name: connection_attempts=1, heartbeat=0, blocked_connection_timeout=10,
    ssl_options=pika.SSLOptions(...), and so on."""
    chosen = pika.URLParameters(to if isinstance(to, str) else to.url(user, password, vhost))
    if label is not None:
        chosen.client_properties = {"connection_name": label}
    for name, value in settings.items():
        if not isinstance(getattr(type(chosen), name, None), property):
            raise TypeError(f"pika has no connection parameter {name!r}")
        setattr(chosen, name, value)
    return chosen


def connect(to: Reachable | str, user: str = "guest", password: str = "guest", vhost: str = "/", *,
            label: str | None = None, **settings: Any) -> pika.BlockingConnection:
    """A BlockingConnection to `to` with `parameters(to, user, password, vhost, label=..., **settings)`."""
    return pika.BlockingConnection(parameters(to, user, password, vhost, label=label, **settings))


def pumping(*connections: pika.BlockingConnection) -> Callable[[float], None]:
    """For waiting's `pump=`: runs the I/O (and so the callbacks) of every one of `connections`
    in turn while a test waits. (One connection's `process_data_events` does that alone.)"""
    def pump(seconds: float) -> None:
        for connection in connections:
            connection.process_data_events(time_limit=seconds)
    return pump


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


@pytest.fixture
def connection(broker: BrokerProcess) -> Iterator[pika.BlockingConnection]:
    """A guest connection to the broker for one test."""
    yield from connection_for_test(broker)


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
    if poll(lambda: ready_count(channel, queue) == count, timeout, every=0.02,
            pump=channel.connection.process_data_events):
        return count
    return ready_count(channel, queue)


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


def publish_across_failovers(hosts: list[pika.ConnectionParameters], stop: threading.Event,
                             publish_one: Callable[[BlockingChannel], None], pause_s: float = 0.0) -> None:
    """Until `stop` (a threading.Event) is set: connect to the first of `hosts` that answers, put
    a channel in confirm mode and call `publish_one(channel)` over and over (it publishes one
    message, and records it as confirmed after basic_publish returned: pika raises for a nack).
    A lost connection or channel connects again: what was in flight is neither confirmed nor
    published again by this loop."""
    while not stop.is_set():
        try:
            connection = pika.BlockingConnection(hosts)
        except (AMQPError, OSError):
            time.sleep(0.2)
            continue
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            while not stop.is_set():
                publish_one(channel)
                if pause_s:
                    time.sleep(pause_s)
        except (AMQPError, OSError):
            pass  # not confirmed: it may or may not be in the queue
        finally:
            try:
                connection.close()
            except (AMQPError, OSError):
                pass
