"""`amqp-server --workers 2`: two node processes behind one AMQP port, as one cluster on etcd.

Clients connecting to the one port land on both workers; a queue declared through a connection
on one worker is published to (with confirms) and consumed from connections on the other; the
parent restarts a worker killed with kill -9; SIGTERM to the parent stops every worker; the
persistent messages of both workers' queues survive a restart of the whole group; a parent
killed with kill -9 takes its workers with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pika
import requests

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess, free_port, launch
from interop_tests.coordination_services import start_etcd
from interop_tests.pika_helpers import connect
from interop_tests.waiting import wait_until

WORKERS = 2
# The default session TTL: the shorter one of the other cluster tests would let a worker starved
# of CPU on a loaded machine drop out of the membership now and then, which is not under test here
# (a killed worker comes back once its old key expired, within this TTL).
GROUP_CONFIG = TEST_CONFIG + "\n[cluster]\nsession_ttl = 5\n"
CONNECTIONS = 20  # all on one worker by chance: 2 * 2**-20
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _free_port_pair() -> int:
    """A free port whose next port is free too: worker 2's management API takes base + 1."""
    while True:
        base = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base


@dataclass
class WorkerGroup:
    broker: BrokerProcess  # the parent process, and the shared AMQP port
    management_port: int  # worker 1's; worker K's is this + K - 1

    def api(self, worker: int, path: str) -> requests.Response:
        return requests.get(f"http://127.0.0.1:{self.management_port + worker - 1}/api/{path}",
                            auth=("guest", "guest"), timeout=5)

    def node_name(self, worker: int) -> str:
        return self.api(worker, "overview").json()["node"]

    def worker_pid(self, worker: int) -> int:
        name = self.node_name(worker)
        return int(next(node["os_pid"] for node in self.api(worker, "nodes").json() if node["name"] == name))

    def wait_until_formed(self) -> None:
        """Every worker answers and lists every worker as a live node."""
        for worker in range(1, WORKERS + 1):
            wait_until(lambda worker=worker: len(self.api(worker, "nodes").json()) == WORKERS,
                       f"worker {worker} lists {WORKERS} nodes", within=30)

    def connection_names(self, worker: int) -> set[str]:
        return {c["user_provided_name"] for c in self.api(worker, "connections").json() if c["user_provided_name"]}


@contextmanager
def worker_group(tmp_path: Path, config: str = GROUP_CONFIG, extra_args: tuple[str, ...] = ()) -> Iterator[WorkerGroup]:
    service = start_etcd(tmp_path / "etcd")
    management_port = _free_port_pair()
    broker = None
    try:
        broker = launch(tmp_path / "group", config, extra_args=(
            "--workers", str(WORKERS), "--management-port", str(management_port),
            "--cluster", service.url(f"workers-{uuid.uuid4().hex[:6]}"), "--node-name", "w", *extra_args))
        group = WorkerGroup(broker, management_port)
        group.wait_until_formed()
        yield group
    finally:
        if broker is not None:
            broker.stop()
        service.stop()


