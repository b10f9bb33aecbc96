"""Protocol-level behaviour checked with hand-made frames (see raw_client.py).

Each misbehaving connection is accompanied by a `witness` connection opened
before it; after the error the witness must still get answers, so a bad peer
can neither stall nor crash the server. Where RabbitMQ's reply text embeds
Erlang terms, only the code and the text's prefix are asserted and the full
RabbitMQ 3.10 text is recorded in a comment.
"""

from __future__ import annotations

import os
import time

import pytest
from pamqp import commands, constants, frame, header, heartbeat
from pamqp.body import ContentBody

from interop_tests.raw_client import RawClient, ServerClosedSocket, method_payload, raw_frame

AMQP_0_9_1_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_DEADLINE_S = 6.0  # heartbeat=1: two missed beats plus scheduling slack
CLOSE_DEADLINE_S = 10.0  # RabbitMQ stops reading after a frame error and drops the socket ~3 s later


@pytest.fixture
def witness(broker):
    """A healthy connection with channel 1 open, made before the test misbehaves."""
    with RawClient(broker.host, broker.port) as client:
        client.handshake()
        client.open_channel(1)
        yield client


@pytest.fixture
def client(broker):
    with RawClient(broker.host, broker.port) as client:
        yield client


def hard_error(client: RawClient) -> tuple[int, str, int, int]:
    """Expect connection.close, answer close-ok, expect the socket to close; return the close fields."""
    close = client.expect_connection_close()
    client.wait_closed(timeout=CLOSE_DEADLINE_S)
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def connection_ends(client: RawClient) -> commands.Connection.Close | None:
    """The connection ends one way or the other: a connection.close (returned) or a dropped socket (None)."""
    try:
        _, reply = client.read_method(timeout=CLOSE_DEADLINE_S)
    except ServerClosedSocket:
        return None
    assert isinstance(reply, commands.Connection.Close), f"expected the connection to end, got {reply!r}"
    return reply


def opened(client: RawClient, **tune: int) -> RawClient:
    client.handshake(**tune)
    client.open_channel(1)
    return client


# -- protocol header -------------------------------------------------------------


@pytest.mark.parametrize("greeting", [b"AMQP\x00\x00\x08\x00", b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n\r\n"])
def test_unsupported_protocol_header_gets_the_servers_header_and_a_close(witness, client, greeting):
    client.send_bytes(greeting)

    assert client.read_bytes(8) == AMQP_0_9_1_HEADER
    client.wait_closed(timeout=CLOSE_DEADLINE_S)
    assert witness.is_alive()


def test_handshake_advertises_rabbitmq_capabilities(client):
    client.send(header.ProtocolHeader())
    _, start = client.expect(commands.Connection.Start)

    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "AMQPLAIN PLAIN"  # RabbitMQ's order
    assert "en_US" in start.locales.split()
    capabilities = start.server_properties["capabilities"]
    for capability in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
                       "connection.blocked", "consumer_priorities", "authentication_failure_close",
                       "per_consumer_qos", "direct_reply_to"):
        assert capabilities.get(capability) is True, capability


def test_pipelined_handshake_and_publish_in_one_write_works(client, unique):
    queue = unique("pipelined")
    client.send(header.ProtocolHeader())
    client.expect(commands.Connection.Start)
    burst = b"".join([
        frame.marshal(commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"), 0),
        # RabbitMQ 3.10 refuses channel_max=0 ("no limit") in tune-ok; echo its 2047.
        frame.marshal(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0),
        frame.marshal(commands.Connection.Open(virtual_host="/"), 0),
        frame.marshal(commands.Channel.Open(), 1),
        frame.marshal(commands.Queue.Declare(queue=queue, exclusive=True), 1),
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1),
        frame.marshal(header.ContentHeader(body_size=5), 1),
        frame.marshal(ContentBody(b"hello"), 1),
        frame.marshal(commands.Basic.Get(queue=queue, no_ack=True), 1),
    ])
    client.send_bytes(burst)

    for expected in (commands.Connection.Tune, commands.Connection.OpenOk, commands.Channel.OpenOk,
                     commands.Queue.DeclareOk, commands.Basic.GetOk):
        client.expect(expected)
    _, content_header = client.expect(header.ContentHeader)
    _, body = client.expect(ContentBody)
    assert (content_header.body_size, body.value) == (5, b"hello")


def test_frames_split_into_single_bytes_are_reassembled(client, unique):
    opened(client)
    queue = unique("byte-by-byte")
    data = frame.marshal(commands.Queue.Declare(queue=queue, exclusive=True), 1)

    for index in range(len(data)):
        client.send_bytes(data[index:index + 1])

    _, declare_ok = client.expect(commands.Queue.DeclareOk)
    assert declare_ok.queue == queue


def test_client_connection_close_gets_close_ok(client):
    opened(client)

    client.send(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))

    client.expect(commands.Connection.CloseOk)
    # RabbitMQ 3.10 then leaves closing the socket to the client.


