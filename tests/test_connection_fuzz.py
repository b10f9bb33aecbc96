"""Whatever bytes a client sends, the connection answers with a close, never an exception.

Hypothesis generates frames of every type on channels 0-3 with random payloads, and method
frames with real class/method ids followed by random argument bytes, after a valid handshake.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from amqp_server.connection.connection import CLOSED, CLOSING, OPEN
from tests.frame_driver import FakeClient, opened_client, raw_frame

METHOD_IDS = sorted(commands.INDEX_MAPPING)

random_frames = st.builds(
    raw_frame,
    st.sampled_from([1, 2, 3, 4, 8, 206]),
    st.integers(0, 3),
    st.binary(max_size=64),
)
method_frames = st.builds(
    lambda index, channel, arguments: raw_frame(1, channel, struct.pack(">I", index) + arguments),
    st.sampled_from(METHOD_IDS),
    st.integers(0, 3),
    st.binary(max_size=48),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(random_frames, method_frames), min_size=1, max_size=12))
def test_random_frames_never_raise_out_of_the_connection(frames):
    client = opened_client(channels=(1, 2))
    for frame in frames:
        client.send_bytes(frame)
    assert client.connection.state in (OPEN, CLOSING, CLOSED)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40), st.lists(st.binary(max_size=32), max_size=3))
def test_a_publish_followed_by_random_content_frames_never_raises(header, bodies):
    client = opened_client()
    publish = commands.Basic.Publish(exchange="", routing_key="q")
    client.send(1, publish)
    client.send_bytes(raw_frame(2, 1, header))
    for body in bodies:
        client.send_bytes(raw_frame(3, 1, body))
    assert client.connection.state in (OPEN, CLOSING, CLOSED)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=256))
def test_random_bytes_after_the_handshake_never_raise(data):
    client = opened_client()
    client.send_bytes(data)
    assert client.connection.state in (OPEN, CLOSING, CLOSED)


# Found by the frame fuzzer (bench/frame_fuzz.py, seed 1, connection 2459): a bit flip turned the
# queue name into one with a DEL character. RabbitMQ accepts any name a short string holds and
# repeats it in its replies; pamqp refuses to encode it, which cost the client its connection
# with INTERNAL_ERROR.
FUZZED_DECLARE = (
    b"\x01\x00\x01\x00\x00\x008\x002\x00\n\x00\x00\x0cfz-T0\x7f0000-q\x04\x00\x00\x00 "
    b"\x0cx-max-lengthb2\rx-message-ttlu\xea`\xce"
)
ODD_NAME = b"fz weird\x01x"


def send_raw(client: FakeClient, data: bytes) -> list[tuple[int, int, bytes]]:
    """Feed bytes to the broker and return its frames undecoded (pamqp would refuse these names)."""
    client.connection.receive_data(data)
    return client.take_raw()


def test_a_queue_name_outside_the_specs_characters_is_declared_and_named_back():
    client = opened_client()
    (frame_type, channel, payload), = send_raw(client, FUZZED_DECLARE)
    assert (frame_type, channel) == (1, 1)
    assert payload == b"\x00\x32\x00\x0b" + b"\x0cfz-T0\x7f0000-q" + struct.pack(">II", 0, 0)
    assert client.connection.state == OPEN


def _exchange_declare(name: bytes) -> bytes:
    return raw_frame(1, 1, struct.pack(">HHH", 40, 10, 0) + bytes([len(name)]) + name + b"\x06direct\x00" + bytes(4))


def _publish(name: bytes, routing_key: bytes, mandatory: bool) -> bytes:
    method = struct.pack(">HHH", 60, 40, 0) + bytes([len(name)]) + name + bytes([len(routing_key)]) + routing_key
    return (
        raw_frame(1, 1, method + bytes([int(mandatory)]))
        + raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 1, 0))
        + raw_frame(3, 1, b"x")
    )


def test_a_return_and_a_get_ok_repeat_an_exchange_name_outside_the_specs_characters():
    client = opened_client()
    assert [frame[2][:4] for frame in send_raw(client, _exchange_declare(ODD_NAME))] == [b"\x00\x28\x00\x0b"]  # exchange.declare-ok
    client.send(1, commands.Queue.Declare(queue="bound"))
    bind = struct.pack(">HHH", 50, 20, 0) + b"\x05bound" + bytes([len(ODD_NAME)]) + ODD_NAME + b"\x02rk\x00" + bytes(4)
    send_raw(client, raw_frame(1, 1, bind))
    returned = send_raw(client, _publish(ODD_NAME, b"nowhere", mandatory=True) + _publish(ODD_NAME, b"rk", mandatory=False))
    assert returned[0][2] == b"\x00\x3c\x00\x32\x01\x38\x08NO_ROUTE" + bytes([len(ODD_NAME)]) + ODD_NAME + b"\x07nowhere"
    get_ok = send_raw(client, raw_frame(1, 1, struct.pack(">HHH", 60, 70, 0) + b"\x05bound\x01"))[0][2]
    assert get_ok[:4] == b"\x00\x3c\x00\x47"
    assert bytes([len(ODD_NAME)]) + ODD_NAME + b"\x02rk" in get_ok
    assert client.connection.state == OPEN


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80).filter(lambda name: len(name.encode()) <= 255 and not name.startswith("amq.")))
def test_any_queue_name_a_short_string_holds_is_declared_and_named_back(name):
    client = opened_client()
    raw = name.encode()
    declare = struct.pack(">HHH", 50, 10, 0) + bytes([len(raw)]) + raw + b"\x04" + bytes(4)  # exclusive
    (_frame_type, _channel, payload), = send_raw(client, raw_frame(1, 1, declare))
    if raw:
        assert payload == b"\x00\x32\x00\x0b" + bytes([len(raw)]) + raw + struct.pack(">II", 0, 0)
    else:
        assert payload[:4] == b"\x00\x32\x00\x0b" and payload[5:13] == b"amq.gen-"  # server-named


# Found by the frame fuzzer (seed 20, connections 449 and 11896, after the content header check
# landed): headers the check accepts, as RabbitMQ does, that pamqp will not decode. The broker
# decodes them to check reply_to and expiration, and failed with INTERNAL_ERROR. The channel
# number is the fuzzer's; the test replays them on channel 1.
APP_ID_NOT_UTF8 = (
    b"\x02\x00\x05\x00\x00\x015\x00<\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\xfe\xe8\x10application/json\x05utf-8"
    b"\x00\x00\x00\xd4\x05x-bigl\x00\x00\x01\x00\x00\x00\x00\x00\x06x-boolt\x01\tx-decimalD\x02\x00\x00\x01:\x07"
    b"x-floatf?\xc0\x00\x00\x05x-intb+\x06x-listA\x00\x00\x00\x1db\x01S\x00\x00\x00\x03twoA\x00\x00\x00\x0eb\x03F"
    b"\x00\x00\x00\x07\x04fourb\x04\nx-negativeb\xf9\x06x-noneV\x08x-stringS\x00\x00\x00\x06h\xc3\xa9llo\x07x-tableF"
    b"\x00\x00\x00(\x06nestedF\x00\x00\x00\x1c\x06deeperF\x00\x00\x00\x10\x07deepestS\x00\x00\x00\x03yes\x06x-timeT"
    b"\x00\x00\x00\x00e\x93}%\x02\x01\x06corr-1\x10fz-c0001c1-reply\x05msg-1\x00\x00\x00\x00f8\x81\xd9\x04fuzz\n"
    b"frame-f\xcezz\xce"
)
TIMESTAMP_PAST_9999 = (
    b"\x02\x00\x02\x00\x00\x01;\x00<\x00\x00\x00\x00\x00\x00\x00\x00\x00\n\xff\xe8\x10application/json\x05utf-8"
    b"\x00\x00\x00\xd4\x05x-bigl\x00\x00\x01\x00\x00\x00\x00\x00\x06x-boolt\x01\tx-decimalD\x02\x00\x00\x01:\x07"
    b"x-floatf?\xc0\x00\x00\x05x-intb-\x06x-listA\x00\x00\x00\x1db\x01S\x00\x00\x00\x03twoA\x00\x00\x00\x0eb\x03F"
    b"\x00\x00\x00\x07\x04fourb\x04\nx-negativeb\xf9\x06x-noneV\x08x-stringS\x00\x00\x00\x06h\xc3\xa9llo\x07x-tableF"
    b"\x00\x00\x00(\x06nestedF\x00\x00\x00\x1c\x06deeperF\x00\x00\x00\x10\x07`eepestS\x00\x00\x00\x03yes\x06x-timeT"
    b"\x00\x00\x00\x00e\x93}%\x02\x03\x06corr-3\x10fz-c002e78-reply\x0560000\x05msg-3\x02\x00\x00\x00f8\x81\xd9\x04"
    b"fuzz\nframe-fuzz\xce"
)


@pytest.mark.parametrize("header_frame", [APP_ID_NOT_UTF8, TIMESTAMP_PAST_9999], ids=["app_id", "timestamp"])
def test_properties_pamqp_cannot_decode_are_accepted_and_relayed_unchanged(header_frame):
    client = opened_client()
    client.send(1, commands.Queue.Declare(queue="fuzzed"))
    header = header_frame[:1] + b"\x00\x01" + header_frame[3:]  # on channel 1
    body = b"x" * struct.unpack_from(">Q", header, 11)[0]
    publish = raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x00\x06fuzzed\x00")
    send_raw(client, publish + header + raw_frame(3, 1, body))
    get = send_raw(client, raw_frame(1, 1, struct.pack(">HHH", 60, 70, 0) + b"\x06fuzzed\x01"))
    assert [frame_type for frame_type, _channel, _payload in get] == [1, 2, 3]  # get-ok, header, body
    assert get[1][2] == header[7:-1]  # byte for byte
    assert client.connection.state == OPEN


def test_a_user_id_that_is_not_utf8_is_refused_like_any_other_user_id():
    client = opened_client()
    properties = b"\x00\x10" + b"\x05gu\xffst"  # user_id only
    header = raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + properties)
    (close,) = client.send_bytes(raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x00\x01q\x00") + header)
    assert close[1].reply_code == 406
    assert close[1].reply_text == "PRECONDITION_FAILED - user_id property set to 'gu\ufffdst' but authenticated user was 'guest'"


# Found by the frame fuzzer (FRAME_FUZZ_SEED=2350756414): headers whose nested table has a name
# that is not UTF-8, or that hold a timestamp past 9999, passed the content header check (as
# on RabbitMQ) and failed the broker where it edits headers: adding x-death when dead-lettering
# and x-delivery-count for a queue with a delivery limit.
_ODD_FIELDS = b"\x01tF\x00\x00\x00\x08\x02\xf4xS\x00\x00\x00\x00" + b"\x04timeT" + struct.pack(">Q", 1 << 62)
ODD_HEADERS = struct.pack(">I", len(_ODD_FIELDS)) + _ODD_FIELDS


def _publish_with_odd_headers(client: FakeClient, queue: bytes) -> None:
    properties = b"\x20\x00" + ODD_HEADERS  # headers only
    header = raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + properties)
    publish = raw_frame(1, 1, struct.pack(">HHH", 60, 40, 0) + b"\x00" + bytes([len(queue)]) + queue + b"\x00")
    send_raw(client, publish + header + raw_frame(3, 1, b"x"))


def _get(client: FakeClient, queue: bytes) -> list[tuple[int, int, bytes]]:
    return send_raw(client, raw_frame(1, 1, struct.pack(">HHH", 60, 70, 0) + bytes([len(queue)]) + queue + b"\x00"))


def test_dead_lettering_keeps_header_fields_pamqp_cannot_decode():
    client = opened_client()
    client.send(1, commands.Queue.Declare(queue="dlq"))
    client.send(1, commands.Queue.Declare(
        queue="work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}))
    _publish_with_odd_headers(client, b"work")
    (_get_ok, (_type, _channel, _header), _body) = _get(client, b"work")
    send_raw(client, raw_frame(1, 1, struct.pack(">HHQB", 60, 90, 1, 0)))  # basic.reject, requeue=False
    dead = _get(client, b"dlq")
    assert [frame_type for frame_type, _channel, _payload in dead] == [1, 2, 3]
    assert b"x-death" in dead[1][2]
    assert ODD_HEADERS[4:20] in dead[1][2] and struct.pack(">Q", 1 << 62) in dead[1][2]  # byte for byte
    assert client.connection.state == OPEN


def test_a_delivery_limit_counts_deliveries_of_header_fields_pamqp_cannot_decode():
    client = opened_client()
    client.send(1, commands.Queue.Declare(queue="limited", arguments={"x-delivery-limit": 5}))
    _publish_with_odd_headers(client, b"limited")
    _get(client, b"limited")
    send_raw(client, raw_frame(1, 1, struct.pack(">HHQB", 60, 120, 1, 2)))  # basic.nack, requeue
    (get_ok, (_type, _channel, header), _body) = _get(client, b"limited")  # redelivered: counted
    assert get_ok[2][:4] == b"\x00\x3c\x00\x47"
    assert b"x-delivery-count" in header and struct.pack(">Q", 1 << 62) in header
    assert client.connection.state == OPEN