def _gone(pid: int) -> bool:
    """The process exited (a zombie left for a pid 1 that does not reap counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def _spread_connections(group: WorkerGroup, prefix: str) -> tuple[dict[str, pika.BlockingConnection], list[set[str]]]:
    """CONNECTIONS connections to the shared port, and the names each worker lists."""
    connections = {f"{prefix}{i}": connect(group.broker, label=f"{prefix}{i}", connection_attempts=1) for i in range(CONNECTIONS)}
    by_worker: list[set[str]] = []

    def listed() -> bool:
        by_worker[:] = [{n for n in group.connection_names(w) if n.startswith(prefix)}
                        for w in range(1, WORKERS + 1)]
        return set().union(*by_worker) == set(connections)

    wait_until(listed, "every connection listed by the worker it landed on")
    assert sum(len(names) for names in by_worker) == CONNECTIONS  # each on exactly one worker
    return connections, by_worker


def test_two_workers_share_the_port_and_serve_each_others_queues(tmp_path):
    with worker_group(tmp_path) as group:
        assert group.node_name(1) == "w-1" and group.node_name(2) == "w-2"
        assert sorted(n["name"] for n in group.api(1, "nodes").json()) == ["w-1", "w-2"]
        connections, by_worker = _spread_connections(group, "spread-")
        assert all(by_worker), f"connections landed on one worker only: {by_worker}"
        # The address each worker's membership record gives (where the other nodes' links
        # connect) reaches that worker alone, not the shared port's lottery.
        for worker, other in ((1, 2), (2, 1)):
            record = next(node for node in group.api(other, "nodes").json() if node["name"] == f"w-{worker}")
            host, _, port = record["amqp_address"].rpartition(":")
            assert int(port) != group.broker.port
            direct = [pika.BlockingConnection(pika.ConnectionParameters(
                host, int(port), credentials=pika.PlainCredentials("guest", "guest"),
                client_properties={"connection_name": f"direct-{worker}-{i}"})) for i in range(8)]
            wait_until(lambda worker=worker: {f"direct-{worker}-{i}" for i in range(8)} <= group.connection_names(worker),
                       f"every connection to worker {worker}'s own address listed by it")
            for connection in direct:
                connection.close()
        on_1 = connections[sorted(by_worker[0])[0]]
        on_2 = connections[sorted(by_worker[1])[0]]

        # Declared through worker 1: worker 1 owns it, worker 2 forwards to it. Each connection
        # declares a queue first, which keeps it on its worker (a connection whose first act is to
        # use the other worker's queue moves there instead: test_cluster_workers_handover.py).
        on_1.channel().queue_declare("declared-on-1", durable=True)
        on_2.channel().queue_declare("declared-on-2")
        for worker in (1, 2):
            wait_until(lambda worker=worker: group.api(worker, "queues/%2F/declared-on-1").status_code == 200,
                       f"worker {worker} knows the queue")
        assert group.api(2, "queues/%2F/declared-on-1").json()["node"] == "w-1"
        publisher = on_2.channel()
        publisher.confirm_delivery()  # a nack would raise NackError
        for number in range(100):
            publisher.basic_publish("", "declared-on-1", f"m{number}".encode(), PERSISTENT, mandatory=True)
        consumer = on_2.channel()
        consumer.basic_qos(prefetch_count=10)
        received = []
        for method, _properties, body in consumer.consume("declared-on-1", inactivity_timeout=10):
            assert method is not None, f"only {len(received)} of 100 messages arrived"
            received.append(body.decode())
            consumer.basic_ack(method.delivery_tag)
            if len(received) == 100:
                break
        consumer.cancel()
        assert received == [f"m{number}" for number in range(100)]

        # And the other way round: declared through worker 2, used through worker 1.
        wait_until(lambda: group.api(1, "queues/%2F/declared-on-2").status_code == 200, "worker 1 knows it")
        channel = on_1.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "declared-on-2", b"to worker 2", mandatory=True)
        method, _properties, body = channel.basic_get("declared-on-2", auto_ack=True)
        assert (body, method.message_count) == (b"to worker 2", 0)
        assert group.api(1, "queues/%2F/declared-on-2").json()["node"] == "w-2"
        for connection in connections.values():
            connection.close()

        pids = [group.worker_pid(1), group.worker_pid(2)]
        assert group.broker.stop() == 0  # SIGTERM to the parent
        wait_until(lambda: all(_gone(pid) for pid in pids), "both workers gone after the parent's SIGTERM", 5)


def test_persistent_messages_survive_a_worker_and_a_group_restart(tmp_path):
    with worker_group(tmp_path) as group:
        connections, by_worker = _spread_connections(group, "keep-")
        for name, connection in connections.items():
            channel = connection.channel()
            channel.queue_declare(name, durable=True)  # owned by the worker the connection is on
            channel.confirm_delivery()
            for number in range(10):
                channel.basic_publish("", name, f"{name}/{number}".encode(), PERSISTENT)
            connection.close()
        owners = {queue["name"]: queue["node"] for queue in group.api(1, "queues/%2F").json()}
        assert {owners[name] for name in by_worker[0]} == {"w-1"}
        assert {owners[name] for name in by_worker[1]} == {"w-2"}

        # A worker killed with kill -9 is started again by the parent, under its name.
        old_pid = group.worker_pid(2)
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: group.worker_pid(2) != old_pid, "the parent started worker 2 again", within=30)
        group.wait_until_formed()
        assert group.node_name(2) == "w-2"

        # The whole group stopped and started again: every queue holds its 10 messages.
        assert group.broker.stop() == 0
        group.broker.start()
        group.wait_until_formed()
        reader = connect(group.broker, label="reader", connection_attempts=1)
        channel = reader.channel()
        for name in connections:
            # Each worker sees its sibling's queues come back when its watch delivers their owner's key.
            for worker in range(1, WORKERS + 1):
                wait_until(lambda name=name, worker=worker:
                           group.api(worker, f"queues/%2F/{name}").json().get("state") == "running",
                           f"{name} running on worker {worker} after the restart")
            bodies = []
            while True:
                method, _properties, body = channel.basic_get(name, auto_ack=True)
                if method is None:
                    break
                bodies.append(body.decode())
            assert bodies == [f"{name}/{number}" for number in range(10)], name
        reader.close()

        # The parent killed with kill -9: its workers notice and stop on their own.
        pids = [group.worker_pid(1), group.worker_pid(2)]
        group.broker.kill()
        wait_until(lambda: all(_gone(pid) for pid in pids), "workers gone after the parent's kill -9", 15)


def test_workers_without_a_cluster_are_refused(tmp_path):
    result = subprocess.run([sys.executable, "-m", "amqp_server", "--workers", "2", "--port", "0",
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "workers = 2 needs a cluster: give --cluster" in result.stderr
