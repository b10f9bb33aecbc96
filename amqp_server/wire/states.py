"""The states of a connection and of a channel, each with the one table of how it moves.

Connection: AWAIT_HEADER -> AWAIT_START_OK -> AWAIT_TUNE_OK -> AWAIT_OPEN -> OPEN as the
client's handshake methods arrive (handshake.py does each step), and from any state to CLOSING
(we sent connection.close, or stopped answering an untrusted client) and CLOSED.

Channel: OPEN from channel.open-ok. A soft error makes the broker send channel.close: the
channel is CLOSING until the client's close-ok and ignores everything else meanwhile (spec
1.5.2.5). The client's own channel.close, or the end of its connection, closes it at once.

Handover (a connection on a worker's shared port, handover.py): RECORDING while everything the
client did can be replayed on another worker, MOVING once stopped before a frame naming a queue
a sibling worker owns, then MOVED (the owner took the socket) or FIXED (it stays here).

`next_state` is the only way from one state to another (Connection.advance and Channel.advance
call it). An event the current state does not allow raises IllegalTransition; when the client
caused it, the connection answers with RabbitMQ's "unexpected method in connection state
tuning" (504), the state's value being RabbitMQ's name for it.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar


class ConnectionState(Enum):
    """Each value is how RabbitMQ's error texts name the state."""

    AWAIT_HEADER = "handshake"  # nothing received yet: the protocol header comes first
    AWAIT_START_OK = "starting"  # connection.start sent: the client answers with its login
    AWAIT_TUNE_OK = "tuning"  # connection.tune sent: limits are negotiated
    AWAIT_OPEN = "opening"  # waiting for connection.open naming the vhost
    OPEN = "running"
    CLOSING = "closing"  # connection.close sent (or no answer to give): waiting for close-ok
    CLOSED = "closed"


class ConnectionEvent(Enum):
    # The client's methods on channel 0 (a method not here is never allowed).
    START_OK = "connection.start-ok"
    TUNE_OK = "connection.tune-ok"
    OPEN = "connection.open"
    UPDATE_SECRET = "connection.update-secret"
    CLOSE = "connection.close"
    # What the connection itself does or learns.
    HEADER_ACCEPTED = "protocol header accepted"  # connection.start sent
    CLOSE_SENT = "closing"  # connection.close sent, or the client gets no answer: await close-ok
    FINISHED = "finished"  # nothing more to say: the socket closes once flushed
    TRANSPORT_CLOSED = "socket closed"
    HANDED_OVER = "handed over"  # its socket belongs to another worker now (handover.py)


class ChannelState(Enum):
    """Each value is how RabbitMQ's management API names the state."""

    OPEN = "running"
    CLOSING = "closing"  # we sent channel.close and wait for close-ok
    CLOSED = "closed"


class ChannelEvent(Enum):
    CLOSE_SENT = "channel.close sent"  # a soft error: the broker closes the channel
    CLOSE_OK = "channel.close-ok received"
    CLIENT_CLOSE = "channel.close received"  # answered with close-ok at once
    CONNECTION_GONE = "connection closed"


