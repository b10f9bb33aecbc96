"""The peer link client against this broker served in the test's event loop: login, a channel's
setup methods, publishes with confirms, a consumer with a prefetch and acks on it, a refused login
and an unreachable address reported with their causes, and host lists tried in order; and the
confirm window that turns a destination's confirms into acks on the source."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.config.auth import hash_password
from amqp_server.config.settings import ServerConfig, UserConfig
from amqp_server.peer_link import client
from amqp_server.peer_link.client import LinkError, PeerConnection
from amqp_server.peer_link.confirms import ConfirmWindow
from amqp_server.peer_link.reconnecting import AddressCycle, connect_first, is_permanent
from amqp_server.peer_link.uri import parse_uri, parse_uris
from amqp_server.runtime.server import AMQPServer
from amqp_server.wire import codec
from pamqp.header import ContentHeader
from pamqp.commands import Basic


class Heard:
    def __init__(self) -> None:
        self.deliveries: list[tuple[int, int, str, bytes]] = []
        self.confirms: list[tuple[int, bool, bool]] = []
        self.failures: list[LinkError] = []
        self.arrived = asyncio.Event()

    def delivered(self, channel: int, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
                  raw_header: bytes, body: bytes) -> None:
        self.deliveries.append((channel, delivery_tag, routing_key, body))
        self.arrived.set()

    def confirmed(self, channel: int, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self.confirms.append((delivery_tag, multiple, ack))
        self.arrived.set()

    def cancelled(self, channel: int, consumer_tag: str) -> None:
        pass

    def write_paused(self, paused: bool) -> None:
        pass

    def link_failed(self, error: LinkError) -> None:
        self.failures.append(error)


def _raw_header(body: bytes) -> bytes:
    return ContentHeader(0, len(body), Basic.Properties(delivery_mode=2)).marshal()


def _broker() -> Broker:
    config = ServerConfig()
    config.users = [*config.users, UserConfig("app", hash_password("secret"), ["administrator"])]
    broker = Broker(config)
    broker.access.set_permissions("app", "/", ".*", ".*", ".*")
    return broker


async def _serving(broker: Broker) -> AMQPServer:
    server = AMQPServer(broker, "127.0.0.1", 0)
    await server.start()
    return server


async def _wait(condition: Any, heard: Heard) -> None:
    async with asyncio.timeout(5):
        while not condition():
            heard.arrived.clear()
            await heard.arrived.wait()


def test_publish_with_confirms_then_consume_and_ack() -> None:
    async def main() -> None:
        broker = _broker()
        server = await _serving(broker)
        heard = Heard()
        link = PeerConnection(parse_uri(f"amqp://app:secret@127.0.0.1:{server.port}/%2F"), heard, "test link")
        await link.open()
        channel = await link.open_channel()
        await link.call(channel, commands.Queue.Declare(queue="q", durable=True), commands.Queue.DeclareOk)
        await link.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        for i in range(100):
            body = b"m%d" % i
            link.publish(channel, "", "q", _raw_header(body), body)
        await _wait(lambda: heard.confirms and max(tag for tag, _m, _a in heard.confirms) == 100, heard)
        assert all(ack for _tag, _multiple, ack in heard.confirms)
        consumer = await link.open_channel()
        await link.call(consumer, commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
        await link.call(consumer, commands.Basic.Consume(queue="q"), commands.Basic.ConsumeOk)
        await _wait(lambda: len(heard.deliveries) == 10, heard)
        queue = broker.vhosts["/"].queues["q"]
        assert (queue.unacked_count, queue.message_count) == (10, 90), "the prefetch holds the rest back"
        link.ack(consumer, 10, multiple=True)
        await _wait(lambda: len(heard.deliveries) == 20, heard)
        assert [body for *_rest, body in heard.deliveries[:3]] == [b"m0", b"m1", b"m2"]
        connection = next(iter(broker.connections))
        assert connection.client_properties["connection_name"] == "test link"
        link.close()
        await server.stop()

    asyncio.run(main())


def test_a_refused_login_and_an_unreachable_broker_are_reported_with_their_cause() -> None:
    async def main() -> None:
        broker = _broker()
        server = await _serving(broker)
        heard = Heard()
        refused = PeerConnection(parse_uri(f"amqp://app:wrong@127.0.0.1:{server.port}"), heard)
        try:
            await refused.open()
        except LinkError as error:
            assert error.code == 403 and "ACCESS_REFUSED" in error.text and is_permanent(error)
        else:
            raise AssertionError("the login was not refused")
        no_vhost = PeerConnection(parse_uri(f"amqp://app:secret@127.0.0.1:{server.port}/nowhere"), Heard())
        try:
            await no_vhost.open()
        except LinkError as error:
            assert error.code == 530 and "nowhere" in error.text
        else:
            raise AssertionError("the vhost was not refused")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            dead_port = probe.getsockname()[1]
        cycle = AddressCycle(parse_uris([f"amqp://app:secret@127.0.0.1:{dead_port}",
                                         f"amqp://app:secret@127.0.0.1:{server.port}"]))
        link = await connect_first(cycle, Heard())
        assert link.address.port == server.port and cycle.current.port == server.port
        assert [a.port for a in cycle.in_order()] == [server.port, dead_port]
        link.close()
        lonely = AddressCycle(parse_uris([f"amqp://app:secret@127.0.0.1:{dead_port}"]))
        try:
            await connect_first(lonely, Heard())
        except LinkError as error:
            assert f"127.0.0.1:{dead_port}" in error.text and error.code is None and not is_permanent(error)
        else:
            raise AssertionError("nothing listens there")
        await server.stop()

    asyncio.run(main())


class _Mute(asyncio.Protocol):
    """A peer that opens the connection and channels, then answers nothing more."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.reader = codec.FrameReader(131072)
        self.greeted = False

    def data_received(self, data: bytes) -> None:
        if not self.greeted:
            self.greeted, data = True, data[8:]  # the protocol header
            self.transport.write(codec.method_frame(0, commands.Connection.Start(mechanisms="PLAIN")))
        self.reader.feed(data)
        for frame_type, channel, payload in self.reader.frames():
            method = codec.decode_method(payload) if frame_type == codec.FRAME_METHOD else None
            if isinstance(method, commands.Connection.StartOk):
                answer: Any = commands.Connection.Tune(channel_max=0, frame_max=131072, heartbeat=0)
            elif isinstance(method, commands.Connection.Open):
                answer = commands.Connection.OpenOk()
            elif isinstance(method, commands.Channel.Open):
                answer = commands.Channel.OpenOk()
            else:
                continue
            self.transport.write(codec.method_frame(channel, answer))


