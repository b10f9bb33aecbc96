"""PublisherFlow (amqp_server/connection/publisher_flow.py) on its own: what holds back reading from a
publishing connection, and what it tells the client; flow control through a connection, and
through the shell (server.py) over sockets. End to end through a connection, with real alarms,
see test_alarms.py."""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from amqp_server.broker.alarms import MEMORY
from amqp_server.broker.broker import Broker
from amqp_server.broker.access_control import CLUSTER_LINK_USER
from cluster.links.forwarded import ForwardingChannel
from cluster.links.frames import forward_to_frame
from amqp_server.config.settings import ServerConfig
from amqp_server.connection.publisher_flow import PublisherFlow
from amqp_server.runtime.server import AMQPServer
from amqp_server.wire.protocols import AMQP_0_9_1
from amqp_server.wire.states import ConnectionState
from persistence.definitions import FileDefinitionStore
from queues.queue import FLOW_HIGH, FLOW_LOW
from tests.frame_driver import CLIENT_CAPABILITIES, FakeClient, PROTOCOL_HEADER, marshal, opened_client, plain_response, publish_frames


class StubConnection:
    """The little of a Connection that PublisherFlow uses."""

    def __init__(self, capabilities: dict[str, Any] | None = None) -> None:
        self.state = ConnectionState.OPEN
        self.protocol = AMQP_0_9_1
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

    def hold_input(self) -> None:
        self.paused.append(True)

    def release_input(self) -> None:
        if not self.reading_paused:
            self.paused.append(False)

    def send_connection_method(self, method: Any) -> None:
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


def _publisher_and_slow_consumer() -> tuple[Any, Any, Any, list[bool]]:
    """A publisher connection and, on a connection of its own, a consumer of queue "q" with
    prefetch 1 that acks nothing until told: (publisher, consumer, queue, the publisher's
    reading paused/resumed calls)."""
    publisher = opened_client()
    consumer = opened_client(publisher.broker)
    paused: list[bool] = []
    publisher.connection.on_reading_paused = paused.append
    publisher.call(1, commands.Queue.Declare(queue="q"))
    consumer.call(1, commands.Basic.Qos(prefetch_count=1))
    consumer.call(1, commands.Basic.Consume(queue="q", consumer_tag="slow"))
    return publisher, consumer, publisher.broker.vhosts["/"].queues["q"], paused


def test_a_connection_publishing_into_a_queue_its_consumer_cannot_keep_up_with_stops_being_read_until_it_drains():
    # End to end with a real queue and connections: the queue holds the publisher past
    # FLOW_HIGH ready messages and lets it go below FLOW_LOW (queues/congestion.py CongestedQueues).
    publisher, consumer, queue, paused = _publisher_and_slow_consumer()
    publisher.send_bytes(b"".join(publisher.publish_bytes(1, b"m", routing_key="q") for _ in range(FLOW_HIGH + 2)))
    assert queue.message_count == FLOW_HIGH + 1  # one is with the consumer
    assert paused == [True] and publisher.connection.reading_paused
    assert publisher.connection.flow.management_state == "flow"
    tag = 1
    while queue.message_count > FLOW_LOW:
        consumer.send(1, commands.Basic.Ack(delivery_tag=tag))
        tag += 1
    assert paused == [True] and publisher.connection.reading_paused
    consumer.send(1, commands.Basic.Ack(delivery_tag=tag))
    assert queue.message_count == FLOW_LOW - 1
    assert paused == [True, False] and not publisher.connection.reading_paused
    assert publisher.connection.flow.management_state == "running"
    assert queue.flow_waiters == {}


def test_a_held_publisher_handles_none_of_what_it_read_after_the_publish_that_congested_the_queue():
    # As RabbitMQ's reader: held back, the connection stops at the frame that held it, not at the
    # end of the socket read, so a congested queue grows by one publish, not by a whole read;
    # the rest is handled, in order, from the next turn after the queue drained.
    publisher, consumer, queue, paused = _publisher_and_slow_consumer()
    extra = 500
    bodies = [b"%d" % i for i in range(FLOW_HIGH + 2 + extra)]
    publisher.send_bytes(b"".join(publisher.publish_bytes(1, body, routing_key="q") for body in bodies))
    assert queue.message_count == FLOW_HIGH + 1, "nothing after the congesting publish was handled"
    connection = publisher.connection
    assert connection.input_held and connection.input_waiting
    publisher.send_bytes(publisher.publish_bytes(1, b"late", routing_key="q"))
    assert queue.message_count == FLOW_HIGH + 1, "bytes read while held wait too"
    received = _bodies(consumer.take())
    tag = 1
    while paused == [True]:
        received += _bodies(consumer.send(1, commands.Basic.Ack(delivery_tag=tag)))
        tag += 1
    assert queue.message_count == FLOW_LOW - 1 and not connection.input_held
    assert connection.input_waiting, "the held frames wait for the shell's next turn"
    connection.resume_input()
    assert queue.message_count == FLOW_LOW - 1 + extra + 1
    while len(received) < len(bodies) + 1:
        received += _bodies(consumer.send(1, commands.Basic.Ack(delivery_tag=tag)))
        tag += 1
    assert received == bodies + [b"late"], "all delivered, in order"


