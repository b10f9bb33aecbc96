"""What the broker's log says about a client: one line when its connection opens (user, vhost,
client address and product), one per error sent to it, one when it closes; nothing per
message; and --log-level decides what is written."""

from __future__ import annotations

import re

import pika
import pytest

from interop_tests.broker_process import BrokerProcess
from interop_tests.waiting import wait_until

MESSAGES = 500


def new_lines(broker: BrokerProcess, before: str) -> list[str]:
    return broker.log_text()[len(before):].splitlines()


def one_client_session(broker: BrokerProcess) -> None:
    """Connect, publish and consume MESSAGES messages, cause one channel error, close."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url()))
    channel = connection.channel()
    channel.queue_declare("logged")
    for n in range(MESSAGES):
        channel.basic_publish("", "logged", b"m%d" % n)
    for _ in range(MESSAGES):
        method, _properties, _body = channel.basic_get("logged", auto_ack=False)
        channel.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.queue_declare("no-such-queue", passive=True)
    connection.close()


def wait_for_line(broker: BrokerProcess, before: str, text: str) -> None:
    """The close line is written when the broker handles the close, just after the client returns."""
    wait_until(lambda: any(text in line for line in new_lines(broker, before)), f"a log line containing {text!r}",
               10, every=0.02)


def test_a_connection_gets_an_open_line_an_error_line_and_a_close_line_and_no_line_per_message(broker_factory):
    broker = broker_factory()
    before = broker.log_text()
    one_client_session(broker)
    wait_for_line(broker, before, "client requested close")

    # The broker names a connection as RabbitMQ does: "client address:port -> server address:port".
    names = set(re.findall(r"127\.0\.0\.1:\d+ -> 127\.0\.0\.1:\d+", "\n".join(new_lines(broker, before))))
    assert len(names) == 1, names
    name = names.pop()
    lines = [line for line in new_lines(broker, before) if name in line]
    assert len(lines) == 3, lines  # not one per message: MESSAGES were published, fetched and acked
    opened, error, closed = lines
    assert "INFO" in opened and "user 'guest'" in opened and "vhost '/'" in opened
    assert "Pika Python Client Library" in opened
    assert "WARNING" in error and "NOT_FOUND - no queue 'no-such-queue' in vhost '/'" in error
    assert "INFO" in closed and "closing AMQP connection" in closed and "client requested close" in closed


def test_log_level_warning_keeps_errors_and_drops_connection_lines(broker_factory):
    broker = broker_factory(extra_args=("--log-level", "warning"))
    before = broker.log_text()
    one_client_session(broker)
    wait_for_line(broker, before, "NOT_FOUND")
    connection_lines = [line for line in new_lines(broker, before) if " -> 127.0.0.1:" in line]
    assert len(connection_lines) == 1 and "NOT_FOUND - no queue 'no-such-queue'" in connection_lines[0], connection_lines
