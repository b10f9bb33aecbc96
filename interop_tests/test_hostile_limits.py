"""Limits a hostile client meets, over real TCP: what it can make the broker hold is bounded.

Frames before tune-ok are at most 4096 bytes (RabbitMQ 3.10 checked here: a bigger one gets no
reply, and the socket is dropped 3 s later, with "{frame_too_large,SIZE,4088}" in its log).
`[limits] max_connections` and `max_connections_per_listener` count every socket; one over a
limit is refused at connection.open with 530 and a text naming the limit.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pika
import pytest
from pamqp import commands, header
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from bench.procfs import rss_kib

from interop_tests.broker_process import TEST_CONFIG
from interop_tests.test_alarms_memory import HEADROOM, resting_size
from interop_tests.test_alarms_memory import start as alarm_broker
from interop_tests.raw_client import CLIENT_CAPABILITIES, RawClient, ServerClosedSocket

HANDSHAKE_TIMEOUT_S = 10.0
SILENT_CLOSE_S = 3.0  # RabbitMQ's SILENT_CLOSE_DELAY
SOCKETS_OVER_THE_LIMIT = 150


def start_ok_frame(product_size: int) -> bytes:
    start_ok = commands.Connection.StartOk(
        client_properties={"product": "x" * product_size, "capabilities": CLIENT_CAPABILITIES},
        mechanism="PLAIN",
        response="\0guest\0guest",
        locale="en_US",
    )
    return pamqp_frame.marshal(start_ok, 0)


def greeted(broker) -> RawClient:
    client = RawClient(broker.host, broker.port, timeout=HANDSHAKE_TIMEOUT_S)
    client.send(header.ProtocolHeader())
    client.expect(commands.Connection.Start)
    return client


def assert_dropped_silently(client: RawClient) -> float:
    """No frame comes back; the socket is closed after about RabbitMQ's 3 s, well before the
    handshake timeout. Returns the seconds waited."""
    start = time.monotonic()
    try:
        channel, reply = client.read_method(timeout=HANDSHAKE_TIMEOUT_S)
    except ServerClosedSocket:
        waited = time.monotonic() - start
        assert SILENT_CLOSE_S - 0.5 < waited < HANDSHAKE_TIMEOUT_S - 2, waited
        return waited
    raise AssertionError(f"expected the socket to be dropped, got {reply!r} on channel {channel}")


# -- frames before tune-ok -------------------------------------------------------


def test_a_start_ok_of_4088_payload_bytes_is_read(broker):
    frame = start_ok_frame(3900)
    frame = start_ok_frame(3900 + 4096 - len(frame))  # exactly 4088 payload bytes
    assert len(frame) == 4096
    with greeted(broker) as client:
        client.send_bytes(frame)
        client.expect(commands.Connection.Tune)


def test_a_start_ok_over_4096_bytes_is_refused_without_a_reply(broker):
    frame = start_ok_frame(4000)
    with greeted(broker) as client:
        client.send_bytes(frame)
        assert_dropped_silently(client)
    broker.wait_for_log(f"{{frame_too_large,{len(frame) - 8},4088}}")


def test_a_socket_cannot_park_a_frame_of_the_brokers_frame_max_before_tune_ok(broker):
    """Today's finding: each anonymous socket could park 137 KiB until the handshake timeout."""
    witness = RawClient(broker.host, broker.port)
    witness.handshake()
    witness.open_channel(1)
    with greeted(broker) as client:
        # A frame header announcing 131,000 payload bytes, and most of them, never finished.
        client.send_bytes(b"\x01\x00\x00" + (131_000).to_bytes(4, "big") + b"\x00" * 100_000)
        assert_dropped_silently(client)
    broker.wait_for_log("{frame_too_large,131000,4088}")
    assert witness.is_alive()
    witness.close()


def test_an_oversized_frame_after_start_ok_and_before_tune_ok_is_refused_too(broker):
    with greeted(broker) as client:
        client.send_bytes(start_ok_frame(10))
        client.expect(commands.Connection.Tune)
        client.send_bytes(b"\x01\x00\x00" + (5000).to_bytes(4, "big") + b"\x00" * 5000 + b"\xce")
        assert_dropped_silently(client)
    broker.wait_for_log("{frame_too_large,5000,4088}")


# -- connection limits -------------------------------------------------------------


def limited_broker(broker_factory, limits: str):
    return broker_factory(config_text=TEST_CONFIG + f"\n[limits]\n{limits}\n")


