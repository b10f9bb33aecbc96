"""AMQP 0-8, driven frame by frame: the headers that ask for it, and each place its bytes differ
from 0-9-1 (wire/amqp_0_8.py), as RabbitMQ 3.10.8 answers a 0-8 client.

What the broker sends is read here by hand, not with the module under test: a 0-8
connection.close is 10.60, which pamqp reads as 0-9-1's connection.blocked. The texts and ids
asserted are what RabbitMQ 3.10.8 sent for the same bytes (interop_tests/test_amqp_0_8.py sends
the same to either broker over a socket).
"""

from __future__ import annotations

import logging
import struct

import pytest
from pamqp import commands, frame

from amqp_server.broker.alarms import MEMORY
from amqp_server.connection import connection as connection_module
from amqp_server.ctl.listings import _protocol
from amqp_server.management.connection_json import connection_json
from amqp_server.management.rates import RateSampler
from amqp_server.wire import amqp_0_8, codec, protocols
from amqp_server.wire.errors import AMQPError
from tests.frame_driver import FakeClient, marshal, plain_response, publish_frames, raw_frame

AMQP_0_8_HEADER = b"AMQP\x01\x01\x08\x00"
AMQP_0_8_SPEC_HEADER = b"AMQP\x01\x01\x09\x01"