def test_a_setup_method_the_peer_never_answers_fails_the_link_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(client, "CALL_TIMEOUT_S", 0.2)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Mute, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        link = PeerConnection(parse_uri(f"amqp://app:secret@127.0.0.1:{port}"), Heard())
        await link.open()
        channel = await link.open_channel()
        try:
            await link.call(channel, commands.Queue.Declare(queue="q"), commands.Queue.DeclareOk)
        except LinkError as error:
            assert f"127.0.0.1:{port}: no answer to Queue.Declare within 0.2 s" in error.text
        else:
            raise AssertionError("the call returned without an answer")
        link.close()
        server.close()

    asyncio.run(main())


class Refused:
    def __init__(self) -> None:
        self.tags: list[int] = []

    def refused(self, tag: int) -> None:
        self.tags.append(tag)


def test_a_confirm_window_acks_the_source_only_up_to_what_is_confirmed_in_order() -> None:
    window, refused = ConfirmWindow(), Refused()
    for tag in (11, 12, 13, 14, 15):
        window.published(tag)
    # 2 and 3 confirmed before 1 (1 waits for its fsync): nothing may be acked yet
    assert window.settle(2, False, True, refused) == (0, 0)
    assert window.settle(3, False, True, refused) == (0, 0)
    assert len(window) == 5
    # 1 comes: 1, 2 and 3 together, as one multiple ack up to 13
    assert window.settle(1, False, True, refused) == (13, 3)
    # 5 refused ahead of 4: nacked at once; 4's ack then settles both, acking 14 only
    assert window.settle(5, False, False, refused) == (0, 0)
    assert refused.tags == [15]
    assert window.settle(4, False, True, refused) == (14, 1)
    assert len(window) == 0 and refused.tags == [15]


def test_a_multiple_confirm_settles_the_prefix_and_a_multiple_nack_refuses_each() -> None:
    window, refused = ConfirmWindow(), Refused()
    for tag in range(1, 7):
        window.published(tag)
    assert window.settle(4, False, True, refused) == (0, 0)  # ahead
    assert window.settle(3, True, True, refused) == (4, 4)  # 1-3, and 4 that came ahead
    assert window.settle(4, False, True, refused) == (0, 0)  # (settled: a repeat changes nothing)
    assert window.settle(6, True, False, refused) == (0, 0)
    assert refused.tags == [5, 6] and len(window) == 0
    window.clear()
    window.published(9)
    assert window.settle(1, False, True, refused) == (9, 1)  # sequence numbers start again
