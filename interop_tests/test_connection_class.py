"""Connection-class methods and frames out of turn, over a raw socket, as RabbitMQ 3.10 answers them
(checked with INTEROP_BROKER_URL).

Once a connection is open only connection.close and connection.update-secret are accepted on
channel 0; anything else of the class (a second login, tune or open, a close-ok nobody asked
for, blocked/unblocked from the client) closes the connection with 504 'unexpected method in
connection state running', naming the method. Before the client has logged in and tuned, a frame
out of turn gets no reply at all and the socket goes 3 s later; after tuning, a method other than
connection.open is 504 (state "opening") and a channel frame 505.
"""

from __future__ import annotations

import time

import pytest
from pamqp import commands, header

from interop_tests.raw_client import RawClient, ServerClosedSocket

CLOSE_DEADLINE_S = 10.0
UNEXPECTED = "CHANNEL_ERROR - unexpected method in connection state running"

METHODS = {
    "start-ok": commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"),
    "tune-ok": commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
    "open": commands.Connection.Open(virtual_host="/"),
    "secure-ok": commands.Connection.SecureOk(response="x"),
    "start": commands.Connection.Start(),
    "close-ok": commands.Connection.CloseOk(),
    "blocked": commands.Connection.Blocked(reason="client"),
    "unblocked": commands.Connection.Unblocked(),
    "update-secret-ok": commands.Connection.UpdateSecretOk(),
}


@pytest.mark.parametrize("method", list(METHODS.values()), ids=list(METHODS))
def test_a_connection_method_out_of_turn_closes_the_connection_with_504(broker, method):
    with RawClient(broker.host, broker.port) as witness, RawClient(broker.host, broker.port) as client:
        witness.handshake()
        witness.open_channel(1)
        client.handshake()
        client.send(method)
        close = client.expect_connection_close()
        client.wait_closed(timeout=CLOSE_DEADLINE_S)

        class_id, method_id = method.index >> 16, method.index & 0xFFFF
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            504, UNEXPECTED, class_id, method_id)
        assert witness.is_alive()


# -- during the handshake -------------------------------------------------------------

SILENT_CLOSE_S = 3.0  # RabbitMQ's SILENT_CLOSE_DELAY


def greeted(broker, logged_in: bool) -> RawClient:
    client = RawClient(broker.host, broker.port, timeout=CLOSE_DEADLINE_S)
    client.send(header.ProtocolHeader())
    client.expect(commands.Connection.Start)
    if logged_in:
        client.send(commands.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest"))
        client.expect(commands.Connection.Tune)
    return client


@pytest.mark.parametrize("logged_in", [False, True], ids=["starting", "tuning"])
@pytest.mark.parametrize(
    ("channel", "method"),
    [
        (0, commands.Connection.Open(virtual_host="/")),
        (0, commands.Connection.Close(200, "bye", 0, 0)),
        (1, commands.Channel.Open()),
    ],
    ids=["open", "close", "channel-open"],
)
def test_a_frame_out_of_turn_before_tuning_gets_no_reply_and_the_socket_goes_after_3_s(
    broker, logged_in, channel, method
):
    with greeted(broker, logged_in) as client:
        client.send(method, channel)
        start = time.monotonic()
        with pytest.raises(ServerClosedSocket):
            got = client.read_frame(timeout=CLOSE_DEADLINE_S)
            pytest.fail(f"expected no reply, got {got!r}")
        assert SILENT_CLOSE_S - 0.5 < time.monotonic() - start < SILENT_CLOSE_S + 2.5


def test_anything_but_open_after_tuning_is_504_naming_the_method(broker):
    with greeted(broker, logged_in=True) as client:
        client.send(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        client.send(commands.Connection.Close(200, "bye", 0, 0))
        close = client.expect_connection_close()
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            504, "CHANNEL_ERROR - unexpected method in connection state opening", 10, 50)


def test_a_channel_frame_after_tuning_but_before_open_is_505(broker):
    with greeted(broker, logged_in=True) as client:
        client.send(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        client.send(commands.Channel.Open(), 1)
        close = client.expect_connection_close()
        assert (close.reply_code, close.reply_text) == (505, "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,1,48>>")


def test_channel_open_ok_carries_an_empty_channel_id(broker):
    """pamqp's default is "0"; RabbitMQ sends the deprecated field empty."""
    with RawClient(broker.host, broker.port) as client:
        client.handshake()
        client.send(commands.Channel.Open(), 1)
        _, open_ok = client.expect(commands.Channel.OpenOk)
        assert open_ok.channel_id == ""
