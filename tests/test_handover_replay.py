"""A connection on a worker's shared port that names a queue a sibling worker owns stops before
that frame (amqp_server/runtime/handover.py): what the client sent before it is the replay, the frame and
what follows the rest; a replay on a fresh connection gives the same state, and its replies are
exactly those the client already had."""

from __future__ import annotations

from pamqp import commands

from amqp_server.broker.access_control import CLUSTER_LINK_USER
from amqp_server.broker.broker import Broker
from amqp_server.connection.connection import OPEN, Connection
from amqp_server.runtime.handover import MAX_RECORDED, HandoverRecorder
from amqp_server.wire.states import HandoverState
from queues.queue import Queue
from tests.frame_driver import (PROTOCOL_HEADER, FakeClient, marshal, methods, plain_response, publish_frames,
                                raw_frame)

SIBLINGS = {"w-2": "\0test-w-2"}


class SiblingsQueue(Queue):
    """A queue as a worker holds one its sibling owns (cluster/links/remote_queue.py's RemoteQueue), here a
    plain queue with an owner's name: what the recorder asks of it, and an answer when a refused
    hand-over is handled here."""

    def __init__(self, name: str, owner: str, timers) -> None:
        super().__init__(name, "/", timers=timers)
        self.owner = owner

    @property
    def home_node(self) -> str:
        return self.owner

    def check_available(self) -> None:
        """The owner is live."""


def _broker_with_sibling_queue() -> Broker:
    broker = Broker()
    broker.vhosts["/"].queues["theirs"] = SiblingsQueue("theirs", "w-2", broker.timers)
    broker.vhosts["/"].queues["elsewhere"] = SiblingsQueue("elsewhere", "another-host", broker.timers)
    return broker


def _client(broker: Broker) -> tuple[FakeClient, list[str]]:
    moves: list[str] = []
    recorder = HandoverRecorder(SIBLINGS, lambda: moves.append("moved"))
    return FakeClient(broker, handover=recorder), moves


