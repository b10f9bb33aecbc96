"""The firehose over real TCP: `ctl trace_on`, then pika sees publish.* and deliver.* copies.

The expected headers were read from RabbitMQ 3.10 running the same steps (rabbitmqctl
trace_on on a scratch vhost). Two known differences are left unasserted: RabbitMQ lists in
routed_queues names the default exchange routed to even when no such queue exists, and its
deliver.* copies still list BCC keys in routing_keys.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pika
import pytest

from amqp_server.ctl.main import main as ctl_main
from interop_tests.broker_process import BrokerProcess, free_port, launch

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")), reason="switches tracing through this project's management API"
)


class TracedBroker:
    def __init__(self, broker: BrokerProcess, management_port: int) -> None:
        self.broker = broker
        self.management_port = management_port

    def ctl(self, *args: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        assert ctl_main(["--port", str(self.management_port), *args], out=out, err=err) == 0, err.getvalue()
        return out.getvalue()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedBroker]:
    port = free_port()
    broker = launch(tmp_path_factory.mktemp("firehose"), extra_args=("--management-port", str(port), "--metrics-port", "0"))
    try:
        yield TracedBroker(broker, port)
    finally:
        broker.stop()


def drain(channel, queue: str) -> list[tuple[str, dict, bytes]]:
    taken = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return taken
        taken.append((method.routing_key, properties.headers, body))


def test_trace_on_copies_publishes_and_deliveries_to_the_trace_exchange(traced, unique):
    trace, work = unique("trace"), unique("work")
    assert traced.ctl("trace_on") == 'Starting tracing for vhost "/" ...\nTrace enabled for vhost /\n'
    try:
        connection = pika.BlockingConnection(pika.URLParameters(traced.broker.url()))
        channel = connection.channel()
        channel.queue_declare(trace, exclusive=True)
        channel.queue_bind(trace, "amq.rabbitmq.trace", "#")
        channel.queue_declare(work, auto_delete=True)
        properties = pika.BasicProperties(content_type="text/plain", delivery_mode=2, priority=3, headers={"k": "v"})
        channel.basic_publish("", work, b"hello", properties)

        received: list[bytes] = []

        def on_message(ch, method, _properties, body):
            received.append(body)
            ch.basic_ack(method.delivery_tag)

        tag = channel.basic_consume(work, on_message)
        while not received:
            connection.process_data_events(0.1)
        channel.basic_cancel(tag)

        traced_messages = drain(channel, trace)
        assert [key for key, _headers, _body in traced_messages] == ["publish.", f"deliver.{work}"]
        assert all(body == b"hello" for _key, _headers, body in traced_messages)
        published, delivered = traced_messages[0][1], traced_messages[1][1]
        original = {"content_type": "text/plain", "delivery_mode": 2, "priority": 3, "headers": {"k": "v"}}
        [connection_name] = traced.ctl("-s", "list_connections", "name").splitlines()  # ours is the only one
        assert published == {
            "exchange_name": "", "routing_keys": [work], "properties": original, "node": published["node"],
            "vhost": "/", "connection": connection_name, "channel": 1, "user": "guest", "routed_queues": [work],
        }
        assert published["node"].startswith("amqp-server@")
        assert delivered == {
            "exchange_name": "", "routing_keys": [work], "properties": original, "node": published["node"],
            "redelivered": 0, "vhost": "/", "connection": connection_name, "channel": 1, "user": "guest",
        }
    finally:
        traced.ctl("trace_off")

    # Off again: nothing more reaches the trace queue.
    channel.basic_publish("", work, b"untraced")
    assert drain(channel, trace) == []
    connection.close()


def test_tracing_is_off_by_default_and_shown_per_vhost(traced, unique):
    vhost = unique("fh-vhost")
    traced.ctl("add_vhost", vhost)
    traced.ctl("trace_on", "-p", vhost)
    rows = [line.split("\t") for line in traced.ctl("-s", "list_vhosts", "name", "tracing").splitlines()]
    assert ["/", "false"] in rows and [vhost, "true"] in rows
    traced.ctl("delete_vhost", vhost)