def first_connection(broker) -> pika.BlockingConnection:
    """The first connection, once the socket that probed the port at startup is gone (it holds a
    slot until the broker sees it close)."""
    return connect_when_a_slot_is_free(broker)


def pika_connect(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url()))


def refusal_of(broker) -> str:
    """pika reports a close at connection.open as it does for RabbitMQ's vhost connection limit:
    ProbableAccessDeniedError naming the broker's close; returns that close's text."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        pika_connect(broker)
    reported = str(refused.value)
    assert 'ConnectionClosedByBroker: (530) "' in reported, reported
    return reported.split('(530) "', 1)[1].rsplit('"', 1)[0]


def connect_when_a_slot_is_free(broker) -> pika.BlockingConnection:
    """The broker frees a slot when it sees the socket close, just after the client returns."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return pika_connect(broker)
        except pika.exceptions.ProbableAccessDeniedError:
            assert time.monotonic() < deadline, "no slot freed after a connection closed"
            time.sleep(0.05)


def test_max_connections_refuses_the_connection_over_it_at_open_and_says_why(broker_factory):
    """Today's finding: with max_connections = 5, 15 connections opened."""
    broker = limited_broker(broker_factory, "max_connections = 5")
    connections = [first_connection(broker)] + [pika_connect(broker) for _ in range(4)]
    for _ in range(10):
        text = refusal_of(broker)
        assert text == "NOT_ALLOWED - access to vhost '/' refused for user 'guest': broker connection limit (5) is reached"
    broker.wait_for_log("broker connection limit (5) is reached")
    # Those inside keep working, and a closed one makes room for a new one.
    connections[0].channel().queue_declare("", exclusive=True)
    connections.pop().close()
    connections.append(connect_when_a_slot_is_free(broker))
    refusal_of(broker)
    for connection in connections:
        connection.close()


def test_max_connections_per_listener_refuses_over_it_and_names_the_listener(broker_factory):
    broker = limited_broker(broker_factory, "max_connections_per_listener = 3")
    connections = [first_connection(broker)] + [pika_connect(broker) for _ in range(2)]
    text = refusal_of(broker)
    assert text == (
        f"NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
        f"listener 127.0.0.1:{broker.port} connection limit (3) is reached"
    )
    broker.wait_for_log(f"listener 127.0.0.1:{broker.port} connection limit (3) is reached")
    for connection in connections:
        connection.close()


def test_sockets_still_in_their_handshake_count_against_the_limit(broker_factory):
    """An anonymous socket holds memory and a descriptor as an open connection does."""
    broker = limited_broker(broker_factory, "max_connections = 2")
    opened = first_connection(broker)
    with greeted(broker):  # said the protocol header, never logs in
        refusal_of(broker)
    connect_when_a_slot_is_free(broker).close()
    opened.close()


def test_a_socket_waiting_after_a_refused_login_counts_against_the_limit(broker_factory):
    broker = limited_broker(broker_factory, "max_connections = 2")
    opened = first_connection(broker)
    with greeted(broker) as refused:
        refused.send(
            commands.Connection.StartOk(
                client_properties={"product": "raw_client", "capabilities": CLIENT_CAPABILITIES},
                mechanism="PLAIN",
                response="\0guest\0wrong",
                locale="en_US",
            )
        )
        _, close = refused.expect(commands.Connection.Close)
        assert close.reply_code == 403
        # No close-ok: the broker keeps the socket a while, and it keeps its slot.
        assert "broker connection limit (2) is reached" in refusal_of(broker)
    connect_when_a_slot_is_free(broker).close()
    opened.close()


def test_sockets_over_the_limit_cannot_pile_up_waiting_for_their_refusal(broker_factory):
    """A few over the limit wait for their refusal at connection.open; the rest are closed at once."""
    broker = limited_broker(broker_factory, "max_connections = 1")
    opened = first_connection(broker)
    clients = [RawClient(broker.host, broker.port) for _ in range(SOCKETS_OVER_THE_LIMIT)]
    answered = 0
    for client in clients:
        try:
            client.send(header.ProtocolHeader())
            client.expect(commands.Connection.Start)
            answered += 1
        except (ServerClosedSocket, OSError):
            pass
    assert 0 < answered <= SOCKETS_OVER_THE_LIMIT // 2, answered
    broker.wait_for_log("connection(s) at accept")
    for client in clients:
        client.close()
    opened.channel().queue_declare("", exclusive=True)
    opened.close()


# -- a client that does not read -------------------------------------------------------

