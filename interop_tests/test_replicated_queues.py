"""Replicated (quorum) queues on three broker nodes and etcd (the failover test on ZooKeeper
too), all started by the tests, with pika.

- A quorum queue declared on one node, published to with confirms through another, consumed on
  the third: `kill -9` of its leader moves it to a surviving node within the session TTL plus an
  election; every confirmed message not acked is there, transient ones (delivery_mode 1) as well
  as persistent ones, as on a RabbitMQ quorum queue; the ones a consumer held come back with
  redelivered=true and x-delivery-count 1; acked ones do not come back.
- The fault test: two publishers with confirms and host lists, and two consumers acking, run while the
  test kills the queue's leader with `kill -9` and restarts it, again and again, and a follower
  after every second leader kill (REPLICATED_QUEUE_LEADER_KILLS, default 4;
  REPLICATED_QUEUE_SEED repeats a run). It prints
  "confirmed lost: N" and asserts 0; against the harness's broken build
  (interop_tests/broken_replication_broker.py: confirms at once, replicates in 50 ms batches) it
  must report lost messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field

import pika
import pytest
from pika.exceptions import AMQPError as PikaError

from cluster.replication.replicated_queues import queue_id
from amqp_server.ctl.main import main as ctl_main
from cluster import connect, parse_cluster_address
from cluster.replication.election import GroupKeys, GroupRecord
from cluster.replication.wire import encode_hello
from interop_tests.broker_process import free_port
from interop_tests.cluster_nodes import (
    SESSION_TTL, ClusterNode, metric_samples, pika_parameters, queue_known_everywhere, three_nodes,
)
from interop_tests.pika_helpers import publish_across_failovers
from interop_tests.waiting import wait_until

QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def _parameters(node: ClusterNode) -> pika.ConnectionParameters:
    """As the cluster tests' parameters, and a node that accepts but does not answer yet (still
    joining after a restart) is passed over after 5 s in a host list."""
    parameters = pika_parameters(node)
    parameters.socket_timeout = 5
    return parameters


def _queue_node(node: ClusterNode, queue: str) -> str | None:
    """The node that holds `queue` now, as `node` sees it (None while it is down)."""
    info = node.api(f"queues/%2F/{queue}").json()
    return None if info.get("state") == "down" else info.get("node")


def _declare(nodes: dict[str, ClusterNode], node: ClusterNode, queue: str) -> None:
    """Declare a quorum queue on `node`; return once every node knows it and every member
    of its group is in sync."""
    connection = pika.BlockingConnection(_parameters(node))
    connection.channel().queue_declare(queue, durable=True, arguments=QUORUM)
    connection.close()
    queue_known_everywhere(nodes, queue)
    wait_until(lambda: sorted(node.api(f"queues/%2F/{queue}").json().get("in_sync", [])) == sorted(nodes),
               "every member of the queue's group is in sync")


def _drain(node: ClusterNode, queue: str,
           delivery_modes: dict[bytes, int | None] | None = None) -> list[tuple[bytes, bool, int | None]]:
    """(body, redelivered, x-delivery-count) of every message left, taken with basic.get.
    `delivery_modes` (if given) collects each one's delivery_mode by body."""
    connection = pika.BlockingConnection(_parameters(node))
    channel = connection.channel()
    taken = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        taken.append((body, method.redelivered, (properties.headers or {}).get("x-delivery-count")))
        if delivery_modes is not None:
            delivery_modes[body] = properties.delivery_mode
    connection.close()
    return taken


