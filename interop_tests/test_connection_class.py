"""Connection-class methods a client sends on an open connection, over a raw socket.

Once a connection is open RabbitMQ 3.10 (checked with INTEROP_BROKER_URL) accepts only
connection.close and connection.update-secret on channel 0; anything else of the class (a second
login, tune or open, a close-ok nobody asked for, blocked/unblocked from the client) closes the
connection with 504 'unexpected method in connection state running', naming the method.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from interop_tests.raw_client import RawClient

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