def method(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return raw_frame(1, channel, struct.pack(">HH", class_id, method_id) + arguments)


def close_0_8(code: int = 200, text: bytes = b"", class_id: int = 0, method_id: int = 0) -> bytes:
    return method(0, 10, 60, struct.pack(">HB", code, len(text)) + text + struct.pack(">HH", class_id, method_id))


CLOSE_OK_0_8 = method(0, 10, 61)


def consume_0_8(queue: bytes, tag: bytes = b"", bits: int = 0) -> bytes:
    """basic.consume as 0-8 has it: ticket, queue, consumer tag, bits, and no arguments table."""
    return method(1, 60, 20, b"\x00\x00" + bytes((len(queue),)) + queue + bytes((len(tag),)) + tag + bytes((bits,)))


def ids(payload: bytes) -> tuple[int, int]:
    return struct.unpack_from(">HH", payload)  # type: ignore[return-value]


def connection_close(raw: list[tuple[int, int, bytes]]) -> tuple[int, str, int, int]:
    """The broker's last frame, which must be a 0-8 connection.close (10.60): its fields."""
    frame_type, channel, payload = raw[-1]
    assert (frame_type, channel, ids(payload)) == (1, 0, (10, 60)), raw
    code, length = struct.unpack_from(">HB", payload, 4)
    text = payload[7 : 7 + length].decode()
    class_id, method_id = struct.unpack_from(">HH", payload, 7 + length)
    assert len(payload) == 11 + length
    return code, text, class_id, method_id


def pamqp_methods(raw: list[tuple[int, int, bytes]]) -> list[object]:
    """Frames whose bytes 0-8 and 0-9-1 share, read with pamqp."""
    return [frame.unmarshal(struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce")[2]
            for kind, channel, payload in raw]


class Client08:
    """A FakeClient speaking AMQP 0-8 (what Mono's RabbitMQ.Client sends by default)."""

    def __init__(self, header: bytes = AMQP_0_8_HEADER, **fake: object) -> None:
        self.fake = FakeClient(**fake)  # type: ignore[arg-type]
        self.connection = self.fake.connection
        self.start_frames = self.send(header)

    def send(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self.connection.receive_data(data)
        return self.fake.take_raw()

    def login(self, password: str = "guest", capabilities: dict[str, object] | None = None
              ) -> list[tuple[int, int, bytes]]:
        properties = {"product": "0-8 client", **({"capabilities": capabilities} if capabilities else {})}
        return self.send(marshal(0, commands.Connection.StartOk(
            client_properties=properties, mechanism="PLAIN", response=plain_response("guest", password))))

    def open(self, capabilities: dict[str, object] | None = None) -> "Client08":
        self.login(capabilities=capabilities)
        self.send(marshal(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)))
        assert pamqp_methods(self.send(marshal(0, commands.Connection.Open(virtual_host="/"))))[0].__class__ \
            is commands.Connection.OpenOk
        assert self.send(method(1, 20, 10, b"\x00")) == [(1, 1, b"\x00\x14\x00\x0b")]
        return self


def opened(**kwargs: object) -> Client08:
    return Client08().open(**kwargs)  # type: ignore[arg-type]


# -- the header -------------------------------------------------------------------------


@pytest.mark.parametrize("header", [AMQP_0_8_HEADER, AMQP_0_8_SPEC_HEADER], ids=["1-1-8-0", "1-1-9-1"])
def test_each_0_8_header_is_answered_with_a_0_8_start(header):
    client = Client08(header)
    [start] = pamqp_methods(client.start_frames)
    assert isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (8, 0)
    # RabbitMQ's 0-8 start has the capabilities key, with an empty table: no extension exists in 0-8.
    assert start.server_properties["capabilities"] == {}
    assert start.server_properties["product"] == "amqp-server"
    assert "PLAIN" in start.mechanisms.split()
    assert client.connection.protocol is protocols.AMQP_0_8


@pytest.mark.parametrize("header", [codec.PROTOCOL_HEADER, codec.LEGACY_0_9_HEADER])
def test_0_9_1_and_0_9_headers_still_get_a_0_9_start_with_capabilities(header):
    client = Client08(header)
    [start] = pamqp_methods(client.start_frames)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.server_properties["capabilities"]["publisher_confirms"] is True
    assert client.connection.protocol is protocols.AMQP_0_9_1


@pytest.mark.parametrize("header", [b"AMQP\x01\x01\x08\x01", b"AMQP\x00\x00\x08\x00", b"AMQP\x01\x01\x07\x00",
                                    b"AMQP\x00\x00\x09\x00"])
def test_headers_near_0_8_are_refused_with_rabbitmqs_header_and_a_close(caplog, header):
    client = FakeClient()
    with caplog.at_level(logging.ERROR, logger="amqp_server.connection.connection"):
        client.connection.receive_data(header)
    assert client.connection.take_output() == codec.PROTOCOL_HEADER
    assert client.connection.state is connection_module.CLOSED and client.connection.close_when_flushed
    protocol_id, major, minor, revision = header[4:]
    assert caplog.records[-1].getMessage().endswith(f"{{bad_version,{{{protocol_id},{major},{minor},{revision}}}}}")


def test_a_0_8_header_and_its_start_ok_in_one_read_are_both_handled():
    client = FakeClient()
    start_ok = marshal(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                      response=plain_response("guest", "guest")))
    client.connection.receive_data(AMQP_0_8_HEADER + start_ok)
    start, tune = pamqp_methods(client.take_raw())
    assert (start.version_major, isinstance(tune, commands.Connection.Tune)) == (8, True)


# -- the handshake and the connection class -----------------------------------------------


def test_0_8_handshake_opens_the_connection_and_channel_open_ok_has_no_field():
    client = opened()  # open() asserts open-ok and the 4-byte channel.open-ok
    assert client.connection.state is connection_module.OPEN


def test_client_close_is_answered_with_a_0_8_close_ok():
    client = opened()
    assert client.send(close_0_8(200, b"Goodbye")) == [(1, 0, b"\x00\x0a\x00\x3d")]
    assert client.connection.state is connection_module.CLOSED and client.connection.close_when_flushed


def test_a_hard_error_is_a_0_8_close_and_only_a_0_8_close_ok_ends_it():
    client = opened()
    assert connection_close(client.send(method(1, 20, 10, b"\x00"))) == (
        504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)
    assert client.send(method(0, 10, 51)) == []  # 0-9-1's close-ok id means nothing in 0-8
    assert client.connection.state is connection_module.CLOSING
    assert client.send(close_0_8()) == [(1, 0, b"\x00\x0a\x00\x3d")]  # a close crossing ours: answered
    assert client.connection.state is connection_module.CLOSING
    client.send(CLOSE_OK_0_8)
    assert client.connection.state is connection_module.CLOSED and client.connection.close_when_flushed


def test_refused_login_is_a_0_8_close_for_a_client_that_asks_for_one():
    client = Client08()
    raw = client.login(password="wrong", capabilities={"authentication_failure_close": True})
    assert connection_close(raw) == (
        403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
             "For details see the broker logfile.", 0, 0)
    client.send(CLOSE_OK_0_8)
    assert client.connection.state is connection_module.CLOSED


def test_bad_vhost_is_a_0_8_close_naming_connection_open():
    client = Client08()
    client.login()
    client.send(marshal(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)))
    assert connection_close(client.send(marshal(0, commands.Connection.Open(virtual_host="/nope")))) == (
        530, "NOT_ALLOWED - vhost /nope not found", 10, 40)


def test_a_close_during_the_handshake_gets_no_answer():
    client = Client08()
    assert client.send(close_0_8()) == []  # RabbitMQ drops such a client without a word
    assert client.connection.state is connection_module.CLOSING


