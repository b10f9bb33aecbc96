"""The coordination service failing under three running broker nodes, with clients at work.

- `kill -9` of the raft leader of a three-member etcd (made the member the nodes talk to) while clients publish with confirms (to
  queues of the node they are connected to and of other nodes) and consume: the brokers carry
  on; declarations work again once etcd has a new leader and reach every node; membership never
  drops a node; no confirmed message is lost.
- The whole coordination service killed (every etcd member, or the ZooKeeper): every node refuses
  a new declaration with 541 INTERNAL_ERROR within a bounded time instead of hanging; publishing
  with confirms to existing queues keeps working; when the service returns, declarations work
  again everywhere, membership is whole, and nothing defined or confirmed before is lost.
- One node cut off from the coordination service alone (a TCP forwarder the test cuts): the
  others drop it and see its queue down while its own clients keep publishing; it comes back
  whole when the partition heals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from interop_tests.cluster_nodes import (
    NAMES, ClusterNode, drain, pika_parameters, queue_known_everywhere, three_nodes,
)
from interop_tests.coordination_services import CoordinationService, EtcdMember, start_etcd, start_zookeeper
from interop_tests.tcp_cut import TcpCut
from interop_tests.waiting import wait_until

PERSISTENT = pika.BasicProperties(delivery_mode=2)
# etcd's and kazoo's own retry deadline is 10 s (cluster/etcd.py, cluster/zookeeper.py): the first
# refusal comes after it; this bounds it with room for a loaded machine.
REFUSAL_WITHIN_S = 25.0
COMMIT_REFUSED = "INTERNAL_ERROR - could not commit definitions: the cluster's coordination service is out of reach"


class ClientThread(threading.Thread):
    """A pika client on `node` using `queue` in a thread of its own until `stop()`; `error` is
    what stopped it early."""

    def __init__(self, node: ClusterNode, queue: str) -> None:
        super().__init__(daemon=True)
        self.node, self.queue = node, queue
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        assert not self.is_alive(), f"the {type(self).__name__} on {self.node.name} of {self.queue} did not stop"


class Publisher(ClientThread):
    """Publishes persistent, numbered messages with confirms until stopped; keeps the bodies the
    broker confirmed."""

    def __init__(self, node: ClusterNode, queue: str) -> None:
        super().__init__(node, queue)
        self.confirmed: list[bytes] = []
        self.nacked = 0

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika_parameters(self.node))
            channel = connection.channel()
            channel.confirm_delivery()
            number = 0
            while not self.halt.is_set():
                body = f"{self.node.name}>{self.queue} {number}".encode()
                number += 1
                try:
                    channel.basic_publish("", self.queue, body, PERSISTENT)
                except pika.exceptions.NackError:
                    self.nacked += 1
                    continue
                self.confirmed.append(body)
            connection.close()
        except BaseException as error:  # the test reads it
            self.error = error


class Consumer(ClientThread):
    """Consumes with acks until stopped; keeps the bodies it acked."""

    def __init__(self, node: ClusterNode, queue: str) -> None:
        super().__init__(node, queue)
        self.acked: list[bytes] = []

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika_parameters(self.node))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=50)

            def deliver(channel: Any, method: Any, _properties: Any, body: bytes) -> None:
                channel.basic_ack(method.delivery_tag)
                self.acked.append(body)

            channel.basic_consume(self.queue, deliver)
            while not self.halt.is_set():
                connection.process_data_events(time_limit=0.1)
            connection.close()
        except BaseException as error:  # the test reads it
            self.error = error


class MembershipWatch(threading.Thread):
    """Asks every node's /api/nodes over and over until stopped; keeps every answer that is
    not all three nodes."""

    def __init__(self, nodes: dict[str, ClusterNode]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.wrong: list[tuple[str, list[str]]] = []
        self.asked = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for node in self.nodes.values():
                try:
                    listed = node.live_nodes()
                except (requests.RequestException, ValueError) as error:
                    listed = [f"no answer: {error!r}"]
                self.asked += 1
                if listed != list(NAMES):
                    self.wrong.append((node.name, listed))
            self.halt.wait(0.2)

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def _confirmed_lost(publishers: list[Publisher], received: dict[str, set[bytes]]) -> dict[str, int]:
    """Per queue: how many confirmed messages are in neither what consumers acked nor what is left."""
    lost: dict[str, int] = {}
    for publisher in publishers:
        missing = [body for body in publisher.confirmed if body not in received[publisher.queue]]
        lost[publisher.queue] = lost.get(publisher.queue, 0) + len(missing)
    return lost


def _declare_and_route_everywhere(nodes: dict[str, ClusterNode], tag: str) -> None:
    """Each node declares a queue bound to amq.direct; the next node publishes to it with a
    confirm (it routes there only if the declaration and binding reached it) and the third gets it."""
    names = list(nodes)
    for index, name in enumerate(names):
        declarer, router, reader = (nodes[names[(index + k) % 3]] for k in range(3))
        queue = f"{tag}-{name}"
        connection = pika.BlockingConnection(pika_parameters(declarer))
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "amq.direct", queue)
        connection.close()
        queue_known_everywhere(nodes, queue)

        def routed() -> bool:
            with pika.BlockingConnection(pika_parameters(router)) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                try:
                    channel.basic_publish("amq.direct", queue, b"routed", PERSISTENT, mandatory=True)
                except pika.exceptions.UnroutableError:
                    return False  # the binding has not reached this node yet
                return True

        wait_until(routed, f"{router.name} routes to {queue} declared on {declarer.name}")
        assert drain(reader, queue) == [b"routed"]


def test_kill_9_of_the_etcd_leader_under_working_brokers(tmp_path):
    service = start_etcd(tmp_path / "etcd", members=3)
    try:
        with three_nodes(tmp_path, service=service) as nodes:
            a, b, c = nodes["a"], nodes["b"], nodes["c"]
            for node in (a, b, c):  # each owns one queue
                with pika.BlockingConnection(pika_parameters(node)) as connection:
                    connection.channel().queue_declare(f"on-{node.name}", durable=True)
            for node in (a, b, c):
                queue_known_everywhere(nodes, f"on-{node.name}")

            # Publishers to a queue of their own node and to one of another; a consumer on a of
            # b's queue (through the link), another on c of c's own.
            publishers = [Publisher(a, "on-a"), Publisher(b, "on-a"), Publisher(c, "on-b"), Publisher(a, "on-c")]
            consumers = [Consumer(a, "on-b"), Consumer(c, "on-c")]
            membership = MembershipWatch(nodes)
            for worker in (*publishers, *consumers, membership):
                worker.start()
            wait_until(lambda: all(len(p.confirmed) >= 20 for p in publishers), "every publisher is going",
                       within=30)

            # The leader is the member every node talks to first (the first of its --cluster list):
            # its calls and watches have to move, and the cluster has to elect a new leader.
            leader = service.etcd_members[0]
            service.make_leader(leader)
            service.kill9(leader)
            killed_at = time.monotonic()
            counts_at_kill = [len(p.confirmed) for p in publishers]

            def new_leader() -> EtcdMember | None:
                try:
                    return service.etcd_leader()
                except (RuntimeError, OSError):
                    return None  # still electing

            electing = time.monotonic()
            wait_until(new_leader, "the surviving etcd members elect a leader")
            print(f"etcd leader {leader.name} killed; a new leader after {time.monotonic() - electing:.1f} s")

            # Declarations work again, on every node, and reach the others.
            _declare_and_route_everywhere(nodes, "after-election")
            print(f"every node declared, bound and routed {time.monotonic() - killed_at:.1f} s after the kill")

            # Clients carried on through it all.
            wait_until(lambda: all(len(p.confirmed) >= counts_at_kill[i] + 20 for i, p in enumerate(publishers)),
                       "every publisher confirms after the kill", within=30)
            for worker in (*publishers, *consumers, membership):
                worker.stop()
            errors = [(w.node.name, w.queue, w.error) for w in (*publishers, *consumers) if w.error]
            assert not errors, f"clients failed: {errors}"
            assert sum(p.nacked for p in publishers) == 0
            assert membership.asked > 0 and not membership.wrong, f"membership was wrong: {membership.wrong[:5]}"
            for node in (a, b, c):
                assert node.live_nodes() == list(NAMES)

            received = {queue: set(drain(b, queue)) for queue in ("on-a", "on-b", "on-c")}
            for consumer in consumers:
                received[consumer.queue] |= set(consumer.acked)
            lost = _confirmed_lost(publishers, received)
            confirmed = sum(len(p.confirmed) for p in publishers)
            print(f"confirmed messages lost over the etcd leader's kill -9: {sum(lost.values())} of {confirmed} "
                  f"(per queue {lost})")
            assert sum(lost.values()) == 0
    finally:
        service.stop()


def _refusal(action: Callable[[Any], Any], node: ClusterNode) -> tuple[int, str, float]:
    """Run `action(channel)` on a new connection to `node`; the connection.close code and text
    it got, and the seconds it took."""
    started = time.monotonic()
    connection = pika.BlockingConnection(pika_parameters(node))
    try:
        action(connection.channel())
    except pika.exceptions.ConnectionClosedByBroker as refused:
        return refused.reply_code, refused.reply_text, time.monotonic() - started
    connection.close()
    return 200, "accepted", time.monotonic() - started


@pytest.fixture(params=["etcd", "zookeeper"])
def coordination(request, tmp_path):
    if request.param == "etcd":
        service = start_etcd(tmp_path / "etcd", members=3)
    else:
        service = start_zookeeper(tmp_path / "zk")
    yield service
    service.stop()


def test_the_coordination_service_down_and_back(tmp_path, coordination: CoordinationService):
    with three_nodes(tmp_path, service=coordination) as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        confirmed: dict[str, list[bytes]] = {}
        for node in (a, b, c):
            queue = f"held-{node.name}"
            with pika.BlockingConnection(pika_parameters(node)) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare(queue, durable=True)
                channel.queue_bind(queue, "amq.topic", f"{node.name}.#")
                for number in range(5):
                    channel.basic_publish("", queue, f"before {number}".encode(), PERSISTENT)
            confirmed[queue] = [f"before {number}".encode() for number in range(5)]
        for node in (a, b, c):
            queue_known_everywhere(nodes, f"held-{node.name}")

        coordination.kill9_all()
        outage_started = time.monotonic()

        # Every node refuses a new declaration (a queue, an exchange, a binding), all at once.
        attempts: dict[str, tuple[int, str, float]] = {}
        actions: dict[str, Callable[[Any], Any]] = {
            "a": lambda channel: channel.queue_declare("new-during-outage", durable=True),
            "b": lambda channel: channel.exchange_declare("new-exchange", "topic", durable=True),
            "c": lambda channel: channel.queue_bind("held-c", "amq.topic", "new.binding"),
        }
        threads = [threading.Thread(target=lambda name=name: attempts.__setitem__(
            name, _refusal(actions[name], nodes[name])), daemon=True) for name in NAMES]
        for thread in threads:
            thread.start()

        # Meanwhile every owner keeps taking messages with confirms, and so does a queue of
        # another node through the link (a to b's queue).
        for publisher_node, queue in ((a, "held-a"), (b, "held-b"), (c, "held-c"), (a, "held-b")):
            with pika.BlockingConnection(pika_parameters(publisher_node)) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare(queue, durable=True)  # an equivalent redeclare changes nothing
                for number in range(20):
                    body = f"during {publisher_node.name} {number}".encode()
                    channel.basic_publish("", queue, body, PERSISTENT)
                    confirmed[queue].append(body)

        for thread in threads:
            thread.join(REFUSAL_WITHIN_S + 5)
        for name in NAMES:
            assert name in attempts, f"{name} neither accepted nor refused a declaration within {REFUSAL_WITHIN_S} s"
            code, text, took = attempts[name]
            print(f"{name} refused its declaration after {took:.1f} s: {code} {text}")
            assert (code, text) == (541, COMMIT_REFUSED)
            assert took < REFUSAL_WITHIN_S
        # Once one refusal came, the next on that node comes at once (while the service is away).
        code, _text, took = _refusal(lambda channel: channel.queue_declare("again-during-outage"), a)
        assert code == 541 and took < 5, (code, took)
        started = time.monotonic()
        refused = requests.put(f"http://127.0.0.1:{a.management_port}/api/queues/%2F/api-during-outage",
                               json={"durable": True}, auth=("guest", "guest"), timeout=REFUSAL_WITHIN_S)
        print(f"the management API answered {refused.status_code} {refused.text!r} "
              f"after {time.monotonic() - started:.1f} s")
        assert (refused.status_code, refused.json()) == (500, {
            "error": "internal_server_error", "reason": COMMIT_REFUSED.removeprefix("INTERNAL_ERROR - ")})

        coordination.start_again()
        outage_ended = time.monotonic()
        print(f"the coordination service answers again after an outage of {time.monotonic() - outage_started:.1f} s")

        # Things carry on: declarations work on every node again (each node notices the service
        # is back within its probe interval, 1 s) and reach the others ...
        for node in (a, b, c):
            asked_at = time.monotonic()
            wait_until(lambda node=node: _refusal(
                lambda channel: channel.queue_declare(f"probe-{node.name}"), node)[0] == 200,
                f"{node.name} accepts declarations again", within=15)
            print(f"{node.name} accepts declarations again {time.monotonic() - outage_ended:.1f} s after the "
                  f"service answered (waited {time.monotonic() - asked_at:.1f} s)")
        _declare_and_route_everywhere(nodes, "after-outage")
        for node in (a, b, c):
            assert node.live_nodes() == list(NAMES)
        # ... the refused ones were never made anywhere ...
        for node in (a, b, c):
            queues = {queue["name"] for queue in node.api("queues").json()}
            assert {"held-a", "held-b", "held-c"} <= queues
            assert {"probe-a", "probe-b", "probe-c"} <= queues
            assert not queues & {"new-during-outage", "again-during-outage", "api-during-outage"}
            assert "new-exchange" not in {exchange["name"] for exchange in node.api("exchanges").json()}
            assert "new.binding" not in {binding["routing_key"] for binding in node.api("bindings").json()}
        # ... and nothing confirmed is lost.
        for queue, bodies in confirmed.items():
            kept = drain(c, queue)
            print(f"{queue}: {len(bodies) - len(set(bodies) & set(kept))} of {len(bodies)} confirmed messages lost")
            assert sorted(kept) == sorted(bodies)


def _passive_declare_code(node: ClusterNode, queue: str) -> int:
    """200 if a passive declare of `queue` on `node` succeeds, else the channel.close code."""
    with pika.BlockingConnection(pika_parameters(node)) as connection:
        try:
            connection.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as refused:
            return refused.reply_code
    return 200


def test_one_node_cut_off_from_the_coordination_service(tmp_path, coordination: CoordinationService):
    """A network partition between node c and the coordination service only (clients and the
    other nodes still reach c): c's session expires, so the others see c gone and its queue down
    while c's own clients keep publishing to it with confirms and c refuses new declarations;
    once c reaches the service again it registers, takes its queue back and catches up, and no
    confirmed message is lost."""
    if coordination.scheme == "etcd":
        target = coordination.etcd_members[0].client_port
    else:
        target = coordination.zookeeper_port
    partition = TcpCut("127.0.0.1", target)
    try:
        with three_nodes(tmp_path, service=coordination, via={"c": partition.address}) as nodes:
            a, c = nodes["a"], nodes["c"]
            confirmed: list[bytes] = []
            with pika.BlockingConnection(pika_parameters(c)) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare("held-c", durable=True)
                for number in range(10):
                    channel.basic_publish("", "held-c", f"before {number}".encode(), PERSISTENT)
                    confirmed.append(f"before {number}".encode())
            queue_known_everywhere(nodes, "held-c")

            partition.cut()
            cut_at = time.monotonic()
            wait_until(lambda: a.live_nodes() == ["a", "b"], "a drops c once c's session expired")
            print(f"a dropped the cut-off node from membership after {time.monotonic() - cut_at:.1f} s")
            wait_until(lambda: _passive_declare_code(a, "held-c") == 404, "a answers 404 for c's queue")
            with pika.BlockingConnection(pika_parameters(a)) as connection:  # the others carry on
                connection.channel().queue_declare("declared-during-cut", durable=True)
            with pika.BlockingConnection(pika_parameters(c)) as connection:  # c's clients too
                channel = connection.channel()
                channel.confirm_delivery()
                for number in range(20):
                    channel.basic_publish("", "held-c", f"during {number}".encode(), PERSISTENT)
                    confirmed.append(f"during {number}".encode())
            code, text, took = _refusal(lambda channel: channel.queue_declare("new-on-c", durable=True), c)
            print(f"the cut-off node refused a declaration after {took:.1f} s: {code} {text}")
            assert (code, text) == (541, COMMIT_REFUSED) and took < REFUSAL_WITHIN_S

            partition.restore()
            restored_at = time.monotonic()
            wait_until(lambda: a.live_nodes() == list(NAMES), "c is back in a's membership", within=30)
            print(f"c registered again {time.monotonic() - restored_at:.1f} s after the partition healed")
            wait_until(lambda: _passive_declare_code(a, "held-c") == 200, "a reaches c's queue again")
            wait_until(lambda: "declared-during-cut" in {q["name"] for q in c.api("queues").json()},
                       "c caught up with what was declared meanwhile")
            wait_until(lambda: _refusal(lambda channel: channel.queue_declare("after-cut-on-c"), c)[0] == 200,
                       "c accepts declarations again")
            assert "new-on-c" not in {queue["name"] for queue in a.api("queues").json()}
            kept = drain(a, "held-c")
            lost = len([body for body in confirmed if body not in kept])
            print(f"confirmed messages lost on the cut-off node's queue: {lost} of {len(confirmed)}")
            assert lost == 0
    finally:
        partition.close()