@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
def test_a_quorum_queue_moves_to_a_survivor_when_its_leader_is_killed(tmp_path, backend):
    with three_nodes(tmp_path, backend) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "ledger")
        shown = b.api("queues/%2F/ledger").json()
        assert (shown["type"], shown["node"], shown["leader"]) == ("quorum", "a", "a")
        assert sorted(shown["members"]) == sorted(shown["online"]) == ["a", "b", "c"]

        publisher = pika.BlockingConnection(_parameters(b))
        channel = publisher.channel()
        channel.confirm_delivery()
        for number in range(100):
            # Every odd one transient: a quorum queue keeps (and confirms after replicating) those too.
            properties = TRANSIENT if number % 2 else PERSISTENT
            channel.basic_publish("", "ledger", f"m{number}".encode(), properties)  # confirmed on return
        publisher.close()

        consumer = pika.BlockingConnection(_parameters(c))
        channel = consumer.channel()
        held = [channel.basic_get("ledger", auto_ack=False) for _ in range(20)]
        for method, _properties, _body in held[:10]:
            channel.basic_ack(method.delivery_tag)
        # The acks reach the leader before it dies (a basic.get round trip after them).
        assert channel.basic_get("ledger", auto_ack=False)[2] == b"m20"

        killed_at = time.monotonic()
        a.broker.kill()  # kill -9
        moved = wait_until(lambda: _queue_node(b, "ledger") in ("b", "c") and _queue_node(c, "ledger") in ("b", "c"),
                           "a survivor leads the queue", within=SESSION_TTL + 15)
        print(f"the queue moved to {_queue_node(b, 'ledger')} {moved:.1f} s after the poll started "
              f"({time.monotonic() - killed_at:.1f} s after kill -9; session TTL {SESSION_TTL} s)")
        try:
            consumer.close()  # its deliveries went through c's stand-in to the dead leader
        except (PikaError, OSError):
            pass

        delivery_modes: dict[bytes, int | None] = {}
        taken = _drain(b, "ledger", delivery_modes)
        bodies = [body for body, _, _ in taken]
        assert bodies == [f"m{n}".encode() for n in range(10, 100)], bodies  # acked ones stay gone; order kept
        assert all(delivery_modes[body] == (1 if int(body[1:]) % 2 else 2) for body in bodies), delivery_modes
        for body, redelivered, count in taken:
            number = int(body[1:])
            if number <= 20:  # held by c's consumer when the leader died
                assert (redelivered, count) == (True, 1), (body, redelivered, count)
            else:
                assert not redelivered, body

        a.broker.restart()
        wait_until(lambda: a.live_nodes() == ["a", "b", "c"] and _queue_node(a, "ledger") in ("b", "c"),
                   "the restarted node follows the new leader")


@pytest.mark.parametrize(
    ("default_queue_type", "arguments"),
    [("classic", {"x-quorum-initial-group-size": 3}), ("quorum", {})],
    ids=["group-size-argument", "quorum-default"],
)
def test_a_queue_declared_without_a_type_is_replicated_when_asked_to_be(tmp_path, default_queue_type, arguments):
    """x-quorum-initial-group-size, or `--default-queue-type quorum` on every node, makes a durable
    queue declared without x-queue-type a replicated one: a leader, three members, and its
    confirmed messages survive `kill -9` of the leader."""
    with three_nodes(tmp_path, extra_args=("--default-queue-type", default_queue_type)) as nodes:
        a, b = nodes["a"], nodes["b"]
        connection = pika.BlockingConnection(_parameters(a))
        channel = connection.channel()
        channel.queue_declare("asked", durable=True, arguments=dict(arguments))
        channel.queue_declare("plain-transient", durable=False)  # transient: classic whatever the default
        connection.close()
        queue_known_everywhere(nodes, "asked")
        wait_until(lambda: sorted(b.api("queues/%2F/asked").json().get("in_sync", [])) == sorted(nodes),
                   "every member of the queue's group is in sync")
        shown = b.api("queues/%2F/asked").json()
        assert (shown["type"], shown["leader"]) == ("quorum", "a")
        assert sorted(shown["members"]) == ["a", "b", "c"]
        assert a.api("queues/%2F/plain-transient").json()["type"] == "classic"

        publisher = pika.BlockingConnection(_parameters(b))
        channel = publisher.channel()
        channel.confirm_delivery()
        for number in range(50):
            channel.basic_publish("", "asked", f"m{number}".encode(), PERSISTENT)  # confirmed on return
        # Redeclared as first declared, through another node: still equivalent.
        channel.queue_declare("asked", durable=True, arguments=dict(arguments))
        publisher.close()

        a.broker.kill()  # kill -9 of the leader
        wait_until(lambda: _queue_node(b, "asked") in ("b", "c"), "a survivor leads the queue",
                   within=SESSION_TTL + 15)
        assert [body for body, _, _ in _drain(b, "asked")] == [f"m{n}".encode() for n in range(50)]