@pytest.mark.parametrize(("class_id", "method_id", "arguments"), [
    (10, 50, b"\x01h\x00"),  # connection.redirect: the broker's to send, in 0-8
    (10, 61, b""),  # connection.close-ok that nothing asked for
    (70, 10, struct.pack(">IHB", 0, 1, 0)),  # file.qos on channel 0
], ids=["redirect", "close-ok", "file.qos"])
def test_0_8_methods_out_of_place_on_channel_0_are_unexpected(class_id, method_id, arguments):
    client = opened()
    assert connection_close(client.send(method(0, class_id, method_id, arguments))) == (
        504, "CHANNEL_ERROR - unexpected method in connection state running", class_id, method_id)


def test_heartbeat_on_a_channel_is_an_unexpected_frame():
    client = opened()
    assert connection_close(client.send(raw_frame(8, 1, b""))) == (
        505, "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0)


# -- methods that differ ----------------------------------------------------------------


def _declared(client: Client08) -> bytes:
    [declare_ok] = pamqp_methods(client.send(marshal(1, commands.Queue.Declare(queue="q08"))))
    assert isinstance(declare_ok, commands.Queue.DeclareOk)
    return b"q08"


def test_consume_without_an_arguments_table_consumes():
    client = opened()
    queue = _declared(client)
    [consume_ok] = pamqp_methods(client.send(consume_0_8(queue, b"tag-1")))
    assert isinstance(consume_ok, commands.Basic.ConsumeOk) and consume_ok.consumer_tag == "tag-1"
    deliver, _header, body = pamqp_methods(client.send(publish_frames(1, b"hello", routing_key="q08")))
    assert isinstance(deliver, commands.Basic.Deliver) and deliver.consumer_tag == "tag-1"
    assert body.value == b"hello"


def test_consume_with_an_arguments_table_cannot_be_decoded():
    client = opened()
    queue = _declared(client)
    code, text, class_id, method_id = connection_close(
        client.send(method(1, 60, 20, b"\x00\x00\x03" + queue + b"\x00\x00" + b"\x00\x00\x00\x00")))
    assert (code, class_id, method_id) == (501, 60, 20)
    assert text == "FRAME_ERROR - cannot decode <<0,0,3,113,48,56,0,0,0,0,0,0>>"


def test_consume_cut_short_cannot_be_decoded():
    client = opened()
    assert connection_close(client.send(method(1, 60, 20, b"\x00\x00\x05abcde\x00"))) == (
        501, "FRAME_ERROR - cannot decode <<0,0,5,97,98,99,100,101,0>>", 60, 20)


def test_methods_0_8_shares_with_0_9_1_are_answered_as_in_0_9_1():
    client = opened()
    queue = _declared(client)
    # access.request (ticket 1), queue.unbind and basic.recover: RabbitMQ's 0-8 has them too.
    assert client.send(method(1, 30, 10, b"\x05/data\x1f")) == [(1, 1, b"\x00\x1e\x00\x0b\x00\x01")]
    [unbind_ok] = pamqp_methods(client.send(marshal(1, commands.Queue.Unbind(queue="q08", exchange="amq.direct",
                                                                             routing_key="k"))))
    [recover_ok] = pamqp_methods(client.send(marshal(1, commands.Basic.Recover(requeue=True))))
    assert isinstance(unbind_ok, commands.Queue.UnbindOk) and isinstance(recover_ok, commands.Basic.RecoverOk)
    assert queue


@pytest.mark.parametrize(("channel", "class_id", "method_id", "arguments"), [
    (1, 60, 120, struct.pack(">QB", 1, 0)),  # basic.nack
    (1, 85, 10, b"\x00"),  # confirm.select
    (1, 40, 30, b"\x00" * 16),  # exchange.bind
    (1, 40, 40, b"\x00" * 16),  # exchange.unbind
    (0, 10, 70, b"\x00\x00\x00\x00\x00"),  # connection.update-secret
], ids=["basic.nack", "confirm.select", "exchange.bind", "exchange.unbind", "update-secret"])
def test_methods_only_0_9_1_has_are_unknown_methods(channel, class_id, method_id, arguments):
    # RabbitMQ's reader crashes on an id its 0-8 framing does not know and drops the socket; a
    # 503 close is the polite equivalent (as for any unknown id: test_channel_lifecycle.py).
    client = opened()
    assert connection_close(client.send(method(channel, class_id, method_id, arguments))) == (
        503, "COMMAND_INVALID - unknown method", class_id, method_id)


ONLY_0_8 = {  # (class, method, fields as RabbitMQ 3.10.8's rabbit_framing_amqp_0_8 decodes them)
    "channel.alert": (20, 30, struct.pack(">HB", 200, 2) + b"hi" + b"\x00\x00\x00\x00"),
    "file.qos": (70, 10, struct.pack(">IHB", 0, 1, 0)),
    "file.publish": (70, 60, b"\x00\x00" + b"\x00" + b"\x01q" + b"\x00" + b"\x02id"),
    "stream.qos": (80, 10, struct.pack(">IHIB", 0, 1, 0, 0)),
    "dtx.select": (100, 10, b""),
    "test.integer": (120, 10, struct.pack(">BHIQB", 1, 2, 3, 4, 0)),
}


@pytest.mark.parametrize(("class_id", "method_id", "arguments"), ONLY_0_8.values(), ids=ONLY_0_8.keys())
def test_methods_only_0_8_has_are_unimplemented_on_a_channel(class_id, method_id, arguments):
    client = opened()
    assert connection_close(client.send(method(1, class_id, method_id, arguments))) == (
        503, "COMMAND_INVALID - unimplemented method", class_id, method_id)


@pytest.mark.parametrize(("class_id", "method_id", "arguments"), ONLY_0_8.values(), ids=ONLY_0_8.keys())
def test_methods_only_0_8_has_are_decoded_first(class_id, method_id, arguments):
    # As any method, RabbitMQ decodes them first: a byte too many, or one too few, is its 501.
    for broken in (arguments + b"\x00", arguments[:-1]):
        if broken == arguments:
            continue  # (dtx.select has no field to cut)
        client = opened()
        code, text, *ids_ = connection_close(client.send(method(1, class_id, method_id, broken)))
        assert (code, ids_) == (501, [class_id, method_id]) and text.startswith("FRAME_ERROR - cannot decode <<")


def test_a_0_8_method_on_a_channel_not_open_asks_for_channel_open():
    client = opened()
    assert connection_close(client.send(method(3, 70, 10, struct.pack(">IHB", 0, 1, 0)))) == (
        504, "CHANNEL_ERROR - expected 'channel.open'", 70, 10)


def test_a_0_9_1_connection_still_knows_no_0_8_method():
    client = FakeClient()
    client.handshake()
    client.open_channel(1)
    [(channel, close)] = client.send_bytes(method(1, 70, 10, struct.pack(">IHB", 0, 1, 0)))
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        503, "COMMAND_INVALID - unknown method", 70, 10)


