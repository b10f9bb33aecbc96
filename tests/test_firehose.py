"""The firehose: with tracing on, publishes and deliveries are copied to amq.rabbitmq.trace."""

from __future__ import annotations

from pamqp import commands
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from amqp_server.broker.firehose import is_tracing, set_tracing
from tests.frame_driver import bodies, opened_client


def traced_broker() -> tuple[Broker, object]:
    """A broker with tracing on for "/" and a queue "trace" bound to the trace exchange with '#'."""
    broker = Broker()
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="trace"))
    client.call(1, commands.Queue.Bind(queue="trace", exchange="amq.rabbitmq.trace", routing_key="#"))
    set_tracing(broker.vhosts["/"], True, broker.node_name)
    return broker, client


def drain(client, queue: str) -> list[tuple[str, dict, bytes]]:
    """Every message in `queue` as (routing key, headers, body), via basic.get."""
    taken = []
    while True:
        received = client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
        method = received[0][1]
        if isinstance(method, commands.Basic.GetEmpty):
            return taken
        header = next(frame for _channel, frame in received if isinstance(frame, ContentHeader))
        taken.append((method.routing_key, header.properties.headers, bodies(received)[0]))


def test_publish_is_traced_with_rabbitmq_headers():
    broker, client = traced_broker()
    client.call(1, commands.Queue.Declare(queue="work"))
    properties = commands.Basic.Properties(content_type="text/plain", delivery_mode=2, headers={"k": "v"})
    client.publish(1, b"hello", routing_key="work", properties=properties)

    [(key, headers, body)] = drain(client, "trace")
    assert key == "publish."  # the default exchange's name is ""
    assert body == b"hello"
    assert headers["exchange_name"] == ""
    assert headers["routing_keys"] == ["work"]
    assert headers["properties"] == {"content_type": "text/plain", "headers": {"k": "v"}, "delivery_mode": 2}
    assert headers["node"] == broker.node_name
    assert headers["vhost"] == "/"
    assert headers["channel"] == 1
    assert headers["user"] == "guest"
    assert headers["connection"] == client.connection.name
    assert headers["routed_queues"] == ["work"]


def test_delivery_is_traced_with_queue_and_redelivered_flag():
    _broker, client = traced_broker()
    client.call(1, commands.Queue.Declare(queue="work"))
    client.send(1, commands.Basic.Consume(queue="work", consumer_tag="c"))
    client.publish(1, b"m", routing_key="work")
    client.send(1, commands.Basic.Reject(delivery_tag=1, requeue=True))  # comes back redelivered

    traced = drain(client, "trace")
    assert [key for key, _headers, _body in traced] == ["publish.", "deliver.work", "deliver.work"]
    assert [headers["redelivered"] for _key, headers, _body in traced[1:]] == [0, 1]
    assert all(body == b"m" for _key, _headers, body in traced)


def test_unroutable_publish_is_traced_with_no_routed_queues():
    _broker, client = traced_broker()
    client.publish(1, b"lost", exchange="amq.direct", routing_key="nowhere")
    [(key, headers, _body)] = drain(client, "trace")
    assert key == "publish.amq.direct" and headers["routed_queues"] == []


def test_bcc_is_routed_but_not_shown_in_the_traced_properties():
    _broker, client = traced_broker()
    for queue in ("to", "cc", "bcc"):
        client.call(1, commands.Queue.Declare(queue=queue))
    properties = commands.Basic.Properties(headers={"CC": ["cc"], "BCC": ["bcc"]})
    client.publish(1, b"m", routing_key="to", properties=properties)
    [(_key, headers, _body)] = drain(client, "trace")
    assert headers["routing_keys"] == ["to", "cc", "bcc"]
    assert sorted(headers["routed_queues"]) == ["bcc", "cc", "to"]
    assert headers["properties"]["headers"] == {"CC": ["cc"]}


def test_consuming_the_trace_queue_does_not_trace_itself():
    _broker, client = traced_broker()
    client.send(1, commands.Basic.Consume(queue="trace", consumer_tag="tracer", no_ack=True))
    client.call(1, commands.Queue.Declare(queue="work"))
    received = client.publish(1, b"m", routing_key="work")
    # One copy (publish.) reaches the tracer; its own delivery is not traced again.
    assert [frame.routing_key for _channel, frame in received if isinstance(frame, commands.Basic.Deliver)] == ["publish."]


def test_tracing_is_off_by_default_and_can_be_switched_off():
    broker = Broker()
    vhost = broker.vhosts["/"]
    assert not is_tracing(vhost)
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="trace"))
    client.call(1, commands.Queue.Bind(queue="trace", exchange="amq.rabbitmq.trace", routing_key="#"))
    client.publish(1, b"untraced", routing_key="trace")  # straight into the queue, not traced
    set_tracing(vhost, True, broker.node_name)
    set_tracing(vhost, False, broker.node_name)
    client.publish(1, b"also untraced", routing_key="trace")
    assert [body for _key, _headers, body in drain(client, "trace")] == [b"untraced", b"also untraced"]


def test_basic_get_is_traced_like_a_delivery():
    _broker, client = traced_broker()
    client.call(1, commands.Queue.Declare(queue="work"))
    client.publish(1, b"polled", routing_key="work")
    client.send(1, commands.Basic.Get(queue="work", no_ack=True))

    traced = drain(client, "trace")
    assert [key for key, _headers, _body in traced] == ["publish.", "deliver.work"]
    assert traced[1][2] == b"polled"
