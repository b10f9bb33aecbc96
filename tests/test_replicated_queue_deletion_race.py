"""A replicated queue deleted at the instant its new leader takes it (docs/replication.md), with
the shared definitions of two brokers on each coordination backend: the in-memory one (etcd's
semantics) and a real etcd and ZooKeeper. The brokers' replicas are stand-ins whose leadership
the test sets, and the deletion is committed by the test at the chosen instant, through a
coordinator that runs it just before the new leader's read or its compare-and-set:

- the new leader names itself the queue's home only over the definition it read: a deletion
  committed meanwhile stands (the definition does not come back without its group), and the
  would-be leader drops the queue, and so its replica and group, instead;
- a queue deleted while no replica led (no node held the queue to delete its group with it):
  the replica that leads next removes the group.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from cluster.definitions.keys import entry_key
from cluster.definitions.shared import SharedDefinitions
from amqp_server.config.settings import ClusterConfig, ServerConfig
from cluster.replication.replicated_journal import ReplicatedJournal
from cluster import connect, parse_cluster_address
from cluster.coordinator import Coordinator, KeyValue, WatchEvent
from cluster.replication.log import FileReplicaLog
from cluster.replication.queue_log import QueueReplicaLog
from cluster.replication.replica import Role
from persistence.queue_store import QueueStore
from interop_tests.coordination_services import start_etcd, start_zookeeper
from interop_tests.waiting import wait_until_async
from tests.frame_driver import methods, opened_client
from tests.memory_coordinator import MemoryCoordinator, MemoryService

QUEUE_KEY = entry_key("queues", {"vhost": "/", "name": "q"})
QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module", params=["memory", "etcd", "zookeeper"])
def backend(request):
    """Makes a new cluster on the backend: a function opening one node's coordinator (its own
    session) on it."""
    if request.param == "memory":
        def new_memory_cluster() -> Callable[[], Awaitable[Coordinator]]:
            service = MemoryService()

            async def open_memory() -> Coordinator:
                return MemoryCoordinator(service)

            return open_memory

        yield new_memory_cluster
        return
    directory = Path(tempfile.mkdtemp(prefix=f"race-{request.param}-"))
    running = start_etcd(directory) if request.param == "etcd" else start_zookeeper(directory)

    def new_real_cluster() -> Callable[[], Awaitable[Coordinator]]:
        url = running.url(f"race-{uuid.uuid4().hex[:8]}")

        async def open_real() -> Coordinator:
            return await connect(parse_cluster_address(url), session_ttl=5.0)

        return open_real

    yield new_real_cluster
    running.stop()


# When the other node's deletion lands: before the node's first request about the key (so
# before it reads it), or before its first write of the key (after any read).
BEFORE = {"read": frozenset({"get", "put", "compare_and_set"}), "write": frozenset({"put", "compare_and_set"})}


class _Interposed(Coordinator):
    """A node's coordinator that runs `action` once, just before its first request of one of
    `methods` about `key` (`armed`): another node's change landing at that instant."""

    def __init__(self, inner: Coordinator) -> None:
        self.inner = inner
        self.armed: tuple[frozenset[str], str, Callable[[], Awaitable[Any]]] | None = None

    async def _maybe(self, method: str, key: str) -> None:
        if self.armed is not None and method in self.armed[0] and key == self.armed[1]:
            action, self.armed = self.armed[2], None
            await action()

    async def get(self, key: str) -> KeyValue | None:
        await self._maybe("get", key)
        return await self.inner.get(key)

    async def put(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        await self._maybe("put", key)
        return await self.inner.put(key, value, ephemeral=ephemeral)

    async def compare_and_set(self, key: str, value: bytes, expected_version: int | None, *,
                              ephemeral: bool = False) -> int:
        await self._maybe("compare_and_set", key)
        return await self.inner.compare_and_set(key, value, expected_version, ephemeral=ephemeral)

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        return await self.inner.delete(key, expected_version)

    async def list(self, directory: str) -> tuple[list[KeyValue], int]:
        return await self.inner.list(directory)

    def watch(self, directory: str, after_revision: int,
              known_keys: Collection[str] | None = None) -> AsyncIterator[WatchEvent]:
        return self.inner.watch(directory, after_revision, known_keys)

    async def close(self) -> None:
        await self.inner.close()


class _Replica:
    """What a ReplicatedJournal uses of its replica: a role, a log, `publish`."""

    def __init__(self, directory: Path) -> None:
        self.queue = '["/","q"]'
        self.role = Role.LEADER
        self.log = QueueReplicaLog(directory)

    def publish(self, payload: bytes) -> int:
        return self.log.append(1, payload)


class _Replicated:
    """A node's ReplicatedQueues as the shared definitions see it: which queues its replicas
    lead (set by the test), their journals, and which groups it removed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.leading: set[tuple[str, str]] = set()
        self.deleted_queues: list[str] = []  # journals deleted: the queue and its group went
        self.dropped_groups: list[str] = []

    def leads(self, vhost: str, name: str) -> bool:
        return (vhost, name) in self.leading

    def journal_for(self, vhost: str, name: str, open_store: Callable[[], QueueStore],
                    arguments: dict[str, Any]) -> ReplicatedJournal:
        return ReplicatedJournal(open_store(), None, _Replica(self.directory / f"log-{name}"),  # type: ignore[arg-type]
                                 open_store, lambda journal: None,
                                 lambda journal: self.deleted_queues.append(name))

    async def drop_group(self, vhost: str, name: str) -> None:
        self.dropped_groups.append(name)


async def _node(directory: Path, name: str, coordinator: Coordinator) -> tuple[Broker, SharedDefinitions, _Replicated]:
    directory.mkdir(parents=True, exist_ok=True)
    config = ServerConfig(cluster=ClusterConfig(url="etcd://127.0.0.1:2379/unit", node_name=name))
    broker = Broker(config, message_dir=directory)
    replicated = _Replicated(directory)
    broker.replicate_queues(replicated)  # type: ignore[arg-type]
    shared = SharedDefinitions(coordinator, broker, name, lambda: ["a", "b"])
    shared.replicate_with(replicated)  # type: ignore[arg-type]
    broker.share_definitions(shared)
    await shared.start()
    return broker, shared, replicated


def _run(backend, tmp_path: Path, scenario) -> None:
    open_coordinator = backend()

    async def main() -> None:
        inner_b = await open_coordinator()
        b_coordinator = _Interposed(inner_b)
        a_coordinator = await open_coordinator()
        deleter = await open_coordinator()  # "another node" that deletes the queue
        a = await _node(tmp_path / "a", "a", a_coordinator)
        b = await _node(tmp_path / "b", "b", b_coordinator)
        try:
            await scenario(a, b, b_coordinator, deleter)
        finally:
            await a[1].stop()
            await b[1].stop()
            for coordinator in (a_coordinator, inner_b, deleter):
                await coordinator.close()

    asyncio.run(main())


async def _declared_on_a(a, b) -> None:
    broker_a, shared_a, replicated_a = a
    broker_b, shared_b, _ = b
    replicated_a.leading.add(("/", "q"))
    client = opened_client(broker_a)
    client.send(1, commands.Queue.Declare(queue="q", durable=True, arguments=QUORUM))
    await shared_a.committed()
    replies: list[Any] = []
    await wait_until_async(lambda: replies.extend(methods(client.take())) or
                           [type(method).__name__ for method in replies] == ["DeclareOk"], "declare-ok")
    await wait_until_async(lambda: "q" in broker_b.vhosts["/"].queues, "b holds a stand-in of q")
    assert broker_b.vhosts["/"].queues["q"].journal is None  # a stand-in, no replica of its own


@pytest.mark.parametrize("when", sorted(BEFORE))
def test_a_deletion_committed_as_the_new_leader_takes_the_queue_stands(backend, tmp_path, when):
    """b's replica becomes leader; a `queue.delete` commits on another node just before b
    reads the definition, or between that read and its write: the definition stays
    deleted (before the change b's plain write brought it back, home b, without its group),
    b drops the queue it took and its replica's group (its journal deleted, not handed over).
    ("write": after b's read, before its compare-and-set.)"""
    async def scenario(a, b, b_coordinator, deleter) -> None:
        broker_b, shared_b, replicated_b = b
        await _declared_on_a(a, b)
        b_coordinator.armed = (BEFORE[when], QUEUE_KEY, lambda: deleter.delete(QUEUE_KEY))
        replicated_b.leading.add(("/", "q"))
        shared_b.reconcile_replicated("/", "q")  # what its replica's becoming leader does
        assert isinstance(broker_b.vhosts["/"].queues["q"].journal, ReplicatedJournal)  # b took the queue itself
        await shared_b.committed()
        assert b_coordinator.armed is None, "the deletion ran"
        await wait_until_async(lambda: "q" not in broker_b.vhosts["/"].queues, "b drops the queue")
        assert replicated_b.deleted_queues == ["q"]
        assert await deleter.get(QUEUE_KEY) is None, "the deletion was undone"
        await asyncio.sleep(0.2)  # nothing brings it back
        assert await deleter.get(QUEUE_KEY) is None

    _run(backend, tmp_path, scenario)


def test_a_queue_deleted_while_no_replica_led_has_its_group_removed_by_the_next_leader(backend, tmp_path):
    """The queue is deleted while b holds a stand-in (its leader a gone, no replica leading);
    when b's replica then becomes leader, it removes the orphaned group (before the change the
    group stayed, led by nobody's queue, and a queue declared again under the name joined it)."""
    async def scenario(a, b, b_coordinator, deleter) -> None:
        broker_b, shared_b, replicated_b = b
        await _declared_on_a(a, b)
        a[2].leading.clear()  # a's replica no longer leads (its node died)
        assert await deleter.delete(QUEUE_KEY)
        await wait_until_async(lambda: "q" not in broker_b.vhosts["/"].queues, "b removes its stand-in")
        replicated_b.leading.add(("/", "q"))
        shared_b.reconcile_replicated("/", "q")
        await wait_until_async(lambda: replicated_b.dropped_groups == ["q"], "b's replica drops the group")

    _run(backend, tmp_path, scenario)
