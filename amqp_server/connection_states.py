"""The states of an AMQP connection, in the order a connection goes through them.

The handshake (handshake.py) moves a connection from AWAIT_HEADER to OPEN; closing
(connection.py) from any state to CLOSING, where only close-ok is awaited, and CLOSED.
"""

from __future__ import annotations

AWAIT_HEADER = "await-header"  # nothing received yet: the protocol header comes first
AWAIT_START_OK = "await-start-ok"  # connection.start sent: the client answers with its login
AWAIT_TUNE_OK = "await-tune-ok"  # connection.tune sent: limits are negotiated
AWAIT_OPEN = "await-open"  # waiting for connection.open naming the vhost
OPEN = "open"
CLOSING = "closing"  # connection.close sent, waiting for close-ok
CLOSED = "closed"

# How RabbitMQ's error texts name these states ("unexpected method in connection state tuning").
RABBITMQ_NAMES = {
    AWAIT_HEADER: "handshake",
    AWAIT_START_OK: "starting",
    AWAIT_TUNE_OK: "tuning",
    AWAIT_OPEN: "opening",
    OPEN: "running",
    CLOSING: "closing",
    CLOSED: "closed",
}
# Before these are done the client is not trusted: RabbitMQ answers its errors with no frame
# and drops the socket a few seconds later (handshake_error).
UNTRUSTED = (AWAIT_START_OK, AWAIT_TUNE_OK)