class _HeldConsumer:
    """A pika consumer (prefetch 5) that acks only when told, and notes basic.cancel."""

    def __init__(self, node: ClusterNode, queue: str) -> None:
        self.connection = pika.BlockingConnection(_parameters(node))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=5)
        self.received: list[tuple[int, bytes, bool]] = []  # (delivery tag, body, redelivered), not acked yet
        self.received_and_acked: list[tuple[int, bytes, bool]] = []
        self.cancelled = False
        self.channel.add_on_cancel_callback(lambda _frame: setattr(self, "cancelled", True))
        self.channel.basic_consume(queue, self._on_message)

    def _on_message(self, _channel, method, _properties, body: bytes) -> None:
        self.received.append((method.delivery_tag, body, method.redelivered))

    def pump(self) -> None:
        self.connection.process_data_events(time_limit=0.05)

    def ack_all(self) -> None:
        for tag, _body, _redelivered in self.received:
            self.channel.basic_ack(tag)
        self.received_and_acked.extend(self.received)
        self.received = []


def _publish_confirmed(node: ClusterNode, queue: str, count: int) -> None:
    """Publish m0..m{count-1} (persistent) to `queue` through `node`, each confirmed."""
    publisher = pika.BlockingConnection(_parameters(node))
    channel = publisher.channel()
    channel.confirm_delivery()
    for number in range(count):
        channel.basic_publish("", queue, f"m{number}".encode(), PERSISTENT)
    publisher.close()


def _wait_until_each_holds_its_prefetch(consumers: list[_HeldConsumer]) -> None:
    def each_holds_five() -> bool:
        for consumer in consumers:
            consumer.pump()
        return all(len(consumer.received) == 5 for consumer in consumers)

    wait_until(each_holds_five, "each consumer holds its prefetch of 5")


def _group_record(node: ClusterNode, queue: str) -> GroupRecord:
    """The queue's replica group record, read from the coordination service `node` uses."""
    args = node.broker.args
    address = parse_cluster_address(args[args.index("--cluster") + 1])

    async def read() -> GroupRecord:
        coordinator = await connect(address)
        try:
            record, _version = await GroupKeys(coordinator, queue_id("/", queue)).read()
        finally:
            await coordinator.close()
        assert record is not None
        return record

    return asyncio.run(read())


def _intrude(address: str, payload: bytes, within: float) -> tuple[bytes, bool]:
    """Connect to a replication port, send `payload` at once, read until the stream ends:
    (everything received, closed by the other side within `within` seconds)."""
    host, _, port = address.rpartition(":")
    received = bytearray()
    deadline = time.monotonic() + within
    with socket.create_connection((host, int(port)), timeout=5) as intruder:
        intruder.sendall(payload)
        while time.monotonic() < deadline:
            intruder.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = intruder.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return bytes(received), True
            if not chunk:
                return bytes(received), True
            received += chunk
    return bytes(received), False


def test_the_replication_port_gives_nothing_to_a_peer_without_the_cluster_secret(tmp_path):
    """Anyone reaching the leader's replication port: a version 1 follower's HELLO naming member b
    (no handshake), and a handshake answer made without the secret, are each closed having read
    no record (the leader logs the refusal with their address); the group stays in sync and the
    queue keeps confirming and delivering."""
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "guarded")
        publisher = pika.BlockingConnection(_parameters(b))
        channel = publisher.channel()
        channel.confirm_delivery()
        for number in range(20):
            channel.basic_publish("", "guarded", b"confidential-%d" % number, PERSISTENT)
        publisher.close()
        record = _group_record(a, "guarded")
        leader = nodes[record.leader]
        for payload in (encode_hello(0, 0, 0, "b", queue_id("/", "guarded")), os.urandom(64)):
            received, closed = _intrude(record.leader_address, payload, within=10)
            assert b"confidential" not in received
            assert closed, f"the stream stayed open, sending {len(received)} bytes"
            assert len(received) <= 64, received  # the handshake's challenge, nothing more
        refusals = [line for line in leader.broker.log_text().splitlines()
                    if "replication stream with 127.0.0.1:" in line and "refused" in line]
        assert len(refusals) == 2, refusals
        wait_until(lambda: sorted(c.api("queues/%2F/guarded").json().get("in_sync", [])) == sorted(nodes),
                   "every member of the queue's group is still in sync")
        assert _group_record(a, "guarded").term == record.term
        _publish_confirmed(c, "guarded", 1)
        bodies = [body for body, _, _ in _drain(c, "guarded")]
        assert bodies == [b"confidential-%d" % n for n in range(20)] + [b"m0"], bodies


