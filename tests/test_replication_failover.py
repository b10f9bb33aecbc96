"""Replicated queue under kill -9: three harness nodes (tests/replication_node.py, the real
replication core) on a real etcd (and, with fewer kills, ZooKeeper); publishers with confirms and a consumer acking run while the
test kills the leader, then a follower, then the leader again, restarting each one. It prints
the seed and "confirmed lost: N".

The same run against the harness's deliberately broken build (``--confirm-before-replication``,
confirms before any fsync or follower has the record) must report lost messages: that shows the
check can see a loss.

REPLICATION_SEED=<n> repeats a run; REPLICATION_LEADER_KILLS sets how many leader kills (10).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from interop_tests.broker_process import free_port
from interop_tests.coordination_services import start_etcd, start_zookeeper
from tests.replication_node import secret_environment

# 15-35 s each: three harness nodes under a workload while the test kills and restarts them.
pytestmark = pytest.mark.slow

NODES = ("n1", "n2", "n3")
IN_FLIGHT = 32
PUBLISHERS = 2
CONSUMER_WINDOW = 32
BACKLOG = 2000  # publishers wait while this many confirmed messages are not acked yet
PUBLISH_RATE = 250  # messages per second per publisher
ELECTION_DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def etcd():
    directory = Path(tempfile.mkdtemp(prefix="repl-etcd-"))
    service = start_etcd(directory)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def zookeeper():
    directory = Path(tempfile.mkdtemp(prefix="repl-zookeeper-"))
    service = start_zookeeper(directory)
    yield service
    service.stop()


class Cluster:
    def __init__(self, service, directory: Path, broken: bool) -> None:
        self.url = service.url(f"repl-{uuid.uuid4().hex[:8]}")
        self.directory = directory
        self.broken = broken
        self.ports = {n: free_port() for n in NODES}
        self.processes: dict[str, subprocess.Popen] = {}
        self.environment = secret_environment()  # the nodes' shared cluster secret

    def start(self, node: str) -> None:
        command = [sys.executable, "-m", "tests.replication_node", "--cluster", self.url, "--node", node,
                   "--members", ",".join(NODES), "--data-dir", str(self.directory / node),
                   "--client-port", str(self.ports[node])]
        if self.broken:
            command.append("--confirm-before-replication")
        log = open(self.directory / f"{node}.log", "ab")
        self.processes[node] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment)

    def kill9(self, node: str) -> None:
        process = self.processes.pop(node)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def ask(port: int, line: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(line)
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


async def find_leader(cluster: Cluster, want_in_sync: int = 1, exclude: str = "") -> tuple[str, list[str]]:
    deadline = time.monotonic() + ELECTION_DEADLINE_S
    answer: list[bytes] = []
    leader_answer: list[bytes] = []
    while time.monotonic() < deadline:
        # A copy: the fault injector kills and restarts nodes while this awaits their answers.
        for node in list(cluster.processes):
            if node == exclude:
                continue
            try:
                answer = (await ask(cluster.ports[node], b"R\n")).split()
            except (OSError, asyncio.TimeoutError):
                continue
            if answer[1:2] == [b"leader"]:
                leader_answer = answer
                in_sync = answer[3].decode().split(",")
                if len(in_sync) >= want_in_sync:
                    return node, in_sync
        await asyncio.sleep(0.1)
    for process in list(cluster.processes.values()):
        process.send_signal(signal.SIGUSR1)  # each node writes its stacks to its log
    await asyncio.sleep(0.5)
    raise AssertionError(f"no leader with {want_in_sync} in sync within {ELECTION_DEADLINE_S} s; "
                         f"last leader's answer {leader_answer}")


async def leader_connection(cluster: Cluster):
    node, _ = await find_leader(cluster)
    return await asyncio.open_connection("127.0.0.1", cluster.ports[node])


@dataclass
class Ledger:
    confirmed: set[bytes] = field(default_factory=set)
    acks_sent: set[bytes] = field(default_factory=set)
    ack_committed: set[bytes] = field(default_factory=set)
    first_deliveries: list[bytes] = field(default_factory=list)  # ids, redelivered=false, in order
    deliveries: dict[bytes, list[tuple[int, int]]] = field(default_factory=dict)  # id -> (redelivered, count)
    violations: list[str] = field(default_factory=list)


async def publisher(cluster: Cluster, pid: int, ledger: Ledger, stop: asyncio.Event) -> None:
    """Publishes at a steady PUBLISH_RATE with up to IN_FLIGHT confirms outstanding, so there
    is always something in flight when a kill lands (and the queue stays short)."""
    n = 0
    loop = asyncio.get_running_loop()
    due = loop.time()
    while not stop.is_set():
        try:
            reader, writer = await leader_connection(cluster)
        except AssertionError:
            continue
        in_flight = 0
        try:
            while not stop.is_set():
                while len(ledger.confirmed) - len(ledger.acks_sent) > BACKLOG and not stop.is_set():
                    await asyncio.sleep(0.01)
                while in_flight < IN_FLIGHT and loop.time() >= due:
                    due += 1 / PUBLISH_RATE
                    n += 1
                    writer.write(b"P p%d-%08d\n" % (pid, n))
                    in_flight += 1
                if in_flight == 0:
                    due = max(due, loop.time() - 0.1)  # after a pause, no catch-up burst
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    continue
                try:
                    line = await asyncio.wait_for(reader.readline(), max(0.001, due - loop.time())
                                                  if in_flight < IN_FLIGHT else 10)
                except asyncio.TimeoutError:
                    if in_flight >= IN_FLIGHT:
                        raise
                    continue  # time to send more
                if not line or line == b"N\n":
                    break
                ledger.confirmed.add(line.split()[1])
                in_flight -= 1
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()


async def consumer(cluster: Cluster, ledger: Ledger, rng: random.Random, stop: asyncio.Event,
                   drain: bool = False) -> None:
    """Gets (32 at a time) and acks without waiting; holds a few deliveries unacked for a while
    (a leader kill brings them back). When ``stop`` is set it acks what it holds and returns
    once every ack is answered. With ``drain``, it acks everything and returns once the queue
    is empty."""
    window = 1 if drain else CONSUMER_WINDOW
    while True:
        try:
            reader, writer = await leader_connection(cluster)
        except AssertionError:
            continue
        gets = 0
        held: list[tuple[int, bytes]] = []
        acks: dict[int, bytes] = {}  # seq -> id, sent and not answered

        def send_ack(seq: int, mid: bytes) -> None:
            ledger.acks_sent.add(mid)
            acks[seq] = mid
            writer.write(b"A %d\n" % seq)

        try:
            while True:
                stopping = stop.is_set()
                if stopping:
                    for seq, mid in held:
                        send_ack(seq, mid)
                    held = []
                    if gets == 0 and not acks:
                        return
                while not stopping and gets < window:
                    writer.write(b"G\n")
                    gets += 1
                line = await asyncio.wait_for(reader.readline(), 10)
                if not line or line == b"N\n":
                    break
                kind, *fields = line.split()
                if kind == b"K":
                    mid = acks.pop(int(fields[0]), None)
                    if mid is not None:
                        ledger.ack_committed.add(mid)
                    continue
                gets -= 1
                if kind == b"E":
                    if drain and gets == 0 and not acks:
                        return
                    for seq, mid in held:  # nothing ready: let go of what we held
                        send_ack(seq, mid)
                    held = []
                    await asyncio.sleep(0.005)
                    continue
                seq, mid, redelivered, count = int(fields[0]), fields[1], int(fields[2]), int(fields[3])
                check_delivery(ledger, mid, redelivered, count)
                if not drain and not stopping and rng.random() < 0.05 and len(held) < 20:
                    held.append((seq, mid))
                else:
                    send_ack(seq, mid)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()
        if stop.is_set() and not drain:
            return  # what it held or acked without an answer comes back to the drain


def check_delivery(ledger: Ledger, mid: bytes, redelivered: int, count: int) -> None:
    earlier = ledger.deliveries.setdefault(mid, [])
    if mid in ledger.ack_committed:
        ledger.violations.append(f"{mid!r} delivered again after its ack was committed")
    if earlier:
        if not redelivered or count <= earlier[-1][1]:
            ledger.violations.append(f"{mid!r} delivered again with redelivered={redelivered}, "
                                     f"x-delivery-count {count} after {earlier[-1][1]}")
    elif not redelivered:
        ledger.first_deliveries.append(mid)
    earlier.append((redelivered, count))


async def fault_run(cluster: Cluster, seed: int, leader_kills: int) -> Ledger:
    rng = random.Random(seed)
    ledger = Ledger()
    for node in NODES:
        cluster.start(node)
    await find_leader(cluster, want_in_sync=3)
    stop = asyncio.Event()
    workers = [asyncio.create_task(publisher(cluster, p, ledger, stop)) for p in range(PUBLISHERS)]
    workers.append(asyncio.create_task(consumer(cluster, ledger, rng, stop)))
    kills = 0
    plan = ["leader", "follower", "leader"]
    step = 0
    while kills < leader_kills:
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        leader, in_sync = await find_leader(cluster, want_in_sync=2)
        kind = plan[step % len(plan)]
        step += 1
        if kind == "leader":
            victim = leader
            kills += 1
        else:
            victim = rng.choice([n for n in NODES if n != leader])
        print(f"kill -9 {kind} {victim} (in sync: {','.join(in_sync)})", flush=True)
        cluster.kill9(victim)
        if kind == "leader":
            await find_leader(cluster, exclude=victim)
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        cluster.start(victim)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*workers)
    await find_leader(cluster, want_in_sync=2)
    await asyncio.wait_for(consumer(cluster, ledger, rng, asyncio.Event(), drain=True), 60)
    return ledger


def lost_messages(ledger: Ledger) -> set[bytes]:
    """Confirmed messages neither acked by the consumer nor still delivered at the end."""
    return ledger.confirmed - ledger.acks_sent


def order_violations(ledger: Ledger) -> list[str]:
    last: dict[bytes, bytes] = {}
    problems = []
    for mid in ledger.first_deliveries:
        publisher_id = mid.split(b"-")[0]
        if publisher_id in last and mid < last[publisher_id]:
            problems.append(f"{mid!r} first delivered after {last[publisher_id]!r}")
        last[publisher_id] = mid
    return problems


def _run(service, broken: bool, leader_kills: int) -> tuple[int, Ledger]:
    seed = int(os.environ.get("REPLICATION_SEED", random.randrange(1 << 30)))
    print(f"REPLICATION_SEED={seed}", flush=True)
    directory = Path(tempfile.mkdtemp(prefix="repl-fault-"))
    cluster = Cluster(service, directory, broken)
    try:
        ledger = asyncio.run(fault_run(cluster, seed, leader_kills))
    finally:
        cluster.stop()
    lost = lost_messages(ledger)
    print(f"confirmed: {len(ledger.confirmed)}, acked: {len(ledger.acks_sent)}, "
          f"redeliveries: {sum(len(d) - 1 for d in ledger.deliveries.values())}, "
          f"confirmed lost: {len(lost)}", flush=True)
    return len(lost), ledger


@pytest.mark.timeout(300)
def test_no_confirmed_message_is_lost_over_leader_kills(etcd):
    lost, ledger = _run(etcd, broken=False, leader_kills=int(os.environ.get("REPLICATION_LEADER_KILLS", 10)))
    assert lost == 0
    assert ledger.violations == []
    assert order_violations(ledger) == []
    assert len(ledger.confirmed) > 1000  # the run did real work between the kills


@pytest.mark.timeout(300)
def test_the_broken_build_that_confirms_before_replication_loses_messages(etcd):
    lost, _ = _run(etcd, broken=True, leader_kills=int(os.environ.get("REPLICATION_BROKEN_LEADER_KILLS", 5)))
    assert lost > 0


@pytest.mark.timeout(300)
def test_no_confirmed_message_is_lost_with_zookeeper_as_the_coordination_service(zookeeper):
    lost, ledger = _run(zookeeper, broken=False,
                        leader_kills=int(os.environ.get("REPLICATION_ZOOKEEPER_LEADER_KILLS", 5)))
    assert lost == 0
    assert ledger.violations == []
    assert order_violations(ledger) == []
