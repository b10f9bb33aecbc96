"""PublisherFlow (amqp_server/publisher_blocking.py) on its own: what holds back reading from a
publishing connection, and what it tells the client. End to end through a connection, with
real alarms, see test_alarms.py."""

from __future__ import annotations

from typing import Any

from pamqp import commands

from amqp_server.cluster_forwarded import ForwardFlow
from amqp_server.publisher_blocking import PublisherFlow
from amqp_server.states import ConnectionState
from queues.queue import FLOW_HIGH, FLOW_LOW
from tests.frame_driver import opened_client


class StubConnection:
    """The little of a Connection that PublisherFlow uses."""

    def __init__(self, capabilities: dict[str, Any] | None = None) -> None:
        self.state = ConnectionState.OPEN
        self.client_capabilities = {"connection.blocked": True} if capabilities is None else capabilities
        self.content_in_flight = 0
        self.sent: list[Any] = []
        self.paused: list[bool] = []
        self.flow = PublisherFlow(self)  # type: ignore[arg-type]

    @property
    def reading_paused(self) -> bool:
        return self.flow.holds_reading

    def on_reading_paused(self, paused: bool) -> None:
        self.paused.append(paused)

    def send_method(self, channel_id: int, method: Any) -> None:
        self.sent.append(method)

    def describe(self) -> str:
        return "stub"


class StubQueue:
    def __init__(self) -> None:
        self.flow_waiters: dict[object, Any] = {}

    def drain(self) -> None:
        waiters = list(self.flow_waiters.values())
        self.flow_waiters.clear()
        for resume in waiters:
            resume()


def test_an_alarm_blocks_at_the_next_publish_and_clearing_it_unblocks():
    connection = StubConnection()
    flow = connection.flow
    flow.alarm_changed("low on memory")
    assert (flow.holds_reading, flow.management_state, connection.sent) == (False, "blocking", [])

    flow.publishing()
    assert flow.holds_reading and flow.management_state == "blocked"
    assert [type(m) for m in connection.sent] == [commands.Connection.Blocked]
    assert connection.sent[0].reason == "low on memory"
    assert connection.paused == [True]

    flow.alarm_changed(None)
    assert not flow.holds_reading and flow.management_state == "running"
    assert [type(m) for m in connection.sent] == [commands.Connection.Blocked, commands.Connection.Unblocked]
    assert connection.paused == [True, False]


def test_a_client_without_the_capability_is_blocked_and_unblocked_silently():
    connection = StubConnection(capabilities={})
    connection.flow.alarm_changed("low on disk")
    connection.flow.publishing()
    connection.flow.alarm_changed(None)
    assert connection.sent == []
    assert connection.paused == [True, False]


def test_content_in_flight_when_the_alarm_goes_off_blocks_at_once():
    connection = StubConnection()
    connection.content_in_flight = 1000
    connection.flow.alarm_changed("low on memory")
    assert connection.flow.blocked_by == "low on memory"
    assert connection.paused == [True]


def test_an_alarm_that_clears_before_a_publish_sends_nothing():
    connection = StubConnection()
    connection.flow.alarm_changed("low on memory")
    connection.flow.alarm_changed(None)
    connection.flow.publishing()  # the connection calls this only while block_on_publish; harmless after
    assert (connection.sent, connection.paused, connection.flow.management_state) == ([], [], "running")


def test_a_congested_queue_pauses_reading_until_it_drains_once_per_queue():
    connection = StubConnection()
    first, second = StubQueue(), StubQueue()
    connection.flow.throttle(first)
    connection.flow.throttle(first)
    connection.flow.throttle(second)
    assert connection.paused == [True] and connection.flow.management_state == "flow"
    first.drain()
    assert connection.paused == [True]  # the second queue still holds it
    second.drain()
    assert connection.paused == [True, False] and connection.flow.management_state == "running"


def test_release_forgets_the_queues_and_the_block():
    connection = StubConnection()
    queue = StubQueue()
    connection.flow.throttle(queue)
    connection.flow.alarm_changed("low on memory")
    connection.flow.publishing()
    connection.flow.release()
    assert queue.flow_waiters == {}
    assert not connection.flow.holds_reading


def test_a_closing_connection_is_not_blocked():
    connection = StubConnection()
    connection.state = ConnectionState.CLOSING
    connection.flow.alarm_changed("low on memory")
    connection.flow.publishing()
    assert (connection.sent, connection.paused, connection.flow.blocked_by) == ([], [], None)


def test_a_connection_publishing_into_a_queue_its_consumer_cannot_keep_up_with_stops_being_read_until_it_drains():
    # End to end with a real queue and connection: the queue holds the connection past
    # FLOW_HIGH ready messages and lets it go below FLOW_LOW (queues/queue.py CongestedQueues).
    client = opened_client()
    paused: list[bool] = []
    client.connection.on_reading_paused = paused.append
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Basic.Qos(prefetch_count=1))
    client.call(1, commands.Basic.Consume(queue="q", consumer_tag="slow"))
    queue = client.broker.vhosts["/"].queues["q"]
    client.send_bytes(b"".join(client.publish_bytes(1, b"m", routing_key="q") for _ in range(FLOW_HIGH + 2)))
    assert queue.message_count == FLOW_HIGH + 1  # one is with the consumer
    assert paused == [True] and client.connection.reading_paused
    assert client.connection.flow.management_state == "flow"
    tag = 1
    while queue.message_count > FLOW_LOW:
        client.send(1, commands.Basic.Ack(delivery_tag=tag))
        tag += 1
    assert paused == [True] and client.connection.reading_paused
    client.send(1, commands.Basic.Ack(delivery_tag=tag))
    assert queue.message_count == FLOW_LOW - 1
    assert paused == [True, False] and not client.connection.reading_paused
    assert client.connection.flow.management_state == "running"
    assert queue.flow_waiters == {}


def test_a_closed_link_channel_leaves_nothing_in_the_queues_that_paused_it():
    # ForwardFlow (cluster_forwarded.py): a queue congested by a link channel's forwarded
    # publishes pauses it with channel.flow; once the channel is gone the queue keeps no waiter.
    client = opened_client()
    channel = client.connection.channels[1]
    channel.forward_flow = ForwardFlow(channel)
    queue = StubQueue()
    channel.forward_flow.hold(queue)
    [(_, flow)] = client.take()
    assert isinstance(flow, commands.Channel.Flow) and not flow.active
    client.send(1, commands.Channel.Close(200, "bye", 0, 0))
    assert queue.flow_waiters == {}