def test_consumers_on_other_nodes_keep_consuming_across_a_leader_change(tmp_path):
    """RabbitMQ keeps a quorum queue's consumers across a leader change. Consumers on b and c
    (through stand-ins) hold 5 deliveries each when the leader a is `kill -9`ed: neither gets
    basic.cancel; the one on the new leader's node then consumes from the queue itself, the
    other from a stand-in reaching it; acks of the old delivery tags are accepted; the held
    messages come back redelivered and every message reaches a consumer."""
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "steady")
        consumers = [_HeldConsumer(b, "steady"), _HeldConsumer(c, "steady")]
        _publish_confirmed(b, "steady", 30)
        _wait_until_each_holds_its_prefetch(consumers)
        held = {body for consumer in consumers for _, body, _ in consumer.received}

        a.broker.kill()  # kill -9
        wait_until(lambda: _queue_node(b, "steady") in ("b", "c") and _queue_node(c, "steady") in ("b", "c"),
                   "a survivor leads the queue", within=SESSION_TTL + 15)
        for consumer in consumers:
            consumer.ack_all()  # the old leader's delivery tags: still valid on the client's channel

        def all_consumed() -> bool:
            for consumer in consumers:
                consumer.pump()
                assert not consumer.cancelled, "basic.cancel at the leader change"
                consumer.ack_all()
            seen = {body for consumer in consumers for _, body, _ in consumer.received_and_acked}
            return seen >= {f"m{n}".encode() for n in range(30)}

        wait_until(all_consumed, "every message reaches a consumer after the failover", within=30)
        assert all(consumer.channel.is_open for consumer in consumers)
        after = [(body, redelivered) for consumer in consumers for _, body, redelivered in
                 consumer.received_and_acked[5:]]
        assert {body for body, redelivered in after if redelivered} == held, after
        for consumer in consumers:
            consumer.connection.close()
        survivor = b if _queue_node(b, "steady") == "b" else c
        assert _drain(survivor, "steady") == []


def test_consumers_on_every_node_follow_a_leadership_transfer(tmp_path):
    """`ctl transfer_leadership` from a to c with a consumer on each node holding 5 deliveries:
    a's moves from the queue itself to a stand-in, b's from one stand-in to another, c's from
    a stand-in to the queue itself; none gets basic.cancel, the old tags can be acked, and
    every message reaches a consumer."""
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "moving")
        consumers = [_HeldConsumer(node, "moving") for node in (a, b, c)]
        _publish_confirmed(a, "moving", 40)
        _wait_until_each_holds_its_prefetch(consumers)
        code, text = _ctl(c, "transfer_leadership", "moving", "c")
        assert code == 0, text

        def moved() -> bool:
            for consumer in consumers:
                consumer.pump()
            return _queue_node(a, "moving") == "c" and _queue_node(b, "moving") == "c"

        wait_until(moved, "c leads and holds the queue")
        for consumer in consumers:
            consumer.ack_all()

        def all_consumed() -> bool:
            for consumer in consumers:
                consumer.pump()
                assert not consumer.cancelled, f"basic.cancel at the leadership transfer: consumer {consumers.index(consumer)}"
                consumer.ack_all()
            seen = {body for consumer in consumers for _, body, _ in consumer.received_and_acked}
            return seen >= {f"m{n}".encode() for n in range(40)}

        wait_until(all_consumed, "every message reaches a consumer after the transfer", within=30)
        assert all(consumer.channel.is_open for consumer in consumers)
        for consumer in consumers:
            consumer.connection.close()
        assert _drain(c, "moving") == []


def _role(node: ClusterNode, queue: str) -> str:
    """The role `node`'s own replica of `queue` has, as it reports it."""
    return node.api_json(f"queues/%2F/{queue}")["replica"]["role"]


def _raft_log(metrics_port: int, queue: str) -> tuple[int, int]:
    """(commit index, last written index) of the node's replica of `queue`, from its Prometheus
    per-object endpoint."""
    samples = metric_samples(metrics_port)
    labels = frozenset({("vhost", "/"), ("queue", queue)})
    return (int(samples["rabbitmq_raft_log_commit_index", labels]),
            int(samples["rabbitmq_raft_log_last_written_index", labels]))