# -- what 0-8 lacks ---------------------------------------------------------------------


def test_an_alarm_holds_a_0_8_publisher_without_connection_blocked_even_if_it_asked():
    # connection.blocked does not exist in 0-8 (RabbitMQ 3.10.8's reader crashes encoding it
    # for a 0-8 client that announced the capability): the publish is held without a word.
    client = opened(capabilities={"connection.blocked": True})
    _declared(client)
    broker = client.fake.broker
    broker.alarms.set(MEMORY, True)
    assert client.send(publish_frames(1, b"held", routing_key="q08")) == []
    assert client.connection.flow.blocked_by is not None and client.connection.reading_paused
    broker.alarms.set(MEMORY, False)
    client.connection.resume_input()
    assert client.fake.take_raw() == []  # no connection.unblocked either
    assert broker.vhosts["/"].queues["q08"].message_count == 1


# -- the codec and what reports a connection ----------------------------------------------


def test_connection_frame_renumbers_close_and_close_ok_only():
    close = amqp_0_8.connection_frame(commands.Connection.Close(320, "CONNECTION_FORCED - shutdown", 0, 0))
    assert close == codec.method_frame(0, commands.Connection.Close(320, "CONNECTION_FORCED - shutdown", 0, 0)) \
        .replace(b"\x00\x0a\x00\x32", b"\x00\x0a\x00\x3c", 1)
    assert amqp_0_8.connection_frame(commands.Connection.CloseOk()) == CLOSE_OK_0_8
    tune = commands.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=60)
    assert amqp_0_8.connection_frame(tune) == codec.method_frame(0, tune)
    with pytest.raises(AssertionError):
        amqp_0_8.connection_frame(commands.Connection.Blocked("low on memory"))


def test_a_decoded_0_8_close_is_a_0_9_1_close_under_its_0_8_id():
    close = amqp_0_8.decode_method(struct.pack(">HHHB", 10, 60, 200, 3) + b"bye" + struct.pack(">HH", 0, 0))
    assert isinstance(close, commands.Connection.Close) and close.index == amqp_0_8.CLOSE
    assert (close.reply_code, close.reply_text) == (200, "bye")
    with pytest.raises(AMQPError) as refused:
        amqp_0_8.decode_method(struct.pack(">HHH", 10, 60, 200))
    assert refused.value.code == 501


def test_management_and_ctl_name_the_protocol_as_rabbitmq_does():
    client = opened()
    reported = connection_json(client.connection, "rabbit@localhost", RateSampler())["protocol"]
    assert reported == "AMQP 0-8"
    assert _protocol({"protocol": reported}) == "{0,8,0}"
    assert _protocol({"protocol": "AMQP 0-9-1"}) == "{0,9,1}"