# Closing can start, and the socket can go, in any state; a closed connection stays closed.
_CONNECTION_ENDINGS = {
    ConnectionEvent.CLOSE_SENT: ConnectionState.CLOSING,
    ConnectionEvent.FINISHED: ConnectionState.CLOSED,
    ConnectionEvent.TRANSPORT_CLOSED: ConnectionState.CLOSED,
    ConnectionEvent.HANDED_OVER: ConnectionState.CLOSED,
}
CONNECTION_TRANSITIONS: dict[ConnectionState, dict[ConnectionEvent, ConnectionState]] = {
    ConnectionState.AWAIT_HEADER: {ConnectionEvent.HEADER_ACCEPTED: ConnectionState.AWAIT_START_OK,
                                   **_CONNECTION_ENDINGS},
    ConnectionState.AWAIT_START_OK: {ConnectionEvent.START_OK: ConnectionState.AWAIT_TUNE_OK, **_CONNECTION_ENDINGS},
    ConnectionState.AWAIT_TUNE_OK: {ConnectionEvent.TUNE_OK: ConnectionState.AWAIT_OPEN, **_CONNECTION_ENDINGS},
    ConnectionState.AWAIT_OPEN: {ConnectionEvent.OPEN: ConnectionState.OPEN, **_CONNECTION_ENDINGS},
    ConnectionState.OPEN: {ConnectionEvent.UPDATE_SECRET: ConnectionState.OPEN,
                           ConnectionEvent.CLOSE: ConnectionState.CLOSED, **_CONNECTION_ENDINGS},
    # Only close-ok (FINISHED) and a crossing connection.close (no change) count here.
    ConnectionState.CLOSING: {ConnectionEvent.FINISHED: ConnectionState.CLOSED,
                              ConnectionEvent.TRANSPORT_CLOSED: ConnectionState.CLOSED,
                              ConnectionEvent.HANDED_OVER: ConnectionState.CLOSED},
    ConnectionState.CLOSED: {ConnectionEvent.FINISHED: ConnectionState.CLOSED,
                             ConnectionEvent.TRANSPORT_CLOSED: ConnectionState.CLOSED,
                             ConnectionEvent.HANDED_OVER: ConnectionState.CLOSED},
}
# Before these are done the client is not trusted: RabbitMQ answers its errors with no frame
# and drops the socket a few seconds later (handshake_error).
UNTRUSTED = (ConnectionState.AWAIT_START_OK, ConnectionState.AWAIT_TUNE_OK)

CHANNEL_TRANSITIONS: dict[ChannelState, dict[ChannelEvent, ChannelState]] = {
    ChannelState.OPEN: {
        ChannelEvent.CLOSE_SENT: ChannelState.CLOSING,
        ChannelEvent.CLIENT_CLOSE: ChannelState.CLOSED,
        ChannelEvent.CONNECTION_GONE: ChannelState.CLOSED,
    },
    ChannelState.CLOSING: {
        # A frame refused while closing (a second channel.open) gets another channel.close.
        ChannelEvent.CLOSE_SENT: ChannelState.CLOSING,
        ChannelEvent.CLOSE_OK: ChannelState.CLOSED,
        ChannelEvent.CONNECTION_GONE: ChannelState.CLOSED,
    },
    ChannelState.CLOSED: {ChannelEvent.CONNECTION_GONE: ChannelState.CLOSED},
}



class HandoverState(Enum):
    """Whether a connection on a worker's shared port may still move to the worker that owns its
    queue (handover.py): what it did so far can be replayed there with no side effect."""

    RECORDING = "recording"  # every byte so far is replayable: the client's bytes are kept
    MOVING = "moving"  # stopped before a frame naming another worker's queue: the socket is being passed
    FIXED = "fixed"  # stays on this worker (did something not replayable, or the owner refused)
    MOVED = "moved"  # the owner took the socket: this worker has forgotten the connection


class HandoverEvent(Enum):
    OWNER_FRAME = "a frame naming a queue another local worker owns"
    UNREPLAYABLE = "something not replayable happened"
    REFUSED = "the hand-over failed or the owner refused it"
    TAKEN = "the owner took the socket"


HANDOVER_TRANSITIONS: dict[HandoverState, dict[HandoverEvent, HandoverState]] = {
    HandoverState.RECORDING: {HandoverEvent.OWNER_FRAME: HandoverState.MOVING,
                              HandoverEvent.UNREPLAYABLE: HandoverState.FIXED},
    HandoverState.MOVING: {HandoverEvent.REFUSED: HandoverState.FIXED, HandoverEvent.TAKEN: HandoverState.MOVED},
    HandoverState.FIXED: {HandoverEvent.UNREPLAYABLE: HandoverState.FIXED},
    HandoverState.MOVED: {},
}

State = TypeVar("State", ConnectionState, ChannelState, HandoverState)
Event = TypeVar("Event", bound=Enum)


class IllegalTransition(Exception):
    """`event` is not allowed in `state`: a protocol error when the client caused it."""

    def __init__(self, state: Enum, event: Enum) -> None:
        super().__init__(f"{event.value} in state {state.value}")
        self.state = state
        self.event = event


def next_state(table: dict[State, dict[Event, State]], state: State, event: Event) -> State:
    """The state `event` leads to from `state` in `table`; IllegalTransition if not allowed."""
    try:
        return table[state][event]
    except KeyError:
        raise IllegalTransition(state, event) from None
