"""A publish whose three frames arrive in one read is handled in one step (codec.FRAME_PUBLISH,
Channel.handle_publish), and that step does exactly what the frames do one by one: every
stream below gives the client the same bytes whether it arrives in one read (joined), a byte
at a time (never joined) or in chunks that cut it anywhere.
"""

from __future__ import annotations

import random
import struct

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqp_server.wire import codec
from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from amqp_server.wire.errors import AMQPError
from queues.queue import FLOW_HIGH
from tests.frame_driver import FakeClient, marshal, methods, opened_client, publish_frames, raw_frame, split_raw, unmarshal_all

BODY = b"b" * 40


def _publish(channel: int = 1, body: bytes = BODY, **options) -> bytes:
    return publish_frames(channel, body, **options)


# -- the reader -------------------------------------------------------------------------


def test_a_publish_read_whole_is_one_item_with_its_three_payloads():
    wire = _publish(routing_key="q")
    reader = codec.FrameReader(131072)
    reader.feed(wire + wire)
    items = list(reader.frames(whole_publishes=True))
    assert [(kind, channel) for kind, channel, _ in items] == [(codec.FRAME_PUBLISH, 1)] * 2
    reader.feed(wire)
    apart = list(reader.frames())
    assert items[0][2] == tuple(payload for _kind, _channel, payload in apart)
    assert [kind for kind, _channel, _payload in apart] == [codec.FRAME_METHOD, codec.FRAME_HEADER, codec.FRAME_BODY]


def _publish_then(*content) -> bytes:
    """A basic.publish method frame on channel 1, then `content` (pamqp frames) on channel 1."""
    return marshal(1, commands.Basic.Publish(routing_key="q"), *content)


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(_publish()[:-1], id="body frame not all read"),
        pytest.param(_publish_then(ContentHeader(body_size=0)), id="empty body"),
        pytest.param(_publish_then() + marshal(2, ContentHeader(body_size=1), ContentBody(b"x")),
                     id="content on another channel"),
        pytest.param(marshal(1, commands.Basic.Get(queue="q"), ContentHeader(body_size=1), ContentBody(b"x")),
                     id="another method"),
        pytest.param(_publish_then(ContentBody(b"x"), ContentHeader(body_size=1)), id="body before header"),
        pytest.param(_publish_then(ContentHeader(body_size=0), ContentBody(b"x")), id="empty body, then a body frame"),
        pytest.param(_publish_then(ContentHeader(body_size=0), ContentBody(b"")),
                     id="empty body, then an empty body frame"),
        pytest.param(_publish_then(ContentHeader(body_size=2), ContentBody(b"x")), id="the first of two body frames"),
        pytest.param(_publish_then(ContentHeader(body_size=1), ContentBody(b"xy")),
                     id="a body frame larger than declared"),
        # 12 bytes: class, weight, body size 5, and no property flags; then a body of 5
        pytest.param(_publish_then() + raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 5)) + marshal(1, ContentBody(b"12345")),
                     id="a header too short for its property flags"),
    ],
)
def test_frames_that_are_not_a_whole_publish_come_one_by_one(wire):
    reader = codec.FrameReader(131072)
    reader.feed(wire)
    joined = list(reader.frames(whole_publishes=True))
    assert codec.FRAME_PUBLISH not in [kind for kind, _channel, _payload in joined]
    reader = codec.FrameReader(131072)
    reader.feed(wire)
    assert joined == list(reader.frames())


def test_a_header_frame_with_a_bad_end_byte_is_refused_as_apart():
    wire = marshal(1, commands.Basic.Publish(routing_key="q"))
    header = marshal(1, ContentHeader(body_size=1))
    wire += header[:-1] + b"\x00" + marshal(1, ContentBody(b"x"))
    reader = codec.FrameReader(131072)
    reader.feed(wire)
    frames = reader.frames(whole_publishes=True)
    assert next(frames)[0] == codec.FRAME_METHOD
    with pytest.raises(AMQPError, match="invalid_frame_end_marker"):
        next(frames)


def test_a_body_frame_over_frame_max_is_refused_as_apart():
    wire = _publish(body=b"x" * 5000)
    reader = codec.FrameReader(4096)
    reader.feed(wire)
    frames = reader.frames(whole_publishes=True)
    assert [next(frames)[0], next(frames)[0]] == [codec.FRAME_METHOD, codec.FRAME_HEADER]
    with pytest.raises(AMQPError, match="frame_too_large"):
        next(frames)


# -- the connection: joined or apart, the client sees the same -------------------------


def _confirm_select(channel: int = 1) -> bytes:
    return marshal(channel, commands.Confirm.Select())


def _declare(queue: str, channel: int = 1) -> bytes:
    return marshal(channel, commands.Queue.Declare(queue=queue))