# -- broken frames -----------------------------------------------------------------


def test_unknown_frame_type_is_501(witness, client):
    opened(client)

    client.send_bytes(raw_frame(9, 0, b"abc"))

    code, text, class_id, method_id = hard_error(client)
    # RabbitMQ 3.10: 'FRAME_ERROR - type 9, all octets = <<"abc">>: unknown_frame'
    assert (code, class_id, method_id) == (501, 0, 0)
    assert text.startswith("FRAME_ERROR - ")
    assert witness.is_alive()


def test_bad_frame_end_byte_is_501(witness, client):
    opened(client)
    declare = method_payload(50, 10, b"\x00\x00" + b"\x00" + b"\x00" + b"\x00\x00\x00\x00")

    client.send_bytes(raw_frame(constants.FRAME_METHOD, 1, declare, frame_end=0xAB))

    code, text, class_id, method_id = hard_error(client)
    # RabbitMQ 3.10: 'FRAME_ERROR - type 1, all octets = <<0,50,0,10,...>>: {invalid_frame_end_marker,171}'
    assert (code, class_id, method_id) == (501, 0, 0)
    assert text.startswith("FRAME_ERROR - ")
    assert witness.is_alive()


def test_truncated_method_arguments_are_501(witness, client):
    opened(client)

    client.send_bytes(raw_frame(constants.FRAME_METHOD, 1, method_payload(50, 10, b"\x00")))

    code, text, class_id, method_id = hard_error(client)
    # RabbitMQ 3.10: 'FRAME_ERROR - cannot decode <<0>>', class 50 method 10
    assert code == 501
    assert text.startswith("FRAME_ERROR - ")
    assert witness.is_alive()


def test_frame_larger_than_negotiated_frame_max_is_501(witness, client):
    opened(client, frame_max=8192)
    client.send(commands.Basic.Publish(exchange="", routing_key="anything"), 1)
    client.send(header.ContentHeader(body_size=9000), 1)

    client.send_bytes(raw_frame(constants.FRAME_BODY, 1, b"x" * 9000))

    code, text, class_id, method_id = hard_error(client)
    # RabbitMQ 3.10: 'FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9000,8184}'
    assert (code, class_id, method_id) == (501, 0, 0)
    assert text.startswith("FRAME_ERROR - ")
    assert witness.is_alive()


@pytest.mark.parametrize(("class_id", "method_id"), [(50, 99), (77, 10)])
def test_unknown_class_or_method_id_ends_the_connection(witness, client, class_id, method_id):
    opened(client)

    client.send_bytes(raw_frame(constants.FRAME_METHOD, 1, method_payload(class_id, method_id, b"\x00" * 8)))

    # RabbitMQ 3.10's reader crashes with {unknown_method_id,{50,99}} and drops the
    # socket without a connection.close; a hard-error close (503 COMMAND_INVALID or
    # 540 NOT_IMPLEMENTED) is the polite equivalent.
    close = connection_ends(client)
    assert close is None or close.reply_code in (503, 540)
    assert witness.is_alive()


# -- frames out of sequence ------------------------------------------------------------


