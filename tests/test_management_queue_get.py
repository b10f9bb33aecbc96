"""POST /api/queues/{vhost}/{name}/get: RabbitMQ's ackmodes, and the non-destructive peek."""

from __future__ import annotations

import datetime

from pamqp import commands

from tests.frame_driver import methods, opened_client
from tests.test_management_client import api, broker  # noqa: F401  (fixtures)


def fill(broker, queue: str, bodies: list[bytes], **declare) -> object:
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue=queue, **declare))
    for body in bodies:
        client.publish(1, body, routing_key=queue, properties=commands.Basic.Properties(
            content_type="text/plain", headers={"n": 1}, timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)))
    return client


def get(api, queue: str, **body):
    reply = api.request("POST", f"/api/queues/%2F/{queue}/get", {"count": 10, "encoding": "auto", **body})
    assert reply.status == 200, reply
    return reply.json()


def test_ack_requeue_true_shows_messages_and_puts_them_back_redelivered(api, broker):
    client = fill(broker, "q", [b"one", b"two", b"three"])
    first = get(api, "q", ackmode="ack_requeue_true", count=2)
    assert [(m["payload"], m["redelivered"], m["message_count"]) for m in first] == [
        ("one", False, 2), ("two", False, 1)]
    assert first[0]["properties"] == {"content_type": "text/plain", "headers": {"n": 1}, "timestamp": 1704067200}
    assert (first[0]["exchange"], first[0]["routing_key"], first[0]["payload_bytes"]) == ("", "q", 3)
    again = get(api, "q", ackmode="ack_requeue_true")
    assert [(m["payload"], m["redelivered"]) for m in again] == [("one", True), ("two", True), ("three", False)]
    # An AMQP client sees the same order and flags afterwards.
    got = methods(client.send(1, commands.Basic.Get(queue="q", no_ack=True)))[0]
    assert got.redelivered is True and got.message_count == 2
    stats = api.get("/api/queues/%2F/q")["message_stats"]
    assert (stats["get"], stats["redeliver"], stats["get_no_ack"]) == (5, 3, 1)  # "one" twice, "two" once


def test_ack_requeue_false_takes_the_messages(api, broker):
    fill(broker, "q", [b"a", b"b", b"c"])
    assert [m["payload"] for m in get(api, "q", ackmode="ack_requeue_false", count=2)] == ["a", "b"]
    assert broker.vhosts["/"].queues["q"].message_count == 1
    assert broker.vhosts["/"].queues["q"].unacked_count == 0


def test_reject_requeue_false_dead_letters(api, broker):
    fill(broker, "dead", [])
    fill(broker, "q", [b"a"], arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    get(api, "q", ackmode="reject_requeue_false")
    assert broker.vhosts["/"].queues["q"].message_count == 0
    assert broker.vhosts["/"].queues["dead"].message_count == 1


def test_peek_changes_nothing(api, broker):
    client = fill(broker, "q", [b"one", b"two"])
    before = api.get("/api/queues/%2F/q")["message_stats"]
    for _ in range(3):
        peeked = get(api, "q", ackmode="peek")
        assert [(m["payload"], m["redelivered"], m["message_count"]) for m in peeked] == [
            ("one", False, 1), ("two", False, 0)]
    assert api.get("/api/queues/%2F/q")["message_stats"] == before
    got = methods(client.send(1, commands.Basic.Get(queue="q", no_ack=True)))[0]
    assert got.redelivered is False and got.message_count == 1


def test_peek_sees_requeued_messages_first(api, broker):
    client = fill(broker, "q", [b"one", b"two", b"three"])
    client.call(1, commands.Basic.Qos(prefetch_count=1))
    delivered = methods(client.send(1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    tag = [m for m in delivered if isinstance(m, commands.Basic.Deliver)][0].delivery_tag
    assert [m["payload"] for m in get(api, "q", ackmode="peek")] == ["two", "three"]
    client.send(1, commands.Basic.Cancel(consumer_tag="c"))
    client.send(1, commands.Basic.Nack(delivery_tag=tag, requeue=True))
    assert [m["payload"] for m in get(api, "q", ackmode="peek")] == ["one", "two", "three"]


def test_binary_payloads_are_base64_and_truncate_cuts_them(api, broker):
    fill(broker, "q", [b"\xff\x00binary", b"plain text"])
    [binary, text] = get(api, "q", ackmode="peek")
    assert (binary["payload"], binary["payload_encoding"]) == ("/wBiaW5hcnk=", "base64")
    assert (text["payload"], text["payload_encoding"]) == ("plain text", "string")
    [short] = get(api, "q", ackmode="peek", count=1, encoding="base64", truncate=2)
    assert (short["payload"], short["payload_bytes"]) == ("/wA=", 8)


def test_get_needs_a_known_ackmode_and_read_permission(api, broker):
    fill(broker, "q", [b"x"])
    reply = api.request("POST", "/api/queues/%2F/q/get", {"count": 1, "ackmode": "bogus"})
    assert reply.status == 400
    assert api.request("POST", "/api/queues/%2F/q/get", {"count": 1}).status == 400
    refused = api.request("POST", "/api/queues/%2F/q/get", {"count": 1, "ackmode": "peek"}, user="mgmt",
                          password="mgmt")
    assert refused.status == 401
    assert broker.vhosts["/"].queues["q"].message_count == 1