UNREAD_BODY = os.urandom(64 * 1024)
UNREAD_PUBLISH_AT_MOST = 256 * 1024 * 1024
SEND_TIMEOUT_MS = 3000
QUEUED_MESSAGES = 100_000  # of 2 KiB: 200 MiB


class NeverReadingPublisher(threading.Thread):
    """Publishes mandatory messages nobody can route (each comes back as basic.return), as fast as
    the broker takes them, and never reads a byte."""

    def __init__(self, broker) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(broker.host, broker.port)
        self.client.handshake()
        self.client.open_channel(1)
        self.client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.client.sock.settimeout(60)
        publish = commands.Basic.Publish(exchange="", routing_key="no-such-queue", mandatory=True)
        self.message = (
            pamqp_frame.marshal(publish, 1)
            + pamqp_frame.marshal(ContentHeader(body_size=len(UNREAD_BODY)), 1)
            + pamqp_frame.marshal(ContentBody(UNREAD_BODY), 1)
        )
        self.sent = 0
        self.closed_by_broker = threading.Event()

    def run(self) -> None:
        try:
            while self.sent < UNREAD_PUBLISH_AT_MOST:
                self.client.sock.sendall(self.message)
                self.sent += len(self.message)
        except OSError:
            self.closed_by_broker.set()


def test_a_client_that_never_reads_its_returns_is_paused_then_closed_and_holds_little_memory(broker_factory):
    """Today's finding: 512 MiB of mandatory unroutable publishes with nothing read held 392-509 MiB
    of basic.return frames in the broker."""
    broker = limited_broker(broker_factory, f"send_timeout_ms = {SEND_TIMEOUT_MS}")
    witness = pika_connect(broker)
    channel = witness.channel()
    channel.queue_declare("", exclusive=True)
    resting_kib = rss_kib(broker.process.pid)

    hostile = NeverReadingPublisher(broker)
    started = time.monotonic()
    hostile.start()
    peak_kib, slowest_s = resting_kib, 0.0
    while hostile.is_alive() and time.monotonic() - started < 60:
        before = time.monotonic()
        channel.queue_declare("", exclusive=True)  # the other client keeps getting answers
        slowest_s = max(slowest_s, time.monotonic() - before)
        peak_kib = max(peak_kib, rss_kib(broker.process.pid))
        time.sleep(0.05)
    hostile.join(5)

    assert hostile.closed_by_broker.is_set(), f"sent {hostile.sent >> 20} MiB and was never closed"
    assert hostile.sent < 64 * 1024 * 1024, f"the broker read {hostile.sent >> 20} MiB it had to answer unread"
    assert (peak_kib - resting_kib) * 1024 < 64 * 1024 * 1024, f"RSS grew by {(peak_kib - resting_kib) >> 10} MiB"
    assert slowest_s < 1.0, slowest_s
    broker.wait_for_log("client is not reading, nothing could be sent to it for 3s")
    assert witness.is_open
    witness.close()


# -- bodies in flight during a memory alarm ---------------------------------------------

IN_FLIGHT_CHANNELS = 64
IN_FLIGHT_BODY = 2 * 1024 * 1024  # 128 MiB announced in all, under the 256 MiB max_content_in_flight
BODY_FRAME = 128 * 1024 - 8
PACE_BYTES_PER_S = 25 * 1024 * 1024  # the broker checks memory once a second


class InterleavedPublisher(threading.Thread):
    """Starts IN_FLIGHT_CHANNELS publishes (method and content header each), then sends their
    bodies interleaved, a frame per channel in turn: paced until `unpaced` is set, then as fast
    as the broker reads them."""

    def __init__(self, broker) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(broker.host, broker.port)
        self.client.handshake()
        for channel in range(1, IN_FLIGHT_CHANNELS + 1):
            self.client.open_channel(channel)
        self.client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        self.client.sock.settimeout(60)
        self.sent = 0
        self.unpaced = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        sock = self.client.sock
        try:
            for channel in range(1, IN_FLIGHT_CHANNELS + 1):
                sock.sendall(
                    pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key="in-flight-q"), channel)
                    + pamqp_frame.marshal(ContentHeader(body_size=IN_FLIGHT_BODY), channel)
                )
            began = time.monotonic()
            for offset in range(0, IN_FLIGHT_BODY, BODY_FRAME):
                chunk = os.urandom(min(BODY_FRAME, IN_FLIGHT_BODY - offset))
                for channel in range(1, IN_FLIGHT_CHANNELS + 1):
                    sock.sendall(pamqp_frame.marshal(ContentBody(chunk), channel))
                    self.sent += len(chunk)
                    if not self.unpaced.is_set():
                        time.sleep(max(0.0, self.sent / PACE_BYTES_PER_S - (time.monotonic() - began)))
            self.done.set()
        except OSError:
            pass


