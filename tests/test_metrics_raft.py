"""The rabbitmq_raft_* families for a clustered broker's replicated queues: one series per queue
replica on the per-object endpoint (term, commit index, last written index, the index its state
has folded, its snapshot's base), their sums on the aggregated one; none on a broker without
replication."""

from __future__ import annotations

import asyncio
from pathlib import Path

from amqp_server.broker.broker import Broker
from cluster.replication.log import ReplicaStore
from cluster.replication.queue_log import QueueReplicaLog, message_payload, state_payload
from cluster.replication.replicated_queues import ReplicatedQueues, queue_id
from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
from cluster.replication.replica import QueueReplica, Role
from interop_tests.waiting import wait_until_async
from persistence.group_commit import GroupCommitter
from persistence.record_format import MessageState
from tests.memory_coordinator import MemoryCoordinator, MemoryService
from tests.test_metrics_values import FIXED_PROCESS, scrape, value

RAFT = ("rabbitmq_raft_term_total", "rabbitmq_raft_log_commit_index", "rabbitmq_raft_log_last_written_index",
        "rabbitmq_raft_log_last_applied_index", "rabbitmq_raft_log_snapshot_index")


class TunedLogs(ReplicatedQueues):
    """Queue logs with small segments (a compaction every few dozen 1 KiB messages) and a small
    fold batch (the applied index visibly trails a large commit for a loop turn)."""

    def _open_log(self, replica_id: str, directory: Path) -> ReplicaStore:
        return QueueReplicaLog(directory, segment_bytes=16 * 1024, apply_batch=4)


def publish(seq: int, body: bytes = b"m") -> bytes:
    return message_payload(seq, 1000 + seq, "", "q", b"\x10\x00\x02", body)


async def single_node(tmp_path: Path, cls: type[ReplicatedQueues] = ReplicatedQueues) -> tuple[Broker,
                                                                                                ReplicatedQueues]:
    broker = Broker()
    replicated = cls(node="a", coordinator=MemoryCoordinator(MemoryService()), data_dir=tmp_path,
                     committer=GroupCommitter("always"), live_nodes=lambda: ["a"], secret="s3cret")
    await replicated.start("127.0.0.1")
    broker.replicate_queues(replicated)
    return broker, replicated


async def leader(replicated: ReplicatedQueues, name: str, on_commit=lambda index: None) -> QueueReplica:
    replica = replicated.manager.host(queue_id("/", name), ["a"], on_commit, lambda role: None)
    await wait_until_async(lambda: replica.role is Role.LEADER, f"{name}'s replica leads", within=10)
    return replica


def figures(samples, queue: str) -> dict[str, float]:
    return {name: value(samples, name, vhost="/", queue=queue) for name in RAFT}


def test_a_broker_without_replication_serves_no_raft_family():
    samples = scrape(CoreCollector(Broker(), PER_OBJECT, lambda: FIXED_PROCESS))
    assert not [name for name, _labels in samples if name.startswith("rabbitmq_raft_")]


def test_each_replica_is_a_series_per_queue_and_the_aggregated_endpoint_sums_them(tmp_path):
    async def scenario() -> None:
        broker, replicated = await single_node(tmp_path)
        for name, records in (("orders", 3), ("audit", 1)):
            replica = await leader(replicated, name)
            for seq in range(1, records + 1):
                last = replica.publish(publish(seq))
            log = replica.log
            assert isinstance(log, QueueReplicaLog)
            await wait_until_async(lambda: log.applied_index >= last, f"{name}'s log folds its records")
        per_object = scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS))
        # term 1; the term's no-op is entry 1, then the records, all folded; nothing compacted
        assert figures(per_object, "orders") == {
            "rabbitmq_raft_term_total": 1, "rabbitmq_raft_log_commit_index": 4,
            "rabbitmq_raft_log_last_written_index": 4, "rabbitmq_raft_log_last_applied_index": 4,
            "rabbitmq_raft_log_snapshot_index": 0}
        assert value(per_object, "rabbitmq_raft_log_last_applied_index", vhost="/", queue="audit") == 2
        aggregated = scrape(CoreCollector(broker, AGGREGATED, lambda: FIXED_PROCESS))
        assert value(aggregated, "rabbitmq_raft_log_commit_index") == 6
        assert value(aggregated, "rabbitmq_raft_log_last_applied_index") == 6
        assert value(aggregated, "rabbitmq_raft_term_total") == 2
        assert all((name, frozenset()) in aggregated for name in RAFT)
        await replicated.close()

    asyncio.run(scenario())