def test_a_confirm_and_a_tx_commit_ok_wait_for_a_majority_of_the_group(tmp_path):
    """With both followers killed the leader holds the message but a majority does not: neither
    the confirm nor the commit-ok comes; once the leader has heard from no majority for the
    session TTL it steps down (check-quorum) and its clients are told: the confirm is a nack and
    the commit fails. One follower back, the group elects again and confirms come.

    Asserted as an order of events, not against a clock (the leader's check-quorum counts from
    the last ACK it heard, up to a heartbeat before the kill, so no fixed wait after the kill
    tells "still waiting" from "already stepped down"): the clients are connected before the
    kill and publish right after it; each outcome must find the leader already stepped down
    when it arrives, and the leader's log must hold both records, which only a leader appends."""
    metrics_port = free_port()
    with three_nodes(tmp_path, node_args={"a": ("--metrics-port", str(metrics_port))}) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "majority")
        assert _role(a, "majority") == "leader"
        committed_before, written_before = wait_until(
            lambda: (figures := _raft_log(metrics_port, "majority"))[0] == figures[1] and figures,
            "a's log is committed to its end")
        outcomes: dict[str, tuple[str, str]] = {}  # client -> (what it was told, a's role just after)
        ready = threading.Barrier(3, timeout=30)  # both clients set up, and the test
        go = threading.Event()

        def told(client: str, outcome: str) -> None:
            outcomes[client] = (outcome, _role(a, "majority"))

        def confirmed() -> None:
            connection = pika.BlockingConnection(_parameters(a))
            channel = connection.channel()
            channel.confirm_delivery()
            ready.wait()
            go.wait()
            try:
                channel.basic_publish("", "majority", b"confirm me", PERSISTENT)  # returns on basic.ack
                told("confirm", "acked")
            except pika.exceptions.NackError:
                told("confirm", "nacked")
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

        def committed() -> None:
            connection = pika.BlockingConnection(_parameters(a))
            channel = connection.channel()
            channel.tx_select()
            ready.wait()
            go.wait()
            channel.basic_publish("", "majority", b"commit me", PERSISTENT)
            try:
                channel.tx_commit()  # returns on tx.commit-ok
                told("commit", "ok")
            except pika.exceptions.AMQPError as error:
                told("commit", f"failed: {error!r}")
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

        workers = [threading.Thread(target=confirmed), threading.Thread(target=committed)]
        for worker in workers:
            worker.start()
        ready.wait()
        b.broker.kill()
        c.broker.kill()
        go.set()
        started = time.monotonic()
        for worker in workers:
            worker.join(SESSION_TTL + 10)
        told_after = time.monotonic() - started
        assert set(outcomes) == {"confirm", "commit"}, f"after {told_after:.1f} s the clients were told {outcomes}"
        (confirm, role_at_confirm), (commit, role_at_commit) = outcomes["confirm"], outcomes["commit"]
        assert confirm == "nacked" and commit.startswith("failed"), outcomes
        # Neither left while a still led: a nack or a failed commit is what its step-down sends.
        assert role_at_confirm != "leader" and role_at_commit != "leader", outcomes
        # Both records reached a's log while it led (a follower appends nothing of its own), and
        # were never committed there.
        committed_now, written_now = _raft_log(metrics_port, "majority")
        assert written_now >= written_before + 2 and committed_now <= committed_before, \
            (committed_before, written_before, committed_now, written_now)
        assert told_after < SESSION_TTL + 5, f"the clients were told after {told_after:.1f} s"
        b.broker.restart()

        def publish_confirmed() -> bool:
            connection = pika.BlockingConnection(_parameters(a))
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.basic_publish("", "majority", b"after", PERSISTENT)
                return True
            except pika.exceptions.NackError:
                return False
            finally:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    connection.close()

        wait_until(publish_confirmed, "a confirm once a majority is back", 30, every=0.5)
        drained = [body for body, _, _ in _drain(a, "majority")]
        # The nacked ones may be there or not (their records were in a's log); nothing else is.
        assert b"after" in drained and set(drained) <= {b"after", b"confirm me", b"commit me"}, drained


