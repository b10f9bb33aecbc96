"""The asyncio shell (`QueueReplica`) of three replicas in one event loop, over real TCP
streams and real files, with the in-memory coordination service (tests/memory_coordinator.py);
a crash ends a node's session without releasing anything, as a lease expiry after kill -9 does."""

from __future__ import annotations

import asyncio


from cluster.replication.log import FileReplicaLog
from cluster.replication.replica import QueueReplica, ReplicationListener, Role
from interop_tests.waiting import wait_until_async
from persistence.group_commit import GroupCommitter
from tests.memory_coordinator import MemoryCoordinator, MemoryService

MEMBERS = ("a", "b", "c")
SECRET = b"the test cluster's secret"


TRACE: list[tuple[str, str, int]] = []  # ("fsynced", node, index) and ("commit", node, index), in order


class TracedLog(FileReplicaLog):
    """Records each completed fsync round: the index it made durable on this node."""

    def __init__(self, directory, node):
        super().__init__(directory)
        self.node = node

    def sync_done(self, job, error):
        super().sync_done(job, error)
        TRACE.append(("fsynced", self.node, self.durable_index))


class Node:
    def __init__(self, name, store, directory, secret=SECRET, handshake_timeout=5.0):
        self.name = name
        self.session = MemoryCoordinator(store)
        self.listener = ReplicationListener(secret, handshake_timeout)
        self.committer = GroupCommitter("always")
        self.directory = directory
        self.commits: list[int] = []
        self.roles: list[Role] = []
        self.replica: QueueReplica | None = None

    async def start(self):
        await self.listener.start("127.0.0.1", 0)
        self.replica = QueueReplica(
            queue="/:q", node=self.name, members=MEMBERS, log=TracedLog(self.directory, self.name),
            coordinator=self.session, listener=self.listener, committer=self.committer,
            on_commit=self.on_commit, on_role=self.roles.append, poll_interval=0.02, election_timeout=1.0)
        self.replica.start()

    def on_commit(self, index):
        TRACE.append(("commit", self.name, index))
        self.commits.append(index)

    async def crash(self):
        """As kill -9: streams drop, the session's ephemeral keys vanish, nothing is released."""
        self.replica._task.cancel()
        await self.listener.close()
        self.replica._become(Role.STOPPED)
        await self.session.close()  # its ephemeral keys go, as when a lease expires
        self.replica.log.close()


def leader_of(nodes):
    leaders = [n for n in nodes.values() if n.replica.role is Role.LEADER]
    return leaders[0] if len(leaders) == 1 else None


async def start_group(tmp_path):
    """Three replicas with a leader that has every member in sync."""
    store = MemoryService()
    nodes = {n: Node(n, store, tmp_path / n) for n in MEMBERS}
    for node in nodes.values():
        await node.start()
    await wait_until_async(lambda: leader_of(nodes) is not None, "one leader")
    leader = leader_of(nodes)
    await wait_until_async(lambda: leader.replica.leader.in_sync_members() == list(MEMBERS),
                           "every member in sync with the leader")
    return store, nodes, leader


def test_confirmed_entries_survive_the_leaders_crash_and_the_old_leader_rejoins(tmp_path):
    async def scenario():
        store, nodes, first = await start_group(tmp_path)
        indexes = [first.replica.publish(b"m%d" % k) for k in range(100)]
        await wait_until_async(lambda: first.commits and first.commits[-1] >= indexes[-1],
                               "the 100 entries committed")
        first_term = first.replica.leader.term
        await first.crash()
        survivors = {n: v for n, v in nodes.items() if v is not first}
        await wait_until_async(lambda: leader_of(survivors) is not None, "one leader among the survivors")
        second = leader_of(survivors)
        payloads = [bytes(p) for _, _, p in second.replica.log.entries()]
        assert [p for p in payloads if p] == [b"m%d" % k for k in range(100)]
        assert second.replica.leader.term > first_term
        more = second.replica.publish(b"after")
        await wait_until_async(lambda: second.commits and second.commits[-1] >= more,
                               "the new leader commits its entry")
        # The old leader comes back on its directory and catches up as a follower.
        again = Node(first.name, store, first.directory)
        nodes[first.name] = again
        await again.start()
        await wait_until_async(lambda: again.replica.log.durable_index >= more, "the old leader caught up on its log")
        assert [bytes(p) for _, _, p in again.replica.log.entries() if bytes(p)][-1] == b"after"
        await wait_until_async(lambda: set(second.replica.record.in_sync) == set(MEMBERS),
                               "the old leader back in sync", 5)
        for node in nodes.values():
            if node is not first:
                await node.replica.stop()
    asyncio.run(scenario())


def test_no_commit_without_a_majority(tmp_path):
    async def scenario():
        _, nodes, leader = await start_group(tmp_path)
        for node in nodes.values():
            if node is not leader:
                await node.crash()
        index = leader.replica.publish(b"alone")
        await asyncio.sleep(0.5)
        await leader.committer.idle()
        assert leader.replica.log.durable_index >= index  # fsynced locally...
        assert not leader.commits or leader.commits[-1] < index  # ...but one of three is no majority
        await leader.replica.stop()
    asyncio.run(scenario())


def test_trace_every_commit_follows_a_majority_of_fsyncs_of_that_entry(tmp_path):
    """The equivalent of bench/strace_confirm_order.py for replication: each commit (when
    confirms leave) comes after fsync rounds covering its index have completed on two of the
    three nodes."""
    async def scenario():
        TRACE.clear()
        _, nodes, leader = await start_group(tmp_path)
        last = 0
        for batch in range(10):  # each batch waits for its commit: at least 10 commits to check
            for k in range(1 + batch % 7):
                last = leader.replica.publish(b"%d.%d" % (batch, k))
            await wait_until_async(lambda: leader.commits and leader.commits[-1] >= last,
                                   "the leader committed the batch")
        durable: dict[str, int] = {}
        checked = 0
        for event, node, index in TRACE:
            if event == "fsynced":
                durable[node] = max(durable.get(node, 0), index)
            else:
                assert sum(1 for d in durable.values() if d >= index) >= 2, (index, durable)
                checked += 1
        assert checked >= 10
        for node in nodes.values():
            await node.replica.stop()
    asyncio.run(scenario())