def test_the_last_applied_index_is_what_the_log_has_folded_not_the_commit_index(tmp_path):
    """A commit of 20 entries at once: when the replica reports it, its log has folded one batch
    (4) of them; the rest fold over the next loop turns. The metric says so, then catches up."""
    async def scenario() -> None:
        broker, replicated = await single_node(tmp_path, TunedLogs)
        seen: list[dict[str, float]] = []
        commits: list[int] = []

        def on_commit(index: int) -> None:  # runs as the commit moves, before a loop turn folds more
            commits.append(index)
            seen.append(figures(scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS)), "orders"))

        replica = await leader(replicated, "orders", on_commit)
        await wait_until_async(lambda: commits and commits[-1] >= 1, "the term's no-op commits")
        seen.clear()
        last = 0
        for seq in range(1, 21):
            last = replica.publish(publish(seq))
        await wait_until_async(lambda: commits[-1] >= last, "the records commit")
        at_commit = seen[-1]
        assert at_commit["rabbitmq_raft_log_commit_index"] == last == 21
        assert at_commit["rabbitmq_raft_log_last_applied_index"] < last
        log = replica.log
        assert isinstance(log, QueueReplicaLog)
        await wait_until_async(lambda: log.applied_index == last, "the log folds the rest")
        later = figures(scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS)), "orders")
        assert later["rabbitmq_raft_log_last_applied_index"] == later["rabbitmq_raft_log_commit_index"] == last
        await replicated.close()

    asyncio.run(scenario())


def test_the_snapshot_index_is_the_base_of_the_compacted_log(tmp_path):
    """Messages published and acked until the log compacts: the snapshot index is the entry the
    snapshot stands for (the log stores nothing at or below it), so last written minus snapshot
    index is the entries the log holds, as RabbitMQ's Raft dashboard reads it."""
    async def scenario() -> None:
        broker, replicated = await single_node(tmp_path, TunedLogs)
        replica = await leader(replicated, "orders")
        log = replica.log
        assert isinstance(log, QueueReplicaLog)
        seq = 0
        while log.snapshot_index == 0:
            assert seq < 500, "the log never compacted"
            seq += 1
            replica.publish(publish(seq, b"x" * 1024))
            last = replica.publish(state_payload(seq, MessageState.ACKED, 0))
            await wait_until_async(lambda: log.applied_index >= last, "the log folds the ack")
        last = replica.publish(publish(seq + 1))  # one entry past the snapshot, unsettled
        await wait_until_async(lambda: log.applied_index >= last, "the log folds the last publish")
        held = sum(1 for _ in log.entries(log.first_index))
        per_object = figures(scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS)), "orders")
        snapshot = per_object["rabbitmq_raft_log_snapshot_index"]
        assert 0 < snapshot == log.snapshot_index <= per_object["rabbitmq_raft_log_last_applied_index"]
        assert per_object["rabbitmq_raft_log_last_applied_index"] <= per_object["rabbitmq_raft_log_commit_index"]
        assert per_object["rabbitmq_raft_log_last_written_index"] - snapshot == held > 0
        aggregated = scrape(CoreCollector(broker, AGGREGATED, lambda: FIXED_PROCESS))
        assert value(aggregated, "rabbitmq_raft_log_snapshot_index") == snapshot
        await replicated.close()

    asyncio.run(scenario())


def test_a_replicated_stream_is_a_series_too_and_describes_itself_as_a_stream(tmp_path):
    """A stream's replica (one member here) is a series as a queue's is; its last written index
    counts its no-op and records; /api/queues' fields say `stream`."""
    from queues.message import Message, content_header
    from queues.stream_queue import StreamQueue
    from queues.timers import Timers

    async def scenario() -> None:
        broker = Broker()
        committer = GroupCommitter("always")
        replicated = ReplicatedQueues(node="a", coordinator=MemoryCoordinator(MemoryService()), data_dir=tmp_path,
                                      committer=committer, live_nodes=lambda: ["a"], secret="s3cret")
        await replicated.start("127.0.0.1")
        broker.replicate_queues(replicated)
        stream = replicated.stream_for(
            "/", "events", {"x-queue-type": "stream"}, None,
            lambda log, keeper: StreamQueue("events", "/", log=log, committer=committer, timers=Timers(),
                                            arguments={"x-queue-type": "stream"}, keeper=keeper))
        for number in range(3):
            stream.publish(Message("", "events", content_header(2, b"\x00\x00"), b"e%d" % number))
        confirmed = asyncio.get_running_loop().create_future()
        stream.when_stored(lambda error: confirmed.set_result(error))
        assert await asyncio.wait_for(confirmed, 10) is None
        assert stream.log.next_offset == 3  # committed: readable
        per_object = scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS))
        assert value(per_object, "rabbitmq_raft_log_last_written_index", vhost="/", queue="events") == 4
        assert value(per_object, "rabbitmq_raft_log_commit_index", vhost="/", queue="events") == 4
        described = replicated.describe("/", "events")
        assert described is not None
        assert (described["type"], described["leader"], described["members"]) == ("stream", "a", ["a"])
        stream.close()
        await replicated.close()

    asyncio.run(scenario())
