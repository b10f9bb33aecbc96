"""`--workers 2`: a client connection that landed on the worker not owning its queue moves to the
owner (amqp_server/runtime/handover.py) instead of having its messages forwarded over a cluster link.

Each test starts etcd and a two-worker group, declares a queue through a connection on worker 1
(its owner), and picks connections the kernel put on worker 2 by opening connections to the
shared port until one is listed by worker 2. Whether a message crossed a link is read from the
owner's cluster-link connections' byte counters (/api/connections, user amqp-server-cluster-link).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TypeVar

import aio_pika
import pika
from pamqp import commands

from interop_tests import aio_pika_helpers
from interop_tests.raw_client import RawClient
from interop_tests.broker_process import free_port
from interop_tests.pika_helpers import connect
from interop_tests.test_cluster_workers import GROUP_CONFIG, WorkerGroup, worker_group
from interop_tests.tls_helpers import make_tls_files, tls_config
from interop_tests.waiting import wait_until

LINK_USER = "amqp-server-cluster-link"
BODY = b"x" * 4096
MESSAGES = 200  # 800 KiB of bodies: far more than a link carries for anything else meanwhile
_names = itertools.count()
Client = TypeVar("Client")


def _on_worker(group: WorkerGroup, worker: int, open_client: Callable[[str], Client], close: Callable[[Client], None]
               ) -> tuple[str, Client]:
    """A connection to the shared port that the kernel put on `worker` (others are closed)."""
    for _attempt in range(40):
        name = f"client-{next(_names)}"
        client = open_client(name)
        wait_until(lambda: name in group.connection_names(1) | group.connection_names(2), f"{name} listed")
        if name in group.connection_names(worker):
            return name, client
        close(client)
    raise AssertionError(f"40 connections and none on worker {worker}")


def _pika(group: WorkerGroup, worker: int, heartbeat: int | None = None) -> tuple[str, pika.BlockingConnection]:
    return _on_worker(group, worker,
                      lambda name: connect(group.broker, label=name, connection_attempts=1, heartbeat=heartbeat),
                      lambda connection: connection.close())


def _pika_unless_refused(group: WorkerGroup, prefix: str) -> tuple[str, pika.BlockingConnection, int] | None:
    """A connection to the shared port, its name and the worker listing it; None if that worker refused it."""
    name = f"{prefix}-{next(_names)}"
    try:
        connection = connect(group.broker, label=name, connection_attempts=1)
    except pika.exceptions.AMQPError:
        return None
    wait_until(lambda: name in group.connection_names(1) | group.connection_names(2), f"{name} listed")
    return name, connection, 2 if name in group.connection_names(2) else 1


def _link_octets(group: WorkerGroup, worker: int) -> int:
    """Bytes both ways on the cluster links `worker` accepted from its sibling."""
    return sum(c["recv_oct"] + c["send_oct"] for c in group.api(worker, "connections").json() if c["user"] == LINK_USER)


def _declare_on_owner(group: WorkerGroup, queue: str) -> None:
    """`queue` declared through a connection on worker 1, which then owns it; known to worker 2."""
    _name, on_1 = _pika(group, 1)
    on_1.channel().queue_declare(queue, durable=True)
    on_1.close()
    wait_until(lambda: group.api(2, f"queues/%2F/{queue}").status_code == 200, "worker 2 knows the queue")
    assert group.api(2, f"queues/%2F/{queue}").json()["node"] == "w-1"


def _listed_only_by(group: WorkerGroup, name: str, worker: int) -> bool:
    return name in group.connection_names(worker) and name not in group.connection_names(3 - worker)


def test_a_consumer_and_a_publisher_move_to_the_queue_owner(tmp_path):
    with worker_group(tmp_path) as group:
        _declare_on_owner(group, "owned-by-1")
        links_before = _link_octets(group, 1)

        # A consumer on worker 2 (channel, prefetch 5, consume) moves to worker 1 at basic.consume.
        consumer_name, consumer = _pika(group, 2)
        channel = consumer.channel()
        channel.basic_qos(prefetch_count=5)
        received = []
        unacked_seen = []

        def on_message(channel, method, _properties, body) -> None:
            received.append(int(body[len(BODY):]))
            if len(received) % 50 == 0:  # the prefetch holds on the owner: 5 unacked, no more
                unacked_seen.append(group.api(1, "queues/%2F/owned-by-1").json()["messages_unacknowledged"])
            channel.basic_ack(method.delivery_tag)

        consumer_tag = channel.basic_consume("owned-by-1", on_message)
        wait_until(lambda: _listed_only_by(group, consumer_name, 1), "the consumer listed by worker 1 alone")

        # A publisher with confirms on worker 2 moves at its first publish; every publish confirmed.
        publisher_name, publisher = _pika(group, 2)
        publishing = publisher.channel()
        publishing.confirm_delivery()  # a nack raises NackError
        for number in range(MESSAGES):
            publishing.basic_publish("", "owned-by-1", BODY + str(number).encode(), mandatory=True)
        wait_until(lambda: _listed_only_by(group, publisher_name, 1), "the publisher listed by worker 1 alone")

        def all_received() -> bool:
            consumer.process_data_events(time_limit=0.2)
            return len(received) == MESSAGES

        wait_until(all_received, f"{MESSAGES} messages consumed")
        assert unacked_seen and max(unacked_seen) <= 5, unacked_seen
        channel.basic_cancel(consumer_tag)
        assert received == list(range(MESSAGES))
        wait_until(lambda: group.api(1, "queues/%2F/owned-by-1").json()["messages"] == 0, "every message acked")
        # Neither the publishes nor the deliveries crossed a link (800 KiB of bodies each way).
        assert _link_octets(group, 1) - links_before < 100_000
        consumer.close()
        publisher.close()


def test_an_unmovable_connection_stays_and_forwards(tmp_path):
    with worker_group(tmp_path) as group:
        _declare_on_owner(group, "owned-by-1")
        name, connection = _pika(group, 2)
        channel = connection.channel()
        channel.queue_declare("", exclusive=True)  # not replayable on another worker: it stays
        channel.confirm_delivery()
        links_before = _link_octets(group, 1)
        for number in range(MESSAGES):
            channel.basic_publish("", "owned-by-1", BODY + str(number).encode(), mandatory=True)
        received = []
        for method, _properties, body in channel.consume("owned-by-1", inactivity_timeout=10):
            assert method is not None, f"only {len(received)} of {MESSAGES} messages arrived"
            received.append(int(body[len(BODY):]))
            channel.basic_ack(method.delivery_tag)
            if len(received) == MESSAGES:
                break
        assert received == list(range(MESSAGES))
        assert _listed_only_by(group, name, 2)
        # Forwarded: the messages crossed the link twice (publish, delivery).
        assert _link_octets(group, 1) - links_before > 2 * MESSAGES * len(BODY)
        connection.close()


def test_an_aio_pika_publisher_and_consumer_move_and_keep_confirms_and_prefetch(tmp_path):
    with worker_group(tmp_path) as group:
        _declare_on_owner(group, "owned-by-1")

        async def scenario() -> None:
            async def on_worker_2() -> tuple[str, aio_pika.abc.AbstractConnection]:
                opened = []
                for _attempt in range(40):
                    name = f"aio-{next(_names)}"
                    connection = await aio_pika_helpers.connect(group.broker, label=name)
                    await asyncio.to_thread(wait_until,
                                            lambda: name in group.connection_names(1) | group.connection_names(2),
                                            f"{name} listed")
                    if name in group.connection_names(2):
                        break
                    opened.append(connection)
                else:
                    raise AssertionError("40 connections and none on worker 2")
                for other in opened:
                    await other.close()
                return name, connection

            name, connection = await on_worker_2()
            channel = await connection.channel(publisher_confirms=True)
            links_before = _link_octets(group, 1)
            tags = []
            for number in range(MESSAGES):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(BODY + str(number).encode()), routing_key="owned-by-1", mandatory=True)
                assert isinstance(confirmation, commands.Basic.Ack), confirmation
                tags.append(confirmation.delivery_tag)
            assert tags == list(range(1, MESSAGES + 1))
            assert _listed_only_by(group, name, 1)
            assert _link_octets(group, 1) - links_before < 100_000

            queue = await channel.declare_queue("owned-by-1", durable=True, passive=True)
            assert queue.declaration_result.message_count == MESSAGES
            await connection.close()

            # An aio-pika consumer moves at its passive queue.declare and consumes with its prefetch.
            name, connection = await on_worker_2()
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=10)
            queue = await channel.declare_queue("owned-by-1", durable=True, passive=True)
            assert queue.declaration_result.message_count == MESSAGES
            assert _listed_only_by(group, name, 1)
            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    received.append(int(message.body[len(BODY):]))
                    await message.ack()
                    if len(received) == MESSAGES:
                        break
            assert received == list(range(MESSAGES))
            assert _link_octets(group, 1) - links_before < 100_000
            await connection.close()

        asyncio.run(scenario())


def test_heartbeats_go_on_with_the_owner_after_the_move(tmp_path):
    with worker_group(tmp_path) as group:
        _declare_on_owner(group, "owned-by-1")

        def listed_by(worker: int, client: RawClient) -> bool:
            client.send_heartbeat()  # 1 s heartbeats: keep the connection while the API is asked
            port = client.sock.getsockname()[1]
            return any(c["peer_port"] == port for c in group.api(worker, "connections").json())

        for _attempt in range(40):
            client = RawClient("127.0.0.1", group.broker.port, timeout=5)
            client.handshake(heartbeat_s=1)
            wait_until(lambda: listed_by(1, client) or listed_by(2, client), "the raw client listed")
            if listed_by(2, client):
                break
            client.close()
        else:
            raise AssertionError("40 connections and none on worker 2")
        client.open_channel(1)
        client.send(commands.Basic.Get(queue="owned-by-1"), 1)  # moves the connection to worker 1
        client.expect(commands.Basic.GetEmpty)
        assert listed_by(1, client) and not listed_by(2, client)
        # The owner writes a heartbeat at least every second of silence, and keeps the
        # connection while the client's come in: four in a row, then the connection still works.
        for _beat in range(4):
            _channel, value = client.read_frame(timeout=2)
            assert value.name == "Heartbeat", value
            client.send_heartbeat()
        assert client.is_alive(1)
        client.close()


def test_a_tls_connection_stays_and_forwards(tmp_path):
    files = make_tls_files(tmp_path / "tls")
    tls_port = free_port()
    with worker_group(tmp_path, tls_config(files, GROUP_CONFIG), ("--ssl-port", str(tls_port),
                                                                   "--management-ssl-port", "0",
                                                                   "--metrics-ssl-port", "0")) as group:
        _declare_on_owner(group, "owned-by-1")

        def over_tls(name: str) -> pika.BlockingConnection:
            return connect(group.broker, label=name, port=tls_port, connection_attempts=1,
                           ssl_options=pika.SSLOptions(files.client_context(), "127.0.0.1"))

        name, connection = _on_worker(group, 2, over_tls, lambda c: c.close())
        channel = connection.channel()
        channel.confirm_delivery()
        links_before = _link_octets(group, 1)
        # Its first act uses worker 1's queue; the TLS session cannot leave worker 2's process.
        for number in range(MESSAGES):
            channel.basic_publish("", "owned-by-1", BODY + str(number).encode(), mandatory=True)
        method, _properties, body = channel.basic_get("owned-by-1", auto_ack=True)
        assert body == BODY + b"0"
        assert _listed_only_by(group, name, 2)
        assert _link_octets(group, 1) - links_before > MESSAGES * len(BODY)
        connection.close()


def test_a_connection_the_owner_refuses_stays_and_forwards(tmp_path):
    # Each shared listener takes 2 connections: worker 1, holding 2, cannot take a third by hand-over.
    config = GROUP_CONFIG + "\n[limits]\nmax_connections_per_listener = 2\n"
    with worker_group(tmp_path, config) as group:
        _declare_on_owner(group, "owned-by-1")
        on_1: list[pika.BlockingConnection] = []
        on_2: list[tuple[str, pika.BlockingConnection]] = []
        for _attempt in range(40):
            accepted = _pika_unless_refused(group, "limited")
            if accepted is None:
                continue  # a third on one worker: refused there
            name, connection, worker = accepted
            (on_2.append((name, connection)) if worker == 2 else on_1.append(connection))
            if len(on_1) == 2 and on_2:
                break
        assert len(on_1) == 2 and on_2, "no two connections on worker 1 and one on worker 2"
        name, connection = on_2[0]
        channel = connection.channel()
        channel.confirm_delivery()
        for number in range(10):
            channel.basic_publish("", "owned-by-1", f"m{number}".encode(), mandatory=True)
        method, _properties, body = channel.basic_get("owned-by-1", auto_ack=True)
        assert body == b"m0" and method.message_count == 9
        assert _listed_only_by(group, name, 2)
        log = group.broker.log_text()
        assert f"not taken from w-2" in log and "handed over to w-1" not in log
        for held in on_1 + [c for _n, c in on_2]:
            held.close()


def test_a_moved_connection_gives_back_its_place_under_the_first_workers_limit(tmp_path):
    config = GROUP_CONFIG + "\n[limits]\nmax_connections_per_listener = 2\n"
    with worker_group(tmp_path, config) as group:
        _declare_on_owner(group, "owned-by-1")
        name, moved = _pika(group, 2)
        moved.channel().basic_get("owned-by-1", auto_ack=True)  # moves it to worker 1
        wait_until(lambda: _listed_only_by(group, name, 1), "moved to worker 1")
        # Worker 2's shared listener holds nothing now: two more connections are accepted there.
        on_2 = []
        for _attempt in range(40):
            accepted = _pika_unless_refused(group, "after")
            if accepted is None:
                continue  # worker 1's listener is full (the moved one and one more)
            _other, connection, worker = accepted
            if worker == 2:
                on_2.append(connection)
                if len(on_2) == 2:
                    break
        assert len(on_2) == 2, "worker 2 still counts the connection it handed over"
        for connection in on_2 + [moved]:
            connection.close()
