"""The 8-byte protocol header a client opens with, over a raw socket.

RabbitMQ 3.10 (checked against it with INTEROP_BROKER_URL) speaks 0-9-1 to the AMQP 0-9 header
`AMQP 1 1 0 9` that older clients such as aioamqp send, AMQP 0-8 to `AMQP 1 1 8 0` and
`AMQP 1 1 9 1` (test_amqp_0_8.py), and answers any other header with its own, `AMQP 0 0 9 1`,
then closes the socket at once. The log test needs this project's
broker (it reads the broker's log), so it starts its own.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from interop_tests.raw_client import RawClient

AMQP_0_9_1_HEADER = b"AMQP\x00\x00\x09\x01"
LEGACY_0_9_HEADER = b"AMQP\x01\x01\x00\x09"
CLOSE_DEADLINE_S = 2.0  # RabbitMQ closes right after its header; far less than its 3 s close delays

REFUSED = {
    "0-9-2": (b"AMQP\x00\x00\x09\x02", "{bad_version,{0,0,9,2}}"),
    "0-10": (b"AMQP\x01\x01\x00\x0a", "{bad_version,{1,1,0,10}}"),
    # Next to AMQP 0-8's two headers, which are spoken (test_amqp_0_8.py).
    "0-8-revision-1": (b"AMQP\x01\x01\x08\x01", "{bad_version,{1,1,8,1}}"),
    "amqp-1.0": (b"AMQP\x00\x01\x00\x00", "amqp1_0_plugin_not_enabled"),
    "amqp-1.0-sasl": (b"AMQP\x03\x01\x00\x00", "amqp1_0_plugin_not_enabled"),
    "http": (b"GET / HTTP/1.1\r\n\r\n", '{bad_header,<<"GET / HT">>}'),
}


def test_legacy_0_9_header_opens_a_working_connection(broker, unique):
    with RawClient(broker.host, broker.port) as client:
        client.send_bytes(LEGACY_0_9_HEADER)
        _, start = client.expect(commands.Connection.Start)
        assert (start.version_major, start.version_minor) == (0, 9)
        client.send(commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        _, tune = client.expect(commands.Connection.Tune)
        client.send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.send(commands.Connection.Open(virtual_host="/"))
        client.expect(commands.Connection.OpenOk)
        client.open_channel(1)
        client.send(commands.Queue.Declare(queue=unique("legacy-header"), exclusive=True), 1)
        _, declare_ok = client.expect(commands.Queue.DeclareOk)
        assert declare_ok.queue == unique("legacy-header")


@pytest.mark.parametrize("greeting", [value[0] for value in REFUSED.values()], ids=list(REFUSED))
def test_unsupported_header_is_answered_with_0_9_1_and_closed_at_once(broker, greeting):
    with RawClient(broker.host, broker.port) as client:
        client.send_bytes(greeting)
        assert client.read_bytes(8) == AMQP_0_9_1_HEADER
        client.wait_closed(timeout=CLOSE_DEADLINE_S)


def test_refused_header_is_logged_with_the_peer_and_what_it_sent(broker_factory):
    own = broker_factory()
    for greeting, reason in REFUSED.values():
        with RawClient(own.host, own.port) as client:
            client.send_bytes(greeting)
            client.read_bytes(8)
            client.wait_closed(timeout=CLOSE_DEADLINE_S)
            peer = "%s:%d" % client.sock.getsockname()
        expected = f"closing AMQP connection {peer} -> {own.host}:{own.port}: {reason}"
        assert any(line.endswith(expected) for line in own.log_text().splitlines()), expected