def _handshake_bytes() -> bytes:
    properties = {"product": "frame-driver", "capabilities": {"publisher_confirms": True}}
    return (PROTOCOL_HEADER
            + marshal(0, commands.Connection.StartOk(client_properties=properties, mechanism="PLAIN",
                                                     response=plain_response("guest", "guest")))
            + marshal(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
            + marshal(0, commands.Connection.Open(virtual_host="/")))


def _session_bytes() -> list[bytes]:
    """What a client sends before it consumes, as separate reads."""
    return [_handshake_bytes(), marshal(1, commands.Channel.Open()),
            marshal(1, commands.Basic.Qos(prefetch_count=5)), marshal(1, commands.Confirm.Select()),
            b"\x08\x00\x00\x00\x00\x00\x00\xce"]


def test_a_consume_of_a_siblings_queue_stops_the_connection_before_it():
    client, moves = _client(_broker_with_sibling_queue())
    before = b""
    replies = b""
    for data in _session_bytes():
        client.connection.receive_data(data)
        before += data
        replies += client.connection.take_output()
    consume = marshal(1, commands.Basic.Consume(queue="theirs", consumer_tag="c1"))
    later = publish_frames(1, b"after", routing_key="theirs")
    # The consume and a publish after it in one read: neither is handled here.
    client.connection.receive_data(consume + later)
    recorder = client.connection.handover
    assert moves == ["moved"]
    assert recorder.state is HandoverState.MOVING
    assert (recorder.owner, recorder.queue) == ("w-2", "theirs")
    assert client.connection.take_output() == b""  # no consume-ok from this worker
    assert recorder.replay == before
    assert recorder.rest == consume + later
    client.connection.receive_data(b"more")  # read before reading stopped: passed on too
    assert recorder.rest == consume + later + b"more"

    # The owner replays it on a fresh connection: the same state, the replies the client had.
    owner = Connection(_broker_with_sibling_queue(), peer_host="127.0.0.1")
    owner.receive_data(recorder.replay)
    assert owner.take_output() == replies
    assert owner.state is OPEN and sorted(owner.channels) == [1]
    assert owner.channels[1].prefetch_count == 5 and owner.channels[1].confirms is not None


def test_the_replay_ends_where_the_frame_began_when_it_arrived_in_pieces():
    client, moves = _client(_broker_with_sibling_queue())
    stream = b"".join(_session_bytes()) + marshal(1, commands.Basic.Get(queue="theirs"))
    for index in range(len(stream)):  # one byte per read: the frame boundary is inside a read
        client.connection.receive_data(stream[index:index + 1])
    recorder = client.connection.handover
    assert moves == ["moved"]
    assert recorder.replay == b"".join(_session_bytes())
    assert recorder.rest == marshal(1, commands.Basic.Get(queue="theirs"))


def test_a_publish_to_a_siblings_queue_through_the_default_exchange_moves():
    client, moves = _client(_broker_with_sibling_queue())
    for data in _session_bytes():
        client.connection.receive_data(data)
    publish = publish_frames(1, b"m", routing_key="theirs")
    client.connection.receive_data(publish)
    assert moves == ["moved"] and client.connection.handover.rest == publish


def test_a_refused_hand_over_handles_the_rest_here():
    client, moves = _client(_broker_with_sibling_queue())
    for data in _session_bytes():
        client.connection.receive_data(data)
    client.take()
    client.connection.receive_data(publish_frames(1, b"m", routing_key="theirs"))
    assert moves == ["moved"] and client.take() == []
    client.connection.stay_after_handover()
    assert client.connection.handover is None
    # Handled here now: the publish is confirmed by this worker (confirm.select was on).
    assert [type(m) for m in methods(client.take())] == [commands.Basic.Ack]
    assert client.connection.vhost.queues["theirs"].message_count == 1


def test_anything_not_replayable_fixes_the_connection_here():
    for unreplayable in (marshal(1, commands.Queue.Declare(queue="mine", exclusive=True)),
                         marshal(1, commands.Exchange.Declare(exchange="x", exchange_type="direct")),
                         publish_frames(1, b"x", exchange="amq.direct", routing_key="theirs")):
        client, moves = _client(_broker_with_sibling_queue())
        for data in _session_bytes():
            client.connection.receive_data(data)
        client.connection.receive_data(unreplayable)
        assert client.connection.handover is None, unreplayable
        client.connection.receive_data(publish_frames(1, b"m", routing_key="theirs"))
        assert moves == [], unreplayable
        assert client.connection.vhost.queues["theirs"].message_count == 1  # handled here


def test_a_queue_of_a_node_on_another_host_does_not_move_the_connection():
    client, moves = _client(_broker_with_sibling_queue())
    for data in _session_bytes():
        client.connection.receive_data(data)
    client.connection.receive_data(publish_frames(1, b"m", routing_key="elsewhere"))
    assert moves == [] and client.connection.handover is None


def test_a_connection_that_sent_too_much_stays():
    client, moves = _client(_broker_with_sibling_queue())
    client.connection.receive_data(_handshake_bytes())
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    client.connection.receive_data(heartbeat * (MAX_RECORDED // len(heartbeat)))
    client.connection.receive_data(marshal(1, commands.Channel.Open()))
    client.connection.receive_data(publish_frames(1, b"m", routing_key="theirs"))
    assert moves == [] and client.connection.handover is None


def test_handed_over_forgets_the_connection():
    broker = _broker_with_sibling_queue()
    client, moves = _client(broker)
    for data in _session_bytes():
        client.connection.receive_data(data)
    assert client.connection in broker.connections
    client.take()
    client.connection.receive_data(marshal(1, commands.Basic.Get(queue="theirs")))
    client.connection.handed_over()
    assert client.connection not in broker.connections
    assert client.connection.channels == {}
    assert client.take() == []


def test_a_cluster_link_never_moves():
    broker = _broker_with_sibling_queue()
    broker.access.admit_cluster_links("link-secret")
    client, moves = _client(broker)
    properties = {"product": "amqp-server cluster link", "capabilities": {}}
    client.connection.receive_data(
        PROTOCOL_HEADER
        + marshal(0, commands.Connection.StartOk(client_properties=properties, mechanism="PLAIN",
                                                 response=plain_response(CLUSTER_LINK_USER, "link-secret")))
        + marshal(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
        + marshal(0, commands.Connection.Open(virtual_host="/")) + marshal(1, commands.Channel.Open()))
    assert client.connection.is_cluster_link
    client.connection.receive_data(publish_frames(1, b"m", routing_key="theirs"))
    assert moves == [] and client.connection.handover is None


def test_a_publish_routed_only_to_one_siblings_queues_moves_and_a_mixed_one_stays():
    broker = _broker_with_sibling_queue()
    vhost = broker.vhosts["/"]
    vhost.queues["mine"] = Queue("mine", "/", timers=broker.timers)
    vhost.bind(vhost.exchanges["amq.direct"], vhost.queues["theirs"], "to-them", {})
    vhost.bind(vhost.exchanges["amq.fanout"], vhost.queues["theirs"], "", {})
    vhost.bind(vhost.exchanges["amq.fanout"], vhost.queues["mine"], "", {})
    for exchange, key, moves_expected in (("amq.direct", "to-them", ["moved"]), ("amq.fanout", "", []),
                                          ("amq.direct", "nowhere", [])):
        client, moves = _client(broker)
        for data in _session_bytes():
            client.connection.receive_data(data)
        client.connection.receive_data(publish_frames(1, b"m", exchange=exchange, routing_key=key))
        assert moves == moves_expected, (exchange, key)


def _counts(broker: Broker) -> tuple[int, int, int, int]:
    stats = broker.stats
    return stats.connections_opened, stats.connections_closed, stats.channels_opened, stats.channels_closed


def test_a_moved_connection_counts_once_opened_and_once_closed_across_the_workers():
    """rabbitmq_connections_opened_total and _closed_total summed over the workers (RabbitMQ's
    churn rates) see one connection and one channel, not a close and a second open at the move."""
    import asyncio
    import socket

    from amqp_server.broker.connection_limits import ConnectionLimit
    from amqp_server.runtime.handover import MovedConnection
    from amqp_server.runtime.server import AMQPProtocol

    first_broker = _broker_with_sibling_queue()
    client, moves = _client(first_broker)
    for data in _session_bytes():
        client.connection.receive_data(data)
    client.connection.receive_data(marshal(1, commands.Basic.Get(queue="theirs")))
    recorder = client.connection.handover
    moved = MovedConnection(recorder.replay, recorder.rest, (1,), "theirs", "w-1")
    client.connection.handed_over()
    assert _counts(first_broker) == (1, 0, 1, 0)  # it moved: it did not close here

    async def owner_side(take: bool) -> tuple[int, int, int, int]:
        owner_broker = _broker_with_sibling_queue()
        with socket.create_server(("127.0.0.1", 0)) as listener, \
                socket.create_connection(listener.getsockname()) as _peer:
            accepted, _ = listener.accept()
            with accepted:
                protocol = AMQPProtocol(owner_broker, set(), ConnectionLimit("listener", 0), moved=moved)
                assert protocol.replay(accepted)
                if take:
                    assert _counts(owner_broker) == (0, 0, 0, 0)  # opened on the first worker
                    protocol.connection.transport_closed()  # it ends here
                else:
                    protocol.forget()  # refused: the first worker keeps it
        return _counts(owner_broker)

    assert asyncio.run(owner_side(take=True)) == (0, 1, 0, 1)
    assert asyncio.run(owner_side(take=False)) == (0, 0, 0, 0)


def test_an_amqp_0_8_consume_of_a_siblings_queue_moves_and_replays_in_0_8():
    # The recorder reads the client's methods in the protocol the connection speaks: a 0-8
    # basic.consume (no arguments table) names its queue as a 0-9-1 one does.
    client, moves = _client(_broker_with_sibling_queue())
    session = (_handshake_bytes().replace(PROTOCOL_HEADER, b"AMQP\x01\x01\x08\x00", 1)
               + raw_frame(1, 1, b"\x00\x14\x00\x0a\x00")  # channel.open
               + marshal(1, commands.Basic.Qos(prefetch_count=5)))
    client.connection.receive_data(session)
    replies = client.connection.take_output()
    consume = raw_frame(1, 1, b"\x00\x3c\x00\x14" + b"\x00\x00" + b"\x06theirs" + b"\x02c1" + b"\x00")
    client.connection.receive_data(consume)
    recorder = client.connection.handover
    assert moves == ["moved"] and (recorder.owner, recorder.queue) == ("w-2", "theirs")
    assert (recorder.replay, recorder.rest) == (session, consume)
    owner = Connection(_broker_with_sibling_queue(), peer_host="127.0.0.1")
    owner.receive_data(recorder.replay)
    assert owner.take_output() == replies
    assert owner.state is OPEN and owner.protocol.name == "AMQP 0-8" and sorted(owner.channels) == [1]