def test_a_memory_alarm_stops_the_bodies_of_publishes_already_in_flight(broker_factory):
    """Today's finding: with the watermark at 256 MiB, a connection that had started 64 publishes
    before the alarm went on sending their bodies, and the broker read 520-592 MiB more."""
    watermark = resting_size(broker_factory) + HEADROOM
    broker = alarm_broker(broker_factory, f"memory_high_watermark_bytes = {watermark}")
    setup = pika_connect(broker)
    setup.channel().queue_declare("in-flight-q")
    publisher = InterleavedPublisher(broker)
    publisher.start()

    deadline = time.monotonic() + 30
    while "memory resource limit alarm set" not in broker.log_text():
        assert not publisher.done.is_set() and time.monotonic() < deadline, (
            f"no memory alarm after {publisher.sent >> 20} MiB of bodies"
        )
        time.sleep(0.02)
    sent_at_alarm = publisher.sent
    publisher.unpaced.set()
    publisher.join(3.0)  # as fast as the broker reads: all 128 MiB in well under this if it reads
    read_after_alarm = publisher.sent - sent_at_alarm

    assert read_after_alarm < 16 * 1024 * 1024, f"the broker read {read_after_alarm >> 20} MiB more after the alarm"
    # Those who only consume are not blocked: the setup connection still gets answers.
    setup.channel().queue_declare("in-flight-q", passive=True)
    publisher.client.close()
    setup.close()


def test_one_connection_cannot_announce_more_than_max_content_in_flight_across_its_channels(broker):
    """Before: channel_max x max_message_size (2047 x 128 MiB) could be announced and held."""
    largest = 128 * 1024 * 1024  # the default max_message_size
    with RawClient(broker.host, broker.port) as client:
        client.handshake()
        for channel in (1, 2, 3):
            client.open_channel(channel)
            client.send(commands.Basic.Publish(exchange="", routing_key="nowhere"), channel)
            client.send(ContentHeader(body_size=largest), channel)
            client.send(ContentBody(b"x"), channel)  # begun: the broker holds it until the rest comes
        channel, close = client.expect(commands.Channel.Close)
        assert channel == 3 and close.reply_code == 406
        assert close.reply_text == (
            "PRECONDITION_FAILED - content in flight on this connection would reach 402653184 bytes, "
            "more than the configured max_content_in_flight 268435456"
        )
        client.send(commands.Channel.CloseOk(), 3)
        client.send(ContentBody(b"y"), 1)  # the publishes that fit go on
        client.send(commands.Channel.Open(), 3)
        assert client.expect(commands.Channel.OpenOk)[0] == 3


def test_a_consumer_that_never_reads_does_not_get_a_whole_queue_moved_into_memory(broker_factory):
    """One dispatch round used to write every message a no-ack consumer without prefetch could
    take into the output buffer: 200 MiB queued grew the broker by 171 MiB and stalled it 0.36 s."""
    broker = limited_broker(broker_factory, f"send_timeout_ms = {SEND_TIMEOUT_MS}")
    witness = first_connection(broker)
    channel = witness.channel()
    channel.queue_declare("unread-q")
    body = os.urandom(2048)
    for _ in range(QUEUED_MESSAGES):
        channel.basic_publish("", "unread-q", body)
    channel.queue_declare("unread-q", passive=True)
    resting_kib = rss_kib(broker.process.pid)

    with RawClient(broker.host, broker.port) as consumer:
        consumer.handshake()
        consumer.open_channel(1)
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        consumer.send(commands.Basic.Consume(queue="unread-q", no_ack=True), 1)
        peak_kib, slowest_s = resting_kib, 0.0
        for _ in range(30):
            before = time.monotonic()
            channel.queue_declare("unread-q", passive=True)
            slowest_s = max(slowest_s, time.monotonic() - before)
            peak_kib = max(peak_kib, rss_kib(broker.process.pid))
            time.sleep(0.03)
        broker.wait_for_log("client is not reading, nothing could be sent to it for 3s")

    assert (peak_kib - resting_kib) * 1024 < 48 * 1024 * 1024, f"RSS grew by {(peak_kib - resting_kib) >> 10} MiB"
    assert slowest_s < 0.2, slowest_s
    witness.close()