def _ctl(node: ClusterNode, *arguments: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = ctl_main(["--port", str(node.management_port), *arguments], out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def _group(node: ClusterNode, queue: str) -> dict:
    return node.api(f"queues/%2F/{queue}").json()


def test_ctl_adds_and_removes_members_and_moves_leadership_without_losing_messages(tmp_path):
    with three_nodes(tmp_path) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        connection = pika.BlockingConnection(_parameters(a))
        channel = connection.channel()
        channel.queue_declare("pair", durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 2})
        channel.queue_declare("classic", durable=True)
        channel.confirm_delivery()
        for number in range(20):
            channel.basic_publish("", "pair", f"m{number}".encode(), PERSISTENT)
        connection.close()
        queue_known_everywhere(nodes, "pair")
        wait_until(lambda: _group(b, "pair").get("members") == ["a", "b"], "the group is a and b")
        # c holds no replica: it shows the group all the same, as every RabbitMQ node does
        wait_until(lambda: (_group(c, "pair").get("leader"), _group(c, "pair").get("members")) == ("a", ["a", "b"]),
                   "c shows the group")

        code, text = _ctl(b, "add_member", "pair", "c")
        assert code == 0, text
        assert "Adding a replica for queue pair on node c" in text
        wait_until(lambda: sorted(_group(a, "pair")["in_sync"]) == ["a", "b", "c"], "c caught up")

        code, text = _ctl(c, "transfer_leadership", "pair", "c")
        assert code == 0, text
        wait_until(lambda: _group(a, "pair")["leader"] == "c" and _queue_node(a, "pair") == "c"
                   and _queue_node(b, "pair") == "c", "c leads and holds the queue")

        code, text = _ctl(a, "delete_member", "pair", "a")
        assert code == 0, text
        wait_until(lambda: _group(b, "pair")["members"] == ["b", "c"] and _group(b, "pair")["online"] == ["b", "c"],
                   "a is no longer a member")
        assert [body for body, _, _ in _drain(a, "pair")] == [f"m{n}".encode() for n in range(20)]

        code, text = _ctl(a, "add_member", "classic", "c")
        assert code == 70 and text.endswith("Error:\nCannot add members to a classic queue\n"), text
        code, text = _ctl(a, "delete_member", "pair", "nobody")
        assert code == 70 and "node 'nobody' is not a member" in text
        code, text = _ctl(a, "add_member", "pair", "nobody")
        assert code == 70 and "node 'nobody' is not a running member of the cluster" in text
        code, text = _ctl(a, "add_member", "missing", "c")
        assert code == 70 and "no queue 'missing' in vhost '/'" in text


@dataclass
class _Record:
    confirmed: list[int] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    first_deliveries: dict[int, list[int]] = field(default_factory=dict)  # per consumer
    seen: set[int] = field(default_factory=set)
    bad_redeliveries: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


PUBLISHER_SPAN = 10**9  # publisher p numbers its messages p * PUBLISHER_SPAN + 1, 2, ...


def _publish(hosts: list[pika.ConnectionParameters], record: _Record, stop: threading.Event, who: int) -> None:
    numbers = itertools.count(who * PUBLISHER_SPAN + 1)

    def one(channel) -> None:
        number = next(numbers)
        channel.basic_publish("", "faults", str(number).encode(), PERSISTENT)  # raises if nacked
        record.confirmed.append(number)

    publish_across_failovers(hosts, stop, one)


def _consume(hosts: list[pika.ConnectionParameters], record: _Record, stop: threading.Event, seed: int,
             who: int, away: threading.Event) -> None:
    """Consume and ack; keep away while `away` is set (the test sets it around a kill, so that
    what was confirmed last is still in the queue, where a lost message shows)."""
    chooser = random.Random(seed + who)
    firsts = record.first_deliveries.setdefault(who, [])
    while not stop.is_set():
        if away.is_set():
            time.sleep(0.05)
            continue
        try:
            connection = pika.BlockingConnection(hosts)
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)
            held = 0
            consuming_until = time.monotonic() + chooser.uniform(0.3, 1.0)
            for method, properties, body in channel.consume("faults", inactivity_timeout=0.5):
                if stop.is_set() or away.is_set() or time.monotonic() > consuming_until:
                    break
                if method is None:
                    continue
                number = int(body)
                count = (properties.headers or {}).get("x-delivery-count")
                if number in record.seen:
                    if not method.redelivered or not count:
                        record.bad_redeliveries.append(f"{number}: redelivered={method.redelivered} count={count}")
                else:
                    record.seen.add(number)
                    if not method.redelivered:  # (one redelivered the first time here was sent
                        firsts.append(number)   # to a consumer that left before reading it)
                if held < 5 and chooser.random() < 0.05:
                    held += 1
                    continue  # held unacked: comes back when its consumer or the leader goes
                channel.basic_ack(method.delivery_tag)
                record.acked.add(number)
            connection.close()
            # Away for a while, so that a backlog (where a lost message shows) builds up: while
            # a queue has consumers, flow control holds publishers back to their pace.
            time.sleep(chooser.uniform(0.5, 1.5))
        except (PikaError, OSError):
            time.sleep(0.2)