UNEXPECTED_FRAME = "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
OUT_OF_SEQUENCE_FRAMES = {
    # case: (open channel 1 first?, frame, channel number it is sent on, expected (code, text, class_id, method_id))
    "method-on-an-unopened-channel-is-504": (
        False, commands.Queue.Declare(queue="", exclusive=True), 3,
        (504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)),
    "opening-an-open-channel-again-is-504": (
        True, commands.Channel.Open(), 1,
        (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)),
    "channel-method-on-channel-zero-is-504": (
        False, commands.Queue.Declare(queue="", exclusive=True), 0,
        (504, "CHANNEL_ERROR - unexpected method in connection state running", 50, 10)),
    "connection-method-on-a-channel-is-503": (
        True, commands.Connection.Open(virtual_host="/"), 1,
        (503, "COMMAND_INVALID - unimplemented method", 10, 40)),
    "content-body-without-header-is-505": (
        True, ContentBody(b"orphan body"), 1,
        (505, UNEXPECTED_FRAME, 0, 0)),
    "content-header-without-publish-is-505": (
        True, header.ContentHeader(body_size=5), 1,
        (505, UNEXPECTED_FRAME, 0, 0)),
}


@pytest.mark.parametrize("case", OUT_OF_SEQUENCE_FRAMES)
def test_frame_out_of_sequence_is_a_hard_error(witness, client, case):
    open_channel, out_of_sequence, channel, expected_close = OUT_OF_SEQUENCE_FRAMES[case]
    if open_channel:
        opened(client)
    else:
        client.handshake()

    client.send(out_of_sequence, channel)

    assert hard_error(client) == expected_close
    assert witness.is_alive()


