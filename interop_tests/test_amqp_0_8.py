"""AMQP 0-8 over a raw socket, where its bytes differ from 0-9-1 (amqp_server/wire/amqp_0_8.py).

RabbitMQ 3.10 speaks 0-8 to the headers `AMQP 1 1 8 0` and `AMQP 1 1 9 1`; each test here passes
against it (INTEROP_BROKER_URL) and against this broker. Frames are read by hand: a 0-8
connection.close is 10.60, which pamqp would read as 0-9-1's connection.blocked.
"""

from __future__ import annotations

import struct

import pytest
from pamqp import commands, frame

from interop_tests.broker_process import external_broker
from interop_tests.raw_client import RawClient, ServerClosedSocket, method_payload, raw_frame

AMQP_0_8_HEADERS = {"1-1-8-0": b"AMQP\x01\x01\x08\x00", "1-1-9-1": b"AMQP\x01\x01\x09\x01"}
CLOSE_DEADLINE_S = 10.0
CLOSE_OK_0_8 = raw_frame(1, 0, method_payload(10, 61))


def method(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return raw_frame(1, channel, method_payload(class_id, method_id, arguments))


def read_frame(client: RawClient) -> tuple[int, int, bytes]:
    """The next frame that is not a heartbeat, as (type, channel, payload)."""
    while True:
        frame_type, channel, size = struct.unpack(">BHI", client.read_bytes(7))
        payload = client.read_bytes(size)
        assert client.read_bytes(1) == b"\xce"
        if frame_type != 8:
            return frame_type, channel, payload


def read_method(client: RawClient, class_id: int, method_id: int) -> bytes:
    """The next frame, which must be that method; its fields."""
    frame_type, _channel, payload = read_frame(client)
    assert (frame_type, struct.unpack_from(">HH", payload)) == (1, (class_id, method_id)), payload
    return payload[4:]


def read_pamqp(client: RawClient, kind: type) -> object:
    """The next frame, one whose bytes 0-8 and 0-9-1 share, read with pamqp."""
    frame_type, channel, payload = read_frame(client)
    value = frame.unmarshal(struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce")[2]
    assert isinstance(value, kind), value
    return value


def hard_error(client: RawClient) -> tuple[int, str, int, int]:
    """A 0-8 connection.close (10.60), answered with a 0-8 close-ok, then the socket closes."""
    fields = read_method(client, 10, 60)
    code, length = struct.unpack_from(">HB", fields)
    class_id, method_id = struct.unpack_from(">HH", fields, 3 + length)
    client.send_bytes(CLOSE_OK_0_8)
    client.wait_closed(timeout=CLOSE_DEADLINE_S)
    return code, fields[3 : 3 + length].decode(), class_id, method_id


def open_0_8(client: RawClient, header: bytes = AMQP_0_8_HEADERS["1-1-8-0"]) -> commands.Connection.Start:
    """Header through channel 1's open-ok, in 0-8; returns the broker's connection.start."""
    client.send_bytes(header)
    start = read_pamqp(client, commands.Connection.Start)
    client.send(commands.Connection.StartOk(client_properties={"product": "0-8 raw client"}, mechanism="PLAIN",
                                            response="\0guest\0guest", locale="en_US"))
    tune = read_pamqp(client, commands.Connection.Tune)
    client.send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    client.send(commands.Connection.Open(virtual_host="/"))
    read_pamqp(client, commands.Connection.OpenOk)
    client.send_bytes(method(1, 20, 10, b"\x00"))
    assert read_method(client, 20, 11) == b""  # 0-8's channel.open-ok has no field
    return start  # type: ignore[return-value]


@pytest.fixture
def client(broker):
    with RawClient(broker.host, broker.port) as client:
        yield client


@pytest.mark.parametrize("header", AMQP_0_8_HEADERS.values(), ids=AMQP_0_8_HEADERS.keys())
def test_a_0_8_client_consumes_and_closes(client, unique, header):
    start = open_0_8(client, header)
    assert (start.version_major, start.version_minor) == (8, 0)
    assert start.server_properties["capabilities"] == {}
    queue = unique("amqp-0-8").encode()
    client.send(commands.Queue.Declare(queue=queue.decode(), exclusive=True), 1)
    read_pamqp(client, commands.Queue.DeclareOk)
    # basic.consume as 0-8 has it: no arguments table after the bits.
    client.send_bytes(method(1, 60, 20, b"\x00\x00" + bytes((len(queue),)) + queue + b"\x05tag-8\x02"))  # no-ack
    assert read_pamqp(client, commands.Basic.ConsumeOk).consumer_tag == "tag-8"
    client.publish(1, "", queue.decode(), b"over 0-8")
    deliver = read_pamqp(client, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.routing_key) == ("tag-8", queue.decode())
    read_frame(client)  # the content header
    assert read_frame(client)[2] == b"over 0-8"
    client.send(commands.Basic.Recover(requeue=True), 1)
    read_pamqp(client, commands.Basic.RecoverOk)
    client.send_bytes(method(0, 10, 60, struct.pack(">HB", 200, 3) + b"bye" + struct.pack(">HH", 0, 0)))
    assert read_method(client, 10, 61) == b""


def test_a_consume_with_an_arguments_table_cannot_be_decoded(client, unique):
    open_0_8(client)
    queue = unique("amqp-0-8").encode()
    client.send(commands.Queue.Declare(queue=queue.decode(), exclusive=True), 1)
    read_pamqp(client, commands.Queue.DeclareOk)
    client.send_bytes(method(1, 60, 20, b"\x00\x00" + bytes((len(queue),)) + queue + b"\x00\x00" + b"\x00" * 4))
    code, text, class_id, method_id = hard_error(client)
    # RabbitMQ 3.10.8: "FRAME_ERROR - cannot decode <<0,0,22,...,0,0,0,0,0,0>>" (the whole payload)
    assert (code, class_id, method_id) == (501, 60, 20) and text.startswith("FRAME_ERROR - cannot decode <<0,0,")


ONLY_0_8 = {  # (class, method, well-formed fields)
    "channel.alert": (20, 30, struct.pack(">HB", 200, 2) + b"hi" + b"\x00\x00\x00\x00"),
    "file.qos": (70, 10, struct.pack(">IHB", 0, 1, 0)),
    "dtx.select": (100, 10, b""),
}


@pytest.mark.parametrize(("class_id", "method_id", "arguments"), ONLY_0_8.values(), ids=ONLY_0_8.keys())
def test_a_method_only_0_8_has_is_unimplemented(client, class_id, method_id, arguments):
    open_0_8(client)
    client.send_bytes(method(1, class_id, method_id, arguments))
    assert hard_error(client) == (503, "COMMAND_INVALID - unimplemented method", class_id, method_id)


@pytest.mark.parametrize(("class_id", "method_id", "arguments"), ONLY_0_8.values(), ids=ONLY_0_8.keys())
def test_a_method_only_0_8_has_is_decoded_first(client, class_id, method_id, arguments):
    open_0_8(client)
    client.send_bytes(method(1, class_id, method_id, arguments + b"\x00"))
    code, text, *ids = hard_error(client)
    assert (code, ids) == (501, [class_id, method_id]) and text.startswith("FRAME_ERROR - cannot decode <<")


@pytest.mark.parametrize(("class_id", "method_id", "arguments"), [(10, 50, b"\x01h\x00"), (10, 61, b""),
                                                                  (70, 10, b"\x00" * 7)],
                         ids=["connection.redirect", "connection.close-ok", "file.qos"])
def test_a_method_out_of_place_on_channel_0_is_unexpected(client, class_id, method_id, arguments):
    open_0_8(client)
    client.send_bytes(method(0, class_id, method_id, arguments))
    assert hard_error(client) == (
        504, "CHANNEL_ERROR - unexpected method in connection state running", class_id, method_id)


@pytest.mark.parametrize(("channel", "class_id", "method_id", "arguments"), [
    (1, 60, 120, struct.pack(">QB", 1, 0)), (1, 85, 10, b"\x00"), (0, 10, 70, b"\x00" * 5)],
    ids=["basic.nack", "confirm.select", "update-secret"])
def test_a_method_only_0_9_1_has_ends_the_connection(client, channel, class_id, method_id, arguments):
    open_0_8(client)
    client.send_bytes(method(channel, class_id, method_id, arguments))
    # RabbitMQ 3.10.8's reader crashes on an id its 0-8 framing lacks and drops the socket; this
    # broker sends the 503 close it sends for any unknown id first (test_raw_protocol.py), and
    # must: a silent drop is accepted from RabbitMQ only.
    try:
        assert hard_error(client) == (503, "COMMAND_INVALID - unknown method", class_id, method_id)
    except ServerClosedSocket:
        if external_broker() is None:
            raise


def test_a_channel_error_is_closed_in_0_8_and_the_connection_carries_on(client):
    open_0_8(client)
    # A publish to a missing exchange, its content header announcing an empty body.
    client.send_bytes(method(1, 60, 40, b"\x00\x00\x0bno-such-one\x00\x00")
                      + raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 0, 0)))
    fields = read_method(client, 20, 40)
    assert fields[3 : 3 + fields[2]].decode() == "NOT_FOUND - no exchange 'no-such-one' in vhost '/'"
    client.send_bytes(method(1, 20, 41))
    client.send_bytes(method(1, 20, 10, b"\x00"))
    assert read_method(client, 20, 11) == b""