def test_an_alarm_and_flow_control_each_keep_a_held_publisher_paused_until_both_let_it_go():
    # A publisher held by flow control whose publish on another channel still waits for its
    # body is blocked by an alarm too (publisher_blocking.py). Neither the alarm clearing while
    # the queue is congested, nor the queue draining while the alarm is on, may read it or
    # handle its held frames (a publish during a memory alarm is what the alarm is there to
    # stop); only the end of both does.
    publisher, consumer, queue, paused = _publisher_and_slow_consumer()
    publisher.open_channel(2)
    broker, connection = publisher.broker, publisher.connection
    started = marshal(2, commands.Basic.Publish(exchange="", routing_key="q"), ContentHeader(body_size=2), ContentBody(b"x"))
    congesting = b"".join(publisher.publish_bytes(1, b"m", routing_key="q") for _ in range(FLOW_HIGH + 2))
    publisher.send_bytes(started + congesting + publisher.publish_bytes(1, b"after", routing_key="q"))
    assert queue.message_count == FLOW_HIGH + 1 and connection.input_held and paused == [True]
    broker.alarms.set(MEMORY, True)
    assert connection.flow.blocked_by is not None, "the publish begun on channel 2 meets the alarm"
    broker.alarms.set(MEMORY, False)
    assert connection.input_held and connection.reading_paused
    assert False not in paused, "the alarm cleared, but the queue still holds the publisher"
    broker.alarms.set(MEMORY, True)
    assert connection.flow.blocked_by is not None
    _bodies(consumer.take())
    tag = 1
    while queue.message_count >= FLOW_LOW:
        consumer.send(1, commands.Basic.Ack(delivery_tag=tag))
        tag += 1
    assert not connection.input_held and connection.reading_paused
    assert False not in paused, "the queue drained, but the alarm still blocks the publisher"
    broker.alarms.set(MEMORY, False)
    assert paused[-1] is False and not connection.reading_paused
    assert connection.input_waiting, "the held frames wait for the shell's next turn"
    count = queue.message_count
    connection.resume_input()
    assert queue.message_count == count + 1, "the held publish is handled once both let go"


def _bodies(received: Any) -> list[bytes]:
    return [frame.value for _channel, frame in received if isinstance(frame, ContentBody)]


def test_a_closed_link_channel_leaves_nothing_in_the_queues_that_paused_it():
    # ForwardFlow (cluster/links/forwarded.py): a queue congested by a link channel's forwarded
    # publishes pauses it with channel.flow; once the channel is gone the queue keeps no waiter.
    broker = Broker()
    broker.access.admit_cluster_links(LINK_SECRET)
    broker.joined_cluster(_NoMembership(), ForwardingChannel)
    client = FakeClient(broker)
    client.start()
    client.start_ok(user=CLUSTER_LINK_USER, password=LINK_SECRET)
    client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    client.send(0, commands.Connection.Open(virtual_host="/"))
    client.open_channel(1)
    channel = client.connection.channels[1]
    assert isinstance(channel, ForwardingChannel)
    client.send_bytes(forward_to_frame(1, ()))  # the link's first forward-to starts its flow control
    queue = StubQueue()
    channel.congested(queue)
    [(_, flow)] = client.take()
    assert isinstance(flow, commands.Channel.Flow) and not flow.active
    client.send(1, commands.Channel.Close(200, "bye", 0, 0))
    assert queue.flow_waiters == {}


LINK_SECRET = "link-secret-0123456789"


class _NoMembership:
    def live_nodes(self) -> list[Any]:
        return []


# -- through the shell, over sockets ----------------------------------------------------------