def test_method_where_content_body_is_expected_is_505(witness, client):
    opened(client)
    client.send(commands.Basic.Publish(exchange="", routing_key="anything"), 1)
    client.send(header.ContentHeader(body_size=10), 1)

    client.send(commands.Queue.Declare(queue="", exclusive=True), 1)

    assert hard_error(client) == (
        505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead", 60, 40)
    assert witness.is_alive()


def test_heartbeat_on_a_non_zero_channel_is_505(witness, client):
    opened(client)

    client.send_heartbeat(channel=1)

    code, text, class_id, method_id = hard_error(client)
    # RabbitMQ 3.10: 'UNEXPECTED_FRAME - type 8, all octets = <<>>'
    assert (code, class_id, method_id) == (505, 0, 0)
    assert text.startswith("UNEXPECTED_FRAME - ")
    assert witness.is_alive()


# -- methods pika will not send -------------------------------------------------------------


def test_reusing_a_consumer_tag_on_a_channel_is_530(witness, client):
    opened(client)
    client.send(commands.Queue.Declare(queue="", exclusive=True), 1)
    _, declare_ok = client.expect(commands.Queue.DeclareOk)
    client.send(commands.Basic.Consume(queue=declare_ok.queue, consumer_tag="dup"), 1)
    client.expect(commands.Basic.ConsumeOk)

    client.send(commands.Basic.Consume(queue=declare_ok.queue, consumer_tag="dup"), 1)

    assert hard_error(client) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'dup'", 60, 20)
    assert witness.is_alive()


def test_publish_with_immediate_is_540(witness, client):
    opened(client)

    client.send(commands.Basic.Publish(exchange="", routing_key="anything", immediate=True), 1)
    client.send(header.ContentHeader(body_size=1), 1)
    client.send(ContentBody(b"x"), 1)

    assert hard_error(client) == (540, "NOT_IMPLEMENTED - immediate=true", 60, 40)
    assert witness.is_alive()


def test_channel_flow_stop_is_not_implemented_and_flow_start_is_acknowledged(witness, broker):
    with RawClient(broker.host, broker.port) as starting:
        opened(starting)
        starting.send(commands.Channel.Flow(active=True), 1)
        _, flow_ok = starting.expect(commands.Channel.FlowOk)
        assert flow_ok.active is True

    with RawClient(broker.host, broker.port) as stopping:
        opened(stopping)
        stopping.send(commands.Channel.Flow(active=False), 1)
        assert hard_error(stopping) == (540, "NOT_IMPLEMENTED - active=false", 20, 20)
    assert witness.is_alive()


def test_confirm_select_twice_is_acknowledged_twice(client):
    opened(client)

    for _ in range(2):
        client.send(commands.Confirm.Select(), 1)
        client.expect(commands.Confirm.SelectOk)


def test_server_generated_consumer_tags_start_with_amq_ctag(client):
    opened(client)
    client.send(commands.Queue.Declare(queue="", exclusive=True), 1)
    _, declare_ok = client.expect(commands.Queue.DeclareOk)

    client.send(commands.Basic.Consume(queue=declare_ok.queue), 1)

    _, consume_ok = client.expect(commands.Basic.ConsumeOk)
    assert consume_ok.consumer_tag.startswith("amq.ctag-")


# -- tuning ----------------------------------------------------------------------------


def test_server_proposes_rabbitmq_defaults(client):
    tune = client.handshake()

    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


def test_tune_ok_with_frame_max_4096_is_accepted_and_used(witness, client, unique):
    opened(client, frame_max=4096)
    queue = unique("fm4096")
    client.send(commands.Queue.Declare(queue=queue, exclusive=True), 1)
    client.expect(commands.Queue.DeclareOk)
    body = os.urandom(4096 * 3)
    client.send(commands.Basic.Publish(exchange="", routing_key=queue), 1)
    client.send(header.ContentHeader(body_size=len(body)), 1)
    for start in range(0, len(body), 4096 - 8):
        client.send(ContentBody(body[start:start + 4096 - 8]), 1)

    client.send(commands.Basic.Get(queue=queue, no_ack=True), 1)

    client.expect(commands.Basic.GetOk)
    client.expect(header.ContentHeader)
    received = b""
    while len(received) < len(body):
        _, chunk = client.expect(ContentBody)
        assert len(chunk.value) <= 4096 - 8  # the server splits at the negotiated size
        received += chunk.value
    assert received == body
    assert witness.is_alive()


def test_tune_ok_with_frame_max_below_the_minimum_ends_the_connection(witness, client):
    client.send(header.ProtocolHeader())
    client.expect(commands.Connection.Start)
    client.send(commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"))
    client.expect(commands.Connection.Tune)

    client.send(commands.Connection.TuneOk(channel_max=0, frame_max=1000, heartbeat=0))

    # RabbitMQ 3.10 logs "negotiated frame_max = 1000 is lower than the minimum
    # allowed value (4096)" and drops the socket; a hard-error close is equivalent.
    close = connection_ends(client)
    assert close is None or close.reply_code in (501, 503, 530)
    assert witness.is_alive()


def test_opening_more_channels_than_channel_max_is_530(witness, client):
    client.handshake(channel_max=2)
    client.open_channel(1)
    client.open_channel(2)

    client.send(commands.Channel.Open(), 3)

    # RabbitMQ 3.10 counts open channels (channel numbers above channel_max are not
    # refused by number as long as fewer than channel_max channels are open).
    assert hard_error(client) == (
        530, "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)", 0, 0)
    assert witness.is_alive()


# -- heartbeats -------------------------------------------------------------------------


def test_silent_client_with_heartbeat_1_is_disconnected(witness, client):
    client.handshake(heartbeat_s=1)

    waited = client.wait_closed(timeout=HEARTBEAT_DEADLINE_S)

    assert waited < HEARTBEAT_DEADLINE_S
    assert witness.is_alive()


def test_server_sends_heartbeats_at_the_negotiated_interval(client):
    client.handshake(heartbeat_s=1)

    _, received = client.read_frame(timeout=3)

    assert isinstance(received, heartbeat.Heartbeat)


def test_client_that_sends_heartbeats_stays_connected(client):
    opened(client, heartbeat_s=1)
    stay_until = time.monotonic() + 3.5  # well past two missed intervals
    while (remaining := stay_until - time.monotonic()) > 0:
        client.send_heartbeat()
        try:
            client.read_frame(timeout=min(0.5, remaining))  # the server's heartbeats
        except TimeoutError:
            pass

    assert client.is_alive()


def test_client_with_heartbeat_0_is_not_disconnected_for_silence(client):
    opened(client, heartbeat_s=0)

    with pytest.raises(TimeoutError):
        client.read_frame(timeout=1.5)  # no heartbeats, no close
    assert client.is_alive()


@pytest.mark.skipif(bool(os.environ.get("INTEROP_BROKER_URL")), reason="needs this project's broker configuration")
def test_server_configured_heartbeat_is_proposed_and_enforced(broker_factory):
    from interop_tests.broker_process import TEST_CONFIG

    quick = broker_factory(TEST_CONFIG + "\n[limits]\nheartbeat = 1\n")
    with RawClient(quick.host, quick.port) as silent:
        tune = silent.handshake(heartbeat_s=None)  # accept the server's proposal
        assert tune.heartbeat == 1

        assert silent.wait_closed(timeout=HEARTBEAT_DEADLINE_S) < HEARTBEAT_DEADLINE_S