STREAMS = {
    "publishes to a consumer": _declare("q")
    + marshal(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True))
    + _publish(routing_key="q") * 3,
    "publishes with confirms and a return": _declare("q")
    + _confirm_select()
    + _publish(routing_key="q")
    + _publish(routing_key="nowhere", mandatory=True)
    + _publish(routing_key="q"),
    "publish to a missing exchange, then more on the closing channel": marshal(2, commands.Channel.Open())
    + _declare("q", channel=2)
    + _publish(exchange="missing")
    + _publish(routing_key="q")
    + marshal(1, commands.Channel.CloseOk())
    + _publish(routing_key="q"),
    "delivery_mode 3 is refused": marshal(1, commands.Basic.Publish(routing_key="q"))
    + raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 1, 0x1000) + b"\x03")
    + marshal(1, ContentBody(b"x"))
    + _publish(),
    "user_id of another user": _publish(properties=commands.Basic.Properties(user_id="someone-else")) + _publish(),
    "publish on a channel never opened": _publish(channel=5) + _publish(),
    "publish on channel 0": _publish(channel=0),
    "empty body, then a body frame out of turn": marshal(
        1, commands.Basic.Publish(routing_key="q"), ContentHeader(body_size=0)
    ) + _publish(),
    "a body in two frames": _declare("q")
    + marshal(1, commands.Basic.Publish(routing_key="q"), ContentHeader(body_size=6), ContentBody(b"abc"))
    + marshal(1, ContentBody(b"def"))
    + marshal(1, commands.Basic.Get(queue="q", no_ack=True)),
    "a body larger than declared": marshal(
        1, commands.Basic.Publish(routing_key="q"), ContentHeader(body_size=2), ContentBody(b"abc")
    ),
    "a publish while the last one's body is still due": marshal(
        1, commands.Basic.Publish(routing_key="q"), ContentHeader(body_size=6), ContentBody(b"abc")
    ) + _publish(),
    "a header of another class": marshal(1, commands.Basic.Publish(routing_key="q"))
    + raw_frame(2, 1, b"\x00\x32" + bytes(10) + b"\x00\x00")
    + marshal(1, ContentBody(b"ab")),
    "a message over the size limit": _publish(body=b"x" * 300),
    "the same publish before and after its exchange is deleted": marshal(
        1, commands.Exchange.Declare(exchange="x", exchange_type="direct"), commands.Queue.Declare(queue="q"),
        commands.Queue.Bind(queue="q", exchange="x", routing_key="k"),
    )
    + _publish(exchange="x", routing_key="k")
    + marshal(1, commands.Exchange.Delete(exchange="x"))
    + _publish(exchange="x", routing_key="k"),
    "publishes alternating between two keys": _declare("q")
    + _declare("r")
    + (_publish(routing_key="q") + _publish(routing_key="r") + _publish(routing_key="r", mandatory=True)) * 2
    + marshal(1, commands.Basic.Get(queue="r", no_ack=True)),
    "an undecodable publish method": raw_frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\x09")
    + marshal(1, ContentHeader(body_size=1), ContentBody(b"x")),
}


def _answers(stream: bytes, chunks: list[int] | None) -> tuple[bytes, int]:
    """What the broker writes for `stream` fed in reads of these sizes (None: one read), and the
    number of messages its queue "q" holds after."""
    config = ServerConfig()
    config.limits.max_message_size = 200
    client = opened_client(Broker(config))
    broker = client.broker
    if chunks is None:
        client.connection.receive_data(stream)
    else:
        at = 0
        for size in chunks:
            client.connection.receive_data(stream[at : at + size])
            at += size
        client.connection.receive_data(stream[at:])
    queue = broker.vhosts["/"].queues.get("q")
    return client.connection.take_output(), (queue.message_count if queue is not None else -1)


@pytest.mark.parametrize("name", list(STREAMS))
def test_a_stream_read_whole_answers_as_read_byte_by_byte_and_in_pieces(name):
    stream = STREAMS[name]
    whole = _answers(stream, None)
    assert whole == _answers(stream, [1] * len(stream))
    pieces = random.Random(name)
    for _ in range(5):
        chunks = []
        while sum(chunks) < len(stream):
            chunks.append(pieces.randint(1, 40))
        assert whole == _answers(stream, chunks)


def test_a_repeated_publish_method_finds_its_exchange_again_each_time():
    # Channel._publish_method keeps only the decoded fields of the last publish method (the
    # streams above would pass if it kept a stale exchange, read whole and apart alike): the
    # exchange is looked up, and its internal flag checked, for every publish.
    client = opened_client()
    queue_setup = (commands.Queue.Declare(queue="q"), commands.Queue.Bind(queue="q", exchange="x", routing_key="k"))
    client.send(1, commands.Exchange.Declare(exchange="x", exchange_type="direct"), *queue_setup)
    assert methods(client.publish(1, BODY, exchange="x", routing_key="k")) == []
    client.send(1, commands.Exchange.Delete(exchange="x"), commands.Exchange.Declare(exchange="x", internal=True))
    (close,) = methods(client.publish(1, BODY, exchange="x", routing_key="k"))
    assert (close.reply_code, close.reply_text) == (403, "ACCESS_REFUSED - cannot publish to internal exchange 'x' in vhost '/'")
    client.send(1, commands.Channel.CloseOk())
    client.open_channel(1)
    client.send(1, commands.Exchange.Delete(exchange="x"), commands.Exchange.Declare(exchange="x"), *queue_setup)
    assert methods(client.publish(1, BODY, exchange="x", routing_key="k")) == []
    client.send(1, commands.Exchange.Delete(exchange="x"))
    (close,) = methods(client.publish(1, BODY, exchange="x", routing_key="k"))
    assert (close.reply_code, close.reply_text) == (404, "NOT_FOUND - no exchange 'x' in vhost '/'")
    assert client.broker.vhosts["/"].queues["q"].message_count == 2


