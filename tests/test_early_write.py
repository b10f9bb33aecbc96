"""A connection offers its first EARLY_WRITE_DELIVERIES deliveries for writing before the end of
the event-loop turn that made them (Connection.on_early_write, take_early_output), so a consumer
starts on them while the broker makes the rest; publisher confirms still wait for the end of the
turn, after the queues storing their messages were asked."""

from __future__ import annotations

from pamqp import commands
from pamqp.body import ContentBody

from amqp_server.connection.connection import EARLY_WRITE_DELIVERIES
from tests.frame_driver import FakeClient, methods, unmarshal_all


def _opened(client: FakeClient) -> None:
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)


def test_the_first_deliveries_of_a_round_are_offered_before_it_ends_and_the_rest_follow_in_order():
    early: list[bytes] = []
    client: FakeClient

    def write_early() -> None:
        early.append(client.connection.take_early_output())

    client = FakeClient(on_early_write=write_early)
    _opened(client)
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Basic.Qos(prefetch_count=100))
    client.call(1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    # Channel 2 publishes with confirms into the queue channel 1 consumes.
    client.call(2, commands.Confirm.Select())
    count = EARLY_WRITE_DELIVERIES + 10
    rest = client.send_bytes(b"".join(client.publish_bytes(2, b"%d" % i, routing_key="q") for i in range(count)))

    assert len(early) == 1, "offered once, when EARLY_WRITE_DELIVERIES deliveries waited"
    first = unmarshal_all(early[0])
    assert [f.value for _, f in first if isinstance(f, ContentBody)] == [b"%d" % i for i in range(EARLY_WRITE_DELIVERIES)]
    assert not [m for m in methods(first) if isinstance(m, commands.Basic.Ack)], "no confirm before the turn ends"
    assert [f.value for _, f in rest if isinstance(f, ContentBody)] == [
        b"%d" % i for i in range(EARLY_WRITE_DELIVERIES, count)]
    [confirm] = [m for m in methods(rest) if isinstance(m, commands.Basic.Ack)]
    assert (confirm.delivery_tag, confirm.multiple) == (count, True)


def test_without_a_shell_that_writes_early_everything_waits_for_the_end_of_the_turn():
    client = FakeClient()
    _opened(client)
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True))
    count = 3 * EARLY_WRITE_DELIVERIES
    received = client.send_bytes(b"".join(client.publish_bytes(2, b"m", routing_key="q") for _ in range(count)))
    assert len([f for _, f in received if isinstance(f, ContentBody)]) == count