class SocketClient:
    """A raw AMQP client on an asyncio stream (so it runs in the broker's own loop): frames out
    as bytes, frames in parsed by pamqp. It sends no heartbeats."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = b""

    @classmethod
    async def open(cls, port: int, heartbeat: int = 0) -> "SocketClient":
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.writer.write(PROTOCOL_HEADER)
        await client.expect(commands.Connection.Start)
        client.send(0, commands.Connection.StartOk(
            client_properties={"capabilities": CLIENT_CAPABILITIES}, mechanism="PLAIN",
            response=plain_response("guest", "guest")))
        await client.expect(commands.Connection.Tune)
        client.send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=heartbeat))
        client.send(0, commands.Connection.Open(virtual_host="/"))
        await client.expect(commands.Connection.OpenOk)
        client.send(1, commands.Channel.Open())
        await client.expect(commands.Channel.OpenOk)
        return client

    def send(self, channel: int, *frames: Any) -> None:
        self.writer.write(marshal(channel, *frames))

    async def next_frame(self) -> Any:
        """The next frame other than a heartbeat (10 s at most)."""
        while True:
            if len(self.buffer) >= 7 and len(self.buffer) >= int.from_bytes(self.buffer[3:7], "big") + 8:
                consumed, _channel, value = frame.unmarshal(self.buffer)
                self.buffer = self.buffer[consumed:]
                if not isinstance(value, Heartbeat):
                    return value
                continue
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            assert data, "the broker closed the connection"
            self.buffer += data

    async def expect(self, kind: type) -> Any:
        value = await self.next_frame()
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
        return value


def test_a_held_publisher_goes_on_by_itself_once_the_queue_drains_and_is_not_taken_for_dead_meanwhile(tmp_path):
    # The publisher sends every publish and then a method it waits for, and nothing more (not
    # even heartbeats): once the queue drains, only the broker itself can go on with the frames
    # it holds (no lost wake-up). Held longer than its heartbeat timeout, it is not closed for
    # missed heartbeats: the broker does not read it meanwhile (RabbitMQ pauses its monitor
    # too). Other connections are served during the hold.
    extra = 300
    heartbeat = 1

    async def scenario() -> None:
        broker = Broker(ServerConfig(), FileDefinitionStore(tmp_path))
        server = AMQPServer(broker, "127.0.0.1", 0)
        await server.start()
        try:
            consumer = await SocketClient.open(server.port)
            consumer.send(1, commands.Queue.Declare(queue="q"), commands.Basic.Qos(prefetch_count=1),
                          commands.Basic.Consume(queue="q", consumer_tag="slow"))
            await consumer.expect(commands.Queue.DeclareOk)
            await consumer.expect(commands.Basic.QosOk)
            await consumer.expect(commands.Basic.ConsumeOk)
            publisher = await SocketClient.open(server.port, heartbeat=heartbeat)
            [shell] = [protocol for protocol in server.protocols if protocol.connection.heartbeat == heartbeat]
            connection = shell.connection
            bodies = [b"%d" % i for i in range(FLOW_HIGH + 2 + extra)]
            publisher.writer.write(b"".join(publish_frames(1, body, routing_key="q") for body in bodies)
                                   + marshal(1, commands.Queue.Declare(queue="q", passive=True)))
            queue = broker.vhosts["/"].queues["q"]
            for _ in range(500):
                if connection.input_held:
                    break
                await asyncio.sleep(0.01)
            assert connection.input_held, "the queue never held the publisher"
            await asyncio.sleep(2 * heartbeat + 1)  # past the heartbeat timeout, a tick at least every 0.25 s
            assert connection.input_held and queue.message_count == FLOW_HIGH + 1
            assert connection.state is ConnectionState.OPEN and shell.transport is not None, "closed while held"

            other = await SocketClient.open(server.port)
            other.send(1, commands.Queue.Declare(queue="other"))
            await other.expect(commands.Queue.DeclareOk)
            other.writer.close()

            received: list[bytes] = []
            while len(received) < len(bodies):
                value = await consumer.next_frame()
                if isinstance(value, ContentBody):
                    received.append(value.value)
                    consumer.send(1, commands.Basic.Ack(delivery_tag=len(received)))
            assert received == bodies, "every publish delivered, in order"
            await publisher.expect(commands.Queue.DeclareOk)
            assert not connection.input_held and connection.flow.management_state == "running"
            publisher.writer.close()
            consumer.writer.close()
        finally:
            await server.stop()
            await broker.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_publish_read_whole_during_an_alarm_is_confirmed_only_after_the_alarm_clears():
    # As RabbitMQ's reader: a publish meeting an alarm blocks the connection at its basic.publish;
    # its content header and body, even when they came in the same socket read, are handled (routed,
    # confirmed) once the alarm clears: connection.unblocked comes before the ack (issue 26's clients).
    broker = Broker()
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="q"))
    client.call(1, commands.Confirm.Select())
    broker.alarms.set(MEMORY, True)
    during = client.send_bytes(publish_frames(1, b"held", routing_key="q"))
    assert [type(m) for _c, m in during] == [commands.Connection.Blocked]
    assert broker.vhosts["/"].queues["q"].message_count == 0, "routed during the alarm"
    broker.alarms.set(MEMORY, False)
    after = client.take()
    client.connection.resume_input()
    after += client.take()
    assert [type(m) for _c, m in after] == [commands.Connection.Unblocked, commands.Basic.Ack]
    assert broker.vhosts["/"].queues["q"].message_count == 1
