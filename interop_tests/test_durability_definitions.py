"""What survives a restart: durable definitions and persistent messages, and nothing else.

Every test runs twice: with a clean restart (SIGTERM, then start) and with a crash (SIGKILL,
then start) of a dedicated broker on the same data directory. It also checks that disk space
comes back: purging, deleting or draining a queue frees its segment files (the layout is
the contract of docs/queue-files.md §1: data_dir/queues/<sha1 vhost>/<sha1 queue>/).
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from interop_tests.broker_process import BrokerProcess, free_port
from interop_tests.pika_helpers import connect
from interop_tests.waiting import poll

pytestmark = pytest.mark.timeout(60)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
ONE_MIB = 1024 * 1024
WAIT_S = 10.0  # for what a broker does after its reply: dead-lettering, freeing segment files


def clean_restart(broker: BrokerProcess) -> None:
    assert broker.stop() == 0, broker.log_text()
    broker.start()


def crash_restart(broker: BrokerProcess) -> None:
    broker.kill()
    broker.start()


@pytest.fixture(params=[clean_restart, crash_restart], ids=["sigterm", "sigkill"])
def restart(request) -> Callable[[BrokerProcess], None]:
    return request.param


def exists(connection: pika.BlockingConnection, kind: str, name: str) -> bool:
    """A passive declare on a fresh channel: True, or False on 404 NOT_FOUND."""
    channel = connection.channel()
    try:
        if kind == "queue":
            channel.queue_declare(name, passive=True)
        else:
            channel.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as error:
        assert error.reply_code == 404, error
        return False
    channel.close()
    return True


def reply_code_of(action: Callable[[pika.adapters.blocking_connection.BlockingChannel], object], connection) -> int:
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as error:
        action(channel)
    return error.value.reply_code


def bodies(channel, queue: str) -> list[tuple[bytes, bool]]:
    """Drain `queue` with basic.get: (body, redelivered) in queue order."""
    taken = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return taken
        taken.append((body, method.redelivered))


def queue_dir(broker: BrokerProcess, queue: str, vhost: str = "/") -> Path:
    sha1 = lambda name: hashlib.sha1(name.encode()).hexdigest()  # noqa: E731
    return broker.data_dir / "queues" / sha1(vhost) / sha1(queue)


def disk_usage(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file()) if directory.exists() else 0


def fill(channel, queue: str, count: int = 2000, size: int = 4096) -> None:
    """`count` persistent messages of `size` bytes, each confirmed (so on disk)."""
    channel.confirm_delivery()
    for index in range(count):
        channel.basic_publish("", queue, index.to_bytes(4, "big") * (size // 4), PERSISTENT)


# -- topology ---------------------------------------------------------------------------------


def declare_topology(channel) -> None:
    channel.exchange_declare("dur-direct", "direct", durable=True)
    channel.exchange_declare("dur-alt", "fanout", durable=True)
    channel.exchange_declare("dur-topic", "topic", durable=True, arguments={"alternate-exchange": "dur-alt"})
    channel.exchange_declare("dur-headers", "headers", durable=True)
    channel.exchange_declare("dur-dlx", "fanout", durable=True)
    channel.exchange_declare("tmp-exchange", "direct", durable=False)
    main_arguments = {"x-message-ttl": 60000, "x-dead-letter-exchange": "dur-dlx", "x-max-length": 1000}
    channel.queue_declare("dur-main", durable=True, arguments=main_arguments)
    for queue in ("dur-dead", "dur-alt-catch", "dur-headers-q"):
        channel.queue_declare(queue, durable=True)
    channel.queue_declare("tmp-queue", durable=False)
    channel.queue_declare("excl-queue", durable=True, exclusive=True)
    # dur-direct --orders--> dur-topic --orders.#--> dur-main: an exchange-to-exchange hop.
    channel.exchange_bind(destination="dur-topic", source="dur-direct", routing_key="orders")
    channel.queue_bind("dur-main", "dur-topic", "orders.#")
    channel.queue_bind("dur-dead", "dur-dlx")
    channel.queue_bind("dur-alt-catch", "dur-alt")
    channel.queue_bind("dur-headers-q", "dur-headers", arguments={"x-match": "all", "kind": "invoice"})
    channel.queue_bind("tmp-queue", "dur-direct", "to-transient")  # durable exchange, transient queue
    channel.queue_bind("excl-queue", "dur-direct", "to-exclusive")
    channel.basic_publish("", "tmp-queue", b"persistent, but in a transient queue", PERSISTENT)
    channel.basic_publish("", "excl-queue", b"persistent, but in an exclusive queue", PERSISTENT)


def test_durable_topology_survives_and_transient_does_not(broker_factory, restart):
    broker = broker_factory()
    before = connect(broker)
    declare_topology(before.channel())
    restart(broker)  # the declaring connection dies with the broker

    connection = connect(broker)
    for kind, name in [
        ("exchange", "dur-direct"), ("exchange", "dur-alt"), ("exchange", "dur-topic"),
        ("exchange", "dur-headers"), ("exchange", "dur-dlx"),
        ("queue", "dur-main"), ("queue", "dur-dead"), ("queue", "dur-alt-catch"), ("queue", "dur-headers-q"),
    ]:
        assert exists(connection, kind, name), f"durable {kind} {name} is gone"
    for kind, name in [("exchange", "tmp-exchange"), ("queue", "tmp-queue"), ("queue", "excl-queue")]:
        assert not exists(connection, kind, name), f"{kind} {name} should not survive a restart"
    assert not queue_dir(broker, "tmp-queue").exists() and not queue_dir(broker, "excl-queue").exists()

    # Types and arguments came back: redeclaring with other ones is 406 PRECONDITION_FAILED.
    channel = connection.channel()
    channel.queue_declare(
        "dur-main", durable=True,
        arguments={"x-message-ttl": 60000, "x-dead-letter-exchange": "dur-dlx", "x-max-length": 1000},
    )
    channel.exchange_declare("dur-topic", "topic", durable=True, arguments={"alternate-exchange": "dur-alt"})
    assert reply_code_of(lambda ch: ch.queue_declare("dur-main", durable=True, arguments={"x-message-ttl": 1}), connection) == 406
    assert reply_code_of(lambda ch: ch.exchange_declare("dur-topic", "direct", durable=True), connection) == 406

    # Bindings came back: the exchange-to-exchange hop, alternate-exchange, headers arguments.
    channel.basic_publish("dur-direct", "orders", b"via e2e", PERSISTENT)
    channel.basic_publish("dur-topic", "unbound.key", b"via alternate", PERSISTENT)
    channel.basic_publish("dur-headers", "", b"invoice", pika.BasicProperties(headers={"kind": "invoice"}))
    channel.basic_publish("dur-headers", "", b"receipt", pika.BasicProperties(headers={"kind": "receipt"}))
    assert [b for b, _ in bodies(channel, "dur-alt-catch")] == [b"via alternate"]
    assert [b for b, _ in bodies(channel, "dur-headers-q")] == [b"invoice"]
    # The dead-letter exchange argument works: a rejected message moves to dur-dead.
    method, _, body = channel.basic_get("dur-main")
    assert body == b"via e2e"
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert poll(lambda: channel.queue_declare("dur-dead", passive=True).method.message_count == 1, WAIT_S)
    assert [b for b, _ in bodies(channel, "dur-dead")] == [b"via e2e"]

    # A binding to a transient queue died with it: the re-created queue gets nothing.
    channel.queue_declare("tmp-queue", durable=False)
    channel.confirm_delivery()
    channel.basic_publish("dur-direct", "to-transient", b"unbound now")
    assert channel.queue_declare("tmp-queue", passive=True).method.message_count == 0
    connection.close()


def test_users_vhosts_and_permissions_survive(broker_factory, restart):
    port = free_port()
    broker = broker_factory(extra_args=("--management-port", str(port)))

    def put(path: str, document: dict) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", data=json.dumps(document).encode(), method="PUT",
            headers={"Content-Type": "application/json", "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status in (201, 204)

    put("/api/vhosts/durable-vhost", {})
    put("/api/users/durable-user", {"password": "s3cret", "tags": ""})
    put("/api/permissions/durable-vhost/durable-user", {"configure": "^own-.*", "write": ".*", "read": ".*"})
    restart(broker)

    connection = connect(broker, "durable-user", "s3cret", "durable-vhost")
    channel = connection.channel()
    channel.queue_declare("own-queue", durable=True)
    assert reply_code_of(lambda ch: ch.queue_declare("not-own", durable=True), connection) == 403
    connection.close()


# -- messages ---------------------------------------------------------------------------------


def test_persistent_messages_stay_in_order_and_transient_ones_go(broker_factory, restart):
    broker = broker_factory()
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare("mixed", durable=True)
    channel.confirm_delivery()
    kept = []
    for index in range(30):
        body = f"message {index}".encode() + bytes(range(256)) * (index % 4)
        if index % 3 == 0:
            channel.basic_publish("", "mixed", body, TRANSIENT)
        elif index % 3 == 1:
            channel.basic_publish("", "mixed", body)  # no delivery_mode: transient
        else:
            channel.basic_publish("", "mixed", body, pika.BasicProperties(delivery_mode=2, message_id=str(index)))
            kept.append(body)
    assert channel.queue_declare("mixed", passive=True).method.message_count == 30
    restart(broker)

    channel = connect(broker).channel()
    assert channel.queue_declare("mixed", passive=True).method.message_count == len(kept)
    assert bodies(channel, "mixed") == [(body, False) for body in kept]


def test_a_durable_server_named_queue_and_its_messages_survive(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    name = channel.queue_declare("", durable=True).method.queue
    assert name.startswith("amq.gen-")
    channel.confirm_delivery()
    channel.basic_publish("", name, b"kept", PERSISTENT)
    restart(broker)

    channel = connect(broker).channel()
    assert channel.queue_declare(name, passive=True).method.message_count == 1
    assert bodies(channel, name) == [(b"kept", False)]


def test_purged_queue_frees_its_files_and_stays_empty(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare("to-purge", durable=True)
    fill(channel, "to-purge")
    assert disk_usage(queue_dir(broker, "to-purge")) > 7 * ONE_MIB

    assert channel.queue_purge("to-purge").method.message_count == 2000
    assert poll(lambda: disk_usage(queue_dir(broker, "to-purge")) < ONE_MIB, WAIT_S), \
        disk_usage(queue_dir(broker, "to-purge"))
    restart(broker)

    channel = connect(broker).channel()
    assert channel.queue_declare("to-purge", passive=True).method.message_count == 0
    assert disk_usage(queue_dir(broker, "to-purge")) < ONE_MIB


def test_deleted_queue_frees_its_files_and_its_messages_never_come_back(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare("to-delete", durable=True)
    fill(channel, "to-delete")
    queues_before = disk_usage(broker.data_dir / "queues")
    assert queues_before > 7 * ONE_MIB

    assert channel.queue_delete("to-delete").method.message_count == 2000
    assert poll(lambda: not queue_dir(broker, "to-delete").exists(), WAIT_S), \
        list(queue_dir(broker, "to-delete").iterdir())
    assert disk_usage(broker.data_dir / "queues") < 64 * 1024
    restart(broker)

    connection = connect(broker)
    assert not exists(connection, "queue", "to-delete")
    channel = connection.channel()
    channel.queue_declare("to-delete", durable=True)
    assert channel.queue_declare("to-delete", passive=True).method.message_count == 0


def test_drained_queue_uses_almost_no_disk(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare("to-drain", durable=True)
    fill(channel, "to-drain")
    assert disk_usage(queue_dir(broker, "to-drain")) > 7 * ONE_MIB

    channel.basic_qos(prefetch_count=200)
    received = 0
    for method, _, _ in channel.consume("to-drain"):
        received += 1
        if received % 100 == 0:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if received == 2000:
            break
    channel.cancel()
    assert channel.queue_declare("to-drain", passive=True).method.message_count == 0
    assert poll(lambda: disk_usage(queue_dir(broker, "to-drain")) < ONE_MIB, WAIT_S), \
        disk_usage(queue_dir(broker, "to-drain"))
    restart(broker)

    channel = connect(broker).channel()
    assert channel.queue_declare("to-drain", passive=True).method.message_count == 0
    assert disk_usage(queue_dir(broker, "to-drain")) < ONE_MIB


def test_every_basic_property_survives_byte_for_byte(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare("props", durable=True)
    sent = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip",
        headers={"str": "ü", "int": -7, "big": 1 << 40, "bool": True, "list": [1, "two"],
                 "table": {"nested": "yes"}, "bytes": b"\x00\xff", "none": None},
        delivery_mode=2, priority=7, correlation_id="corr-1", reply_to="replies", expiration="600000",
        message_id="msg-1", timestamp=1_700_000_000, type="order.created", user_id="guest", app_id="durability-test",
    )
    channel.confirm_delivery()
    channel.basic_publish("", "props", b"\x00body\xff", sent)
    restart(broker)

    channel = connect(broker).channel()
    method, received, body = channel.basic_get("props", auto_ack=True)
    assert body == b"\x00body\xff" and not method.redelivered
    assert vars(received) == vars(sent)


def test_dead_lettered_and_length_dropped_messages_do_not_come_back(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.exchange_declare("dl-x", "fanout", durable=True)
    channel.queue_declare("dl-target", durable=True)
    channel.queue_bind("dl-target", "dl-x")
    channel.queue_declare("dl-source", durable=True, arguments={"x-dead-letter-exchange": "dl-x"})
    channel.queue_declare("capped", durable=True, arguments={"x-max-length": 5})
    channel.confirm_delivery()
    for index in range(10):
        channel.basic_publish("", "dl-source", f"dl {index}".encode(), PERSISTENT)
        channel.basic_publish("", "capped", f"capped {index}".encode(), PERSISTENT)
    for _ in range(4):  # dead-letter the first four
        method, _, _ = channel.basic_get("dl-source")
        channel.basic_nack(method.delivery_tag, requeue=False)
    channel.queue_declare("dl-source", passive=True)  # a round trip after the nacks
    restart(broker)

    channel = connect(broker).channel()
    assert [b for b, _ in bodies(channel, "dl-source")] == [f"dl {i}".encode() for i in range(4, 10)]
    assert [b for b, _ in bodies(channel, "dl-target")] == [f"dl {i}".encode() for i in range(4)]
    assert [b for b, _ in bodies(channel, "capped")] == [f"capped {i}".encode() for i in range(5, 10)]


def test_unacked_deliveries_come_back_redelivered_in_their_places(broker_factory, restart):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.queue_declare("unacked", durable=True)
    channel.confirm_delivery()
    for index in range(10):
        channel.basic_publish("", "unacked", f"m{index}".encode(), PERSISTENT)
    consumer = connect(broker).channel()
    taken = [consumer.basic_get("unacked") for _ in range(6)]
    consumer.basic_ack(taken[1][0].delivery_tag)  # m1 acked; m0, m2..m5 held unacked
    consumer.basic_ack(taken[4][0].delivery_tag)  # m4 acked
    consumer.queue_declare("unacked", passive=True)  # a round trip: the acks were processed
    restart(broker)

    channel = connect(broker).channel()
    expected = [(f"m{i}".encode(), i < 6) for i in (0, 2, 3, 5, 6, 7, 8, 9)]
    assert bodies(channel, "unacked") == expected


def test_confirmed_message_routed_to_several_durable_queues_is_in_each_after_sigkill(broker_factory):
    broker = broker_factory()
    channel = connect(broker).channel()
    channel.exchange_declare("fan", "fanout", durable=True)
    for queue in ("fan-1", "fan-2", "fan-3"):
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "fan")
    channel.confirm_delivery()
    for index in range(50):
        channel.basic_publish("fan", "", f"f{index}".encode() * 100, PERSISTENT)
    crash_restart(broker)

    channel = connect(broker).channel()
    for queue in ("fan-1", "fan-2", "fan-3"):
        assert bodies(channel, queue) == [(f"f{index}".encode() * 100, False) for index in range(50)]