def _fault_run(tmp_path, module: str, leader_kills: int, seed: int) -> tuple[_Record, int]:
    """Run the workload while killing the leader `leader_kills` times; the record and how many
    confirmed messages are lost."""
    print(f"REPLICATED_QUEUE_SEED={seed}")
    chooser = random.Random(seed)
    record = _Record()
    with three_nodes(tmp_path, module=module) as nodes:
        _declare(nodes, nodes["a"], "faults")
        order = list(nodes.values())
        stop = threading.Event()
        away = threading.Event()
        # Publishers and consumers on every node first, each with the others as its fallbacks.
        workers = [
            threading.Thread(target=_publish, args=([_parameters(n) for n in order], record, stop, 1)),
            threading.Thread(target=_publish, args=([_parameters(n) for n in order[1:] + order[:1]], record, stop, 2)),
            threading.Thread(target=_consume, args=([_parameters(n) for n in order[2:] + order[:2]], record, stop,
                                                     seed, 1, away)),
            threading.Thread(target=_consume, args=([_parameters(n) for n in order], record, stop, seed, 2, away)),
        ]
        for worker in workers:
            worker.start()
        try:
            for kill in range(leader_kills):
                time.sleep(chooser.uniform(0.5, 2.0))
                observer = next(n for n in order if n.broker.process.poll() is None)
                leader = _queue_node(observer, "faults")
                if leader is None:
                    wait_until(lambda: _queue_node(observer, "faults") is not None, "the queue has a leader", 30)
                    leader = _queue_node(observer, "faults")
                victim = nodes[leader]
                away.set()  # the consumers leave for the kill: what is confirmed last stays queued
                time.sleep(0.3)
                print(f"kill -9 leader {leader} ({len(record.confirmed)} confirmed so far)")
                victim.broker.kill()
                survivor = next(n for n in order if n is not victim)
                wait_until(lambda: _queue_node(survivor, "faults") not in (None, leader),
                           "a survivor leads the queue", within=SESSION_TTL + 20)
                away.clear()
                victim.broker.restart()
                wait_until(lambda: victim.live_nodes() == sorted(nodes), "the killed node is back", 30)
                if kill % 2 == 1:  # and now and then a follower
                    leader = _queue_node(survivor, "faults")
                    follower = chooser.choice([n for n in order if n.name != leader])
                    print(f"kill -9 follower {follower.name} ({len(record.confirmed)} confirmed so far)")
                    follower.broker.kill()
                    time.sleep(chooser.uniform(0.2, 1.0))
                    follower.broker.restart()
                    wait_until(lambda: follower.live_nodes() == sorted(nodes), "the killed follower is back", 30)
            time.sleep(1.0)
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
        observer = order[0]
        wait_until(lambda: _queue_node(observer, "faults") is not None, "the queue has a leader", 30)
        left = {int(body) for body, _, _ in _drain(observer, "faults")}
    lost = [n for n in record.confirmed if n not in left and n not in record.acked]
    print(f"confirmed: {len(record.confirmed)}, acked: {len(record.acked)}, left in the queue: {len(left)}, "
          f"confirmed lost: {len(lost)}")
    return record, len(lost)


def test_no_confirmed_message_is_lost_over_leader_kills(tmp_path):
    seed = int(os.environ.get("REPLICATED_QUEUE_SEED", random.randrange(1 << 30)))
    kills = int(os.environ.get("REPLICATED_QUEUE_LEADER_KILLS", "4"))
    record, lost = _fault_run(tmp_path, "amqp_server", kills, seed)
    assert record.confirmed, "nothing was confirmed"
    assert lost == 0
    assert record.bad_redeliveries == []
    for firsts in record.first_deliveries.values():  # each consumer sees each publisher's messages in order
        for who in (1, 2):
            mine = [n for n in firsts if n // PUBLISHER_SPAN == who]
            assert mine == sorted(mine), f"publisher {who}'s order was not kept"


def test_the_fault_test_catches_a_build_that_confirms_before_a_majority_has_the_message(tmp_path):
    seed = int(os.environ.get("REPLICATED_QUEUE_SEED", random.randrange(1 << 30)))
    _record, lost = _fault_run(tmp_path, "interop_tests.broken_replication_broker", 4, seed)
    assert lost > 0
