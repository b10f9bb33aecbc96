"""The connection's and the channel's state tables (amqp_server/wire/states.py), and that the
connection and channel move only through them."""

from __future__ import annotations

import pytest
from pamqp import commands

from amqp_server.connection.connection import Connection
from amqp_server.wire.errors import AMQPError
from amqp_server.wire.states import (
    CHANNEL_TRANSITIONS,
    CONNECTION_TRANSITIONS,
    ChannelEvent,
    ChannelState,
    ConnectionEvent,
    ConnectionState,
    IllegalTransition,
    next_state,
)
from tests.frame_driver import FakeClient, opened_client


def _reachable(table, start):
    seen, todo = {start}, [start]
    while todo:
        for after in table[todo.pop()].values():
            if after not in seen:
                seen.add(after)
                todo.append(after)
    return seen


def test_every_connection_state_is_reachable_from_the_start_and_has_a_row():
    assert set(CONNECTION_TRANSITIONS) == set(ConnectionState)
    assert _reachable(CONNECTION_TRANSITIONS, ConnectionState.AWAIT_HEADER) == set(ConnectionState)


def test_every_channel_state_is_reachable_from_open_and_has_a_row():
    assert set(CHANNEL_TRANSITIONS) == set(ChannelState)
    assert _reachable(CHANNEL_TRANSITIONS, ChannelState.OPEN) == set(ChannelState)


def test_the_handshake_goes_in_its_order_only():
    state = ConnectionState.AWAIT_HEADER
    for event in (ConnectionEvent.HEADER_ACCEPTED, ConnectionEvent.START_OK, ConnectionEvent.TUNE_OK,
                  ConnectionEvent.OPEN):
        with pytest.raises(IllegalTransition):
            next_state(CONNECTION_TRANSITIONS, state, ConnectionEvent.UPDATE_SECRET)
        state = next_state(CONNECTION_TRANSITIONS, state, event)
    assert state is ConnectionState.OPEN
    with pytest.raises(IllegalTransition) as refused:
        next_state(CONNECTION_TRANSITIONS, state, ConnectionEvent.START_OK)
    assert (refused.value.state, refused.value.event) == (ConnectionState.OPEN, ConnectionEvent.START_OK)


def test_a_closed_connection_takes_no_method_and_never_reopens():
    for event in ConnectionEvent:
        try:
            after = next_state(CONNECTION_TRANSITIONS, ConnectionState.CLOSED, event)
        except IllegalTransition:
            continue
        assert after is ConnectionState.CLOSED


def test_a_closing_channel_closes_on_close_ok_only_and_an_open_one_cannot_take_close_ok():
    assert next_state(CHANNEL_TRANSITIONS, ChannelState.CLOSING, ChannelEvent.CLOSE_OK) is ChannelState.CLOSED
    with pytest.raises(IllegalTransition):
        next_state(CHANNEL_TRANSITIONS, ChannelState.OPEN, ChannelEvent.CLOSE_OK)
    with pytest.raises(IllegalTransition):
        next_state(CHANNEL_TRANSITIONS, ChannelState.CLOSED, ChannelEvent.CLOSE_SENT)


def test_the_state_values_are_rabbitmqs_names_used_in_its_error_texts():
    assert [state.value for state in ConnectionState] == [
        "handshake", "starting", "tuning", "opening", "running", "closing", "closed"]
    assert [state.value for state in ChannelState] == ["running", "closing", "closed"]


def test_a_connection_walks_the_table_through_a_handshake_and_a_close():
    client = FakeClient()
    states = [client.connection.state]
    client.start()
    states.append(client.connection.state)
    client.start_ok()
    states.append(client.connection.state)
    client.send(0, commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
    states.append(client.connection.state)
    client.send(0, commands.Connection.Open(virtual_host="/"))
    states.append(client.connection.state)
    [(_, close_ok)] = client.send(0, commands.Connection.Close(200, "bye", 0, 0))
    states.append(client.connection.state)
    assert isinstance(close_ok, commands.Connection.CloseOk)
    assert states == [ConnectionState.AWAIT_HEADER, ConnectionState.AWAIT_START_OK, ConnectionState.AWAIT_TUNE_OK,
                      ConnectionState.AWAIT_OPEN, ConnectionState.OPEN, ConnectionState.CLOSED]


def test_a_method_out_of_turn_is_refused_with_the_state_named_as_rabbitmq_does():
    client = opened_client()
    [(_, close)] = client.send(0, commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0))
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 31)
    assert client.connection.state is ConnectionState.CLOSING


def test_a_channel_goes_closing_on_a_soft_error_and_closed_on_close_ok():
    client = opened_client()
    channel = client.connection.channels[1]
    [(_, close)] = client.send(1, commands.Queue.Declare(queue="missing", passive=True))
    assert close.reply_code == 404
    assert channel.state is ChannelState.CLOSING
    client.send(1, commands.Channel.CloseOk())
    assert channel.state is ChannelState.CLOSED
    assert 1 not in client.connection.channels


def test_the_channels_of_a_closed_connection_are_closed():
    client = opened_client(channels=(1, 2))
    first, second = client.connection.channels[1], client.connection.channels[2]
    client.send(2, commands.Queue.Declare(queue="missing", passive=True))  # channel 2 is closing
    client.connection.transport_closed()
    assert (first.state, second.state) == (ChannelState.CLOSED, ChannelState.CLOSED)
    assert client.connection.state is ConnectionState.CLOSED


def test_connection_states_are_enum_members_not_strings():
    connection = Connection(FakeClient().broker)
    assert isinstance(connection.state, ConnectionState)
    assert connection.state != "handshake"


def test_failing_a_channel_closed_meanwhile_sends_nothing_on_its_number():
    client = opened_client()
    connection = client.connection
    old = connection.channels[1]
    client.send(1, commands.Channel.Close(200, "bye", 0, 0))
    client.open_channel(1)  # the number is reused at once
    connection.fail_channel(old, AMQPError(406, "late refusal"))  # e.g. a cluster node's late answer
    assert client.take() == []
    assert connection.channels[1].state is ChannelState.OPEN
