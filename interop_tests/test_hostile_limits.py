"""Limits a hostile client meets, over real TCP: what it can make the broker hold is bounded.

Frames before tune-ok are at most 4096 bytes (RabbitMQ 3.10 checked here: a bigger one gets no
reply, and the socket is dropped 3 s later, with "{frame_too_large,SIZE,4088}" in its log).
"""

from __future__ import annotations

import time

from pamqp import commands, header
from pamqp import frame as pamqp_frame

from interop_tests.raw_client import CLIENT_CAPABILITIES, RawClient, ServerClosedSocket

HANDSHAKE_TIMEOUT_S = 10.0
SILENT_CLOSE_S = 3.0  # RabbitMQ's SILENT_CLOSE_DELAY


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


def wait_for_log(broker, text: str) -> None:
    deadline = time.monotonic() + 10
    while text not in broker.log_text():
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{broker.log_text()[-3000:]}"
        time.sleep(0.02)


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
    wait_for_log(broker, f"{{frame_too_large,{len(frame) - 8},4088}}")


def test_a_socket_cannot_park_a_frame_of_the_brokers_frame_max_before_tune_ok(broker):
    """Today's finding: each anonymous socket could park 137 KiB until the handshake timeout."""
    witness = RawClient(broker.host, broker.port)
    witness.handshake()
    witness.open_channel(1)
    with greeted(broker) as client:
        # A frame header announcing 131,000 payload bytes, and most of them, never finished.
        client.send_bytes(b"\x01\x00\x00" + (131_000).to_bytes(4, "big") + b"\x00" * 100_000)
        assert_dropped_silently(client)
    wait_for_log(broker, "{frame_too_large,131000,4088}")
    assert witness.is_alive()
    witness.close()


def test_an_oversized_frame_after_start_ok_and_before_tune_ok_is_refused_too(broker):
    with greeted(broker) as client:
        client.send_bytes(start_ok_frame(10))
        client.expect(commands.Connection.Tune)
        client.send_bytes(b"\x01\x00\x00" + (5000).to_bytes(4, "big") + b"\x00" * 5000 + b"\xce")
        assert_dropped_silently(client)
    wait_for_log(broker, "{frame_too_large,5000,4088}")