def test_an_undecodable_publish_method_closes_the_connection_with_501_read_whole_or_apart():
    # (The stream test above shows both ways answer alike; this, what they answer.)
    stream = STREAMS["an undecodable publish method"]
    for chunks in (None, [1] * len(stream)):
        output, _count = _answers(stream, chunks)
        (close,) = [method for _channel, method in unmarshal_all(output) if isinstance(method, commands.Connection.Close)]
        assert (close.reply_code, close.class_id, close.method_id) == (501, 60, 40)
        assert close.reply_text == "FRAME_ERROR - cannot decode <<0,0,9>>"


def test_an_empty_body_publish_that_congests_its_queue_holds_a_body_frame_after_it_as_apart():
    # Flow control holds a publisher at the frame that congested a queue (Connection.hold_input).
    # A publish with an empty body is routed at its header, so a body frame after it (out of
    # turn) waits with the held frames and is refused only once the queue drained, whether the
    # three frames came in one read or in three.
    stray = marshal(1, commands.Basic.Publish(routing_key="q"), ContentHeader(body_size=0), ContentBody(b"x"))
    frames = [raw_frame(kind, channel, payload) for kind, channel, payload in split_raw(stray)]

    def conversation(reads: list[bytes]) -> list[tuple[list, bool]]:
        publisher = opened_client()
        consumer = opened_client(publisher.broker)
        publisher.send_bytes(_declare("q"))
        consumer.send(1, commands.Basic.Qos(prefetch_count=1), commands.Basic.Consume(queue="q", consumer_tag="c"))
        publisher.send_bytes(b"".join(_publish(routing_key="q") for _ in range(FLOW_HIGH + 1)))
        connection = publisher.connection
        assert not connection.input_held, "the queue is not congested before the empty publish"
        for read in reads:
            connection.receive_data(read)
        held = (publisher.take_raw(), connection.input_held)
        tag = 1
        while connection.input_held and tag <= FLOW_HIGH:
            consumer.send(1, commands.Basic.Ack(delivery_tag=tag))
            tag += 1
        connection.resume_input()
        return [held, (publisher.take_raw(), connection.input_held)]

    apart = conversation(frames)
    assert apart[0] == ([], True), "held at the header that congested the queue, the body frame waiting"
    assert [(kind, channel) for kind, channel, _payload in apart[1][0]] == [(1, 0)], "then refused: connection.close"
    assert conversation([stray]) == apart


def _spy_on_frames(monkeypatch) -> list[tuple[bool, list[int]]]:
    """Each call of FrameReader.frames from now on: whether it joins, and the kinds it yields."""
    calls: list[tuple[bool, list[int]]] = []
    original = codec.FrameReader.frames

    def spying(reader, whole_publishes: bool = False):
        kinds: list[int] = []
        calls.append((whole_publishes, kinds))
        for item in original(reader, whole_publishes):
            kinds.append(item[0])
            yield item

    monkeypatch.setattr(codec.FrameReader, "frames", spying)
    return calls


def test_the_joined_path_is_taken_and_delivers(monkeypatch):
    client = opened_client()
    client.send_bytes(_declare("q") + marshal(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True)))
    calls = _spy_on_frames(monkeypatch)
    received = client.send_bytes(_publish(routing_key="q") * 2)
    assert calls == [(True, [codec.FRAME_PUBLISH] * 2)]
    assert [type(method) for method in methods(received)] == [commands.Basic.Deliver] * 2


def test_nothing_is_joined_before_the_connection_is_open_nor_while_an_alarm_waits(monkeypatch):
    client = FakeClient()
    client.start()
    calls = _spy_on_frames(monkeypatch)
    client.start_ok()
    assert calls[-1][0] is False  # handshake: the connection is not open yet
    client = opened_client()
    client.connection.alarm_changed("low on memory")
    client.send_bytes(_publish())
    assert calls[-1][0] is False  # the next publish blocks the connection at its method
    client.connection.alarm_changed(None)
    client.connection.resume_input()  # the shell's next turn: the held content goes through
    client.send_bytes(_publish())
    assert calls[-1] == (True, [codec.FRAME_PUBLISH])
