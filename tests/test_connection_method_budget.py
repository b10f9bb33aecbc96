"""One connection handles at most METHODS_PER_TURN channel methods (other than publish and ack)
per event-loop turn; the rest of what it read waits for the next turn, in order."""

from __future__ import annotations

from pamqp import commands

from amqp_server.connection.connection import METHODS_PER_TURN
from tests.frame_driver import marshal, methods, opened_client, publish_frames


def test_a_pipelined_storm_of_declarations_is_handled_a_slice_per_turn():
    client = opened_client()
    count = 5 * METHODS_PER_TURN + 3
    data = marshal(1, *[commands.Queue.Declare(queue=f"q{i}") for i in range(count)])
    answered = methods(client.send_bytes(data))
    assert len(answered) == METHODS_PER_TURN
    assert client.connection.input_waiting
    turns = 1
    while client.connection.input_waiting:
        client.connection.resume_input()
        answered += methods(client.take())
        turns += 1
    assert turns == 6
    assert [ok.queue for ok in answered] == [f"q{i}" for i in range(count)], "all answered, in order"


def test_publishes_do_not_count_against_the_budget():
    client = opened_client()
    client.send(1, commands.Queue.Declare(queue="q"))
    data = b"".join(publish_frames(1, b"x", routing_key="q") for _ in range(10 * METHODS_PER_TURN))
    client.send_bytes(data)
    assert not client.connection.input_waiting
    assert client.broker.vhosts["/"].queues["q"].message_count == 10 * METHODS_PER_TURN
