"""kombu over py-amqp (`pyamqp://`): declarations, bindings, producing and consuming with acks."""

from __future__ import annotations

import socket
import time

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

from interop_tests.kombu_helpers import WAIT_S, connection, drain_until, kombu_url  # noqa: F401 (fixture)


def test_connection_reports_server_and_transport(connection: Connection) -> None:
    assert connection.connected
    assert connection.transport_cls == "pyamqp"
    server_properties = connection.connection.server_properties
    assert "capabilities" in server_properties
    assert server_properties["capabilities"].get("publisher_confirms") is True


def test_produce_and_consume_through_direct_exchange(connection, unique) -> None:
    exchange = Exchange(unique("kombu-direct"), type="direct", auto_delete=True)
    queue = Queue(unique("kombu-q"), exchange=exchange, routing_key="tasks", auto_delete=True)
    received: list[tuple[object, str]] = []

    def on_message(body, message: Message) -> None:
        received.append((body, message.content_type))
        message.ack()

    with connection.channel() as channel:
        with Consumer(channel, queues=[queue], callbacks=[on_message]):  # declares + binds
            producer = Producer(channel, exchange=exchange)
            producer.publish({"n": 1, "list": [1, 2]}, routing_key="tasks", serializer="json")
            producer.publish("plain text", routing_key="tasks", serializer="json")
            producer.publish(b"raw", routing_key="tasks", content_type="application/data",
                             content_encoding="binary")
            producer.publish("elsewhere", routing_key="not-bound")
            drain_until(connection, lambda: len(received) == 3)
    assert received == [
        ({"n": 1, "list": [1, 2]}, "application/json"),
        ("plain text", "application/json"),
        (b"raw", "application/data"),
    ]


def test_topic_bindings_route_by_pattern(connection, unique) -> None:
    exchange = Exchange(unique("kombu-topic"), type="topic", auto_delete=True)
    errors = Queue(unique("kombu-errors"), exchange=exchange, routing_key="*.error", auto_delete=True)
    everything = Queue(unique("kombu-all"), exchange=exchange, routing_key="#", auto_delete=True)
    with connection.channel() as channel:
        errors(channel).declare()
        everything(channel).declare()
        try:
            producer = Producer(channel, exchange=exchange)
            for key in ("db.error", "db.info", "web.error"):
                producer.publish(key, routing_key=key)
            got_errors = [errors(channel).get(no_ack=True).payload for _ in range(2)]
            assert errors(channel).get(no_ack=True) is None
            got_all = [everything(channel).get(no_ack=True).payload for _ in range(3)]
        finally:
            # Nobody consumed, so auto-delete never fires; the exchange goes with its last binding.
            errors(channel).delete()
            everything(channel).delete()
    assert got_errors == ["db.error", "web.error"]
    assert got_all == ["db.error", "db.info", "web.error"]


def test_requeue_redelivers_and_reject_drops(connection, unique) -> None:
    queue = Queue(unique("kombu-requeue"))
    with connection.channel() as channel:
        bound = queue(channel)
        bound.declare()
        try:
            Producer(channel).publish("again", routing_key=queue.name)
            seen: list[Message] = []
            with connection.channel() as consuming:
                with Consumer(consuming, queues=[queue], callbacks=[lambda body, m: seen.append(m)]):
                    drain_until(connection, lambda: len(seen) == 1)
                    assert seen[0].delivery_info["redelivered"] is False
                    seen[0].requeue()
                    drain_until(connection, lambda: len(seen) == 2)
                    assert seen[1].payload == "again"
                    assert seen[1].delivery_info["redelivered"] is True
                    seen[1].reject(requeue=False)
            # The consuming channel is closed; had the reject been lost, the message would be back.
            assert bound.get() is None
        finally:
            bound.delete()


def test_unacked_message_returns_after_channel_closes(connection, unique) -> None:
    queue = Queue(unique("kombu-unacked"), auto_delete=False)
    with connection.channel() as setup:
        bound = queue(setup)
        bound.declare()
        try:
            Producer(setup).publish("keep", routing_key=queue.name)
            with connection.channel() as worker:
                message = queue(worker).get(no_ack=False)
                assert message.payload == "keep"
                # channel closes here without ack
            again = bound.get(no_ack=False)
            assert again is not None and again.payload == "keep"
            assert again.delivery_info["redelivered"] is True
            again.ack()
        finally:
            bound.delete()


def test_simple_queue_put_get(connection, unique) -> None:
    name = unique("kombu-simple")
    with connection.SimpleQueue(name, queue_opts={"auto_delete": True}) as simple:
        simple.put({"hello": "world"})
        simple.put([1, 2, 3])
        first = simple.get(block=True, timeout=WAIT_S)
        second = simple.get(block=True, timeout=WAIT_S)
        assert first.payload == {"hello": "world"}
        assert second.payload == [1, 2, 3]
        first.ack()
        second.ack()
        with pytest.raises(simple.Empty):
            simple.get(block=False)
        assert simple.qsize() == 0
    # Closing cancelled the consumer, which deleted the auto-delete queue; the
    # SimpleQueue's direct exchange (named like the queue) stays until deleted.
    with connection.channel() as channel:
        Exchange(name, type="direct")(channel).delete()


def test_drain_events_times_out_when_idle(connection, unique) -> None:
    queue = Queue(unique("kombu-idle"), auto_delete=True)
    with connection.channel() as channel:
        with Consumer(channel, queues=[queue], callbacks=[lambda body, m: m.ack()]):
            started = time.monotonic()
            with pytest.raises(socket.timeout):
                connection.drain_events(timeout=0.3)
            assert time.monotonic() - started < 2.0


def test_prefetch_count_limits_unacked(connection, unique) -> None:
    queue = Queue(unique("kombu-qos"), auto_delete=True)
    with connection.channel() as channel:
        queue(channel).declare()
        producer = Producer(channel)
        for i in range(5):
            producer.publish(i, routing_key=queue.name)
    with connection.channel() as channel:
        held: list[Message] = []
        with Consumer(channel, queues=[queue], callbacks=[lambda body, m: held.append(m)], prefetch_count=2):
            drain_until(connection, lambda: len(held) == 2)
            # A round trip on the same channel orders after any further delivery; none may come.
            ready = queue(channel).queue_declare(passive=True).message_count
            with pytest.raises(socket.timeout):
                connection.drain_events(timeout=0.2)
            assert len(held) == 2
            assert ready == 3
            held[0].ack()
            drain_until(connection, lambda: len(held) == 3)
            for message in held[1:]:
                message.ack()
            drain_until(connection, lambda: len(held) == 5)
            for message in held[3:]:
                message.ack()
    assert [m.payload for m in held] == [0, 1, 2, 3, 4]


def test_vhost_without_permissions_is_refused(broker) -> None:
    import amqp.exceptions

    # The test config grants nobody anything on vhost "other": connection.open fails with 530.
    conn = Connection(kombu_url(broker, vhost="other"), connect_timeout=WAIT_S)
    try:
        with pytest.raises(amqp.exceptions.NotAllowed) as caught:
            conn.connect()
        assert caught.value.reply_code == 530
    finally:
        conn.release()
