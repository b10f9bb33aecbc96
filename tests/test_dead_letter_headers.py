"""What a dead-lettered message looks like on the wire, as RabbitMQ 3.10 sends it (checked side
by side): the publisher's headers keep their integer types, x-death's count is a 64-bit long,
the message comes from the dead-letter exchange, CC goes when a dead-letter routing key
replaces the key, and a rejection followed by an expiry into the same queue is a loop."""

from __future__ import annotations

import struct

from pamqp import commands

from queues.message import FLAG_HEADERS
from queues.raw_properties import RawProperties
from tests.frame_driver import FakeClient, marshal, opened_client, raw_frame
from tests.test_lifecycle_channel import declare, headers_of, later


def int32(value: int) -> bytes:
    return b"I" + struct.pack(">i", value)


def table(*fields: tuple[str, bytes]) -> bytes:
    body = b"".join(bytes((len(name),)) + name.encode() + value for name, value in fields)
    return struct.pack(">I", len(body)) + body


APP_HEADERS = (
    ("attempt", int32(7)),
    ("ids", b"A" + struct.pack(">I", 10) + int32(1) + int32(2)),
    ("meta", b"F" + table(("size", int32(300)))),
)


def publish_with_raw_headers(client: FakeClient, routing_key: str, fields: tuple[tuple[str, bytes], ...]) -> None:
    """A publish whose headers table is built by hand, with 32-bit integers as Java and .NET send them."""
    properties = struct.pack(">H", FLAG_HEADERS) + table(*fields)
    header_payload = struct.pack(">HHQ", 60, 0, 1) + properties
    client.send_bytes(
        marshal(1, commands.Basic.Publish(exchange="", routing_key=routing_key))
        + raw_frame(2, 1, header_payload)
        + raw_frame(3, 1, b"m")
    )


def dead_letter_once(client: FakeClient, queue: str) -> None:
    client.send(1, commands.Basic.Get(queue=queue))
    client.send(1, commands.Basic.Reject(delivery_tag=1, requeue=False))


def get_raw(client: FakeClient, queue: str) -> tuple[commands.Basic.GetOk, dict[str, bytes]]:
    client.connection.receive_data(marshal(1, commands.Basic.Get(queue=queue, no_ack=True)))
    frames = client.take_raw()
    get_ok = commands.Basic.GetOk()
    get_ok.unmarshal(frames[0][2][4:])
    properties = RawProperties(frames[1][2][12:])
    return get_ok, dict(properties.header_fields())


def test_the_publishers_header_types_survive_dead_lettering_and_count_is_a_long():
    client = opened_client()
    declare(client, "dead")
    declare(client, "q", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    publish_with_raw_headers(client, "q", APP_HEADERS)
    dead_letter_once(client, "q")

    _get_ok, fields = get_raw(client, "dead")
    for name, encoded in APP_HEADERS:
        assert fields[name] == encoded, name
    assert b"\x05countl" + struct.pack(">q", 1) in fields["x-death"]
    assert fields["x-first-death-reason"] == b"S" + struct.pack(">I", 8) + b"rejected"


def test_a_dead_lettered_message_comes_from_the_dead_letter_exchange_and_records_it_next_time():
    client = opened_client()
    client.send(1, commands.Exchange.Declare(exchange="dlx", exchange_type="fanout"))
    declare(client, "second", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "first"})
    client.send(1, commands.Queue.Bind(queue="second", exchange="dlx"))
    declare(client, "first", {"x-dead-letter-exchange": "dlx"})
    client.publish(1, b"m", routing_key="first")
    dead_letter_once(client, "first")

    received = client.send(1, commands.Basic.Get(queue="second"))
    assert received[0][1].exchange == "dlx"
    client.send(1, commands.Basic.Reject(delivery_tag=2, requeue=False))
    deaths = headers_of(client.send(1, commands.Basic.Get(queue="first", no_ack=True)))[0]["x-death"]
    assert [(death["queue"], death["exchange"]) for death in deaths] == [("second", "dlx"), ("first", "")]


def test_a_dead_letter_routing_key_drops_the_cc_header():
    client = opened_client()
    declare(client, "dead")
    declare(client, "q", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    client.publish(1, b"m", routing_key="q", properties=commands.Basic.Properties(headers={"CC": ["elsewhere"]}))
    dead_letter_once(client, "q")
    headers = headers_of(client.send(1, commands.Basic.Get(queue="dead", no_ack=True)))[0]
    assert "CC" not in headers
    assert headers["x-death"][0]["routing-keys"] == ["q", "elsewhere"]


def test_a_rejection_then_an_expiry_into_the_same_queue_is_an_automatic_loop_and_is_dropped():
    client = opened_client()
    declare(client, "s", {"x-message-ttl": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "s"})
    client.publish(1, b"m", routing_key="s")
    dead_letter_once(client, "s")  # a client rejected it: back into "s", as RabbitMQ does
    assert client.broker.vhosts["/"].queues["s"].message_count == 1
    later(client, 0.2)  # it expires: x-death now starts with {s, expired}, an automatic loop
    assert client.broker.vhosts["/"].queues["s"].message_count == 0


def test_dead_lettering_leaves_the_original_message_as_other_queues_hold_it():
    client = opened_client()
    client.send(1, commands.Exchange.Declare(exchange="both", exchange_type="fanout"))
    declare(client, "dead")
    for queue in ("short", "keeper"):
        declare(client, queue, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        client.send(1, commands.Queue.Bind(queue=queue, exchange="both"))
    client.publish(1, b"m", exchange="both", properties=commands.Basic.Properties(expiration="60000"))
    dead_letter_once(client, "short")
    client.send(1, commands.Basic.Get(queue="keeper"))
    client.send(1, commands.Basic.Reject(delivery_tag=2, requeue=False))
    client.send(1, commands.Basic.Get(queue="dead", no_ack=True))  # short's copy
    from_keeper = headers_of(client.send(1, commands.Basic.Get(queue="dead", no_ack=True)))[0]
    [death] = from_keeper["x-death"]  # keeper's message never saw short's death
    assert (death["queue"], death["original-expiration"]) == ("keeper", "60000")


def test_requeueing_past_x_max_length_drops_the_oldest_as_maxlen():
    client = opened_client()
    declare(client, "dead")
    declare(client, "limited", {"x-max-length": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    for body in (b"a0", b"a1"):
        client.publish(1, body, routing_key="limited")
    client.send(1, commands.Basic.Get(queue="limited"))
    client.send(1, commands.Basic.Get(queue="limited"))
    for body in (b"b0", b"b1"):
        client.publish(1, body, routing_key="limited")
    client.send(1, commands.Basic.Nack(delivery_tag=2, multiple=True, requeue=True))

    def drain(queue: str) -> list[tuple[bytes, str | None]]:
        got = []
        while True:
            received = client.send(1, commands.Basic.Get(queue=queue, no_ack=True))
            if isinstance(received[0][1], commands.Basic.GetEmpty):
                return got
            headers = headers_of(received)[0] or {}
            got.append((received[-1][1].value, headers.get("x-first-death-reason")))

    assert drain("limited") == [(b"b0", None), (b"b1", None)]
    assert drain("dead") == [(b"a0", "maxlen"), (b"a1", "maxlen")]
