"""The rabbitmq_raft_* families for a clustered broker's replicated queues: one series per queue
replica on the per-object endpoint (term, commit index, last written and applied index,
snapshot index 0), their sums on the aggregated one; none on a broker without replication."""

from __future__ import annotations

import asyncio

from amqp_server.broker.broker import Broker
from cluster.replication.replicated_queues import ReplicatedQueues, queue_id
from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
from cluster.replication.replica import Role
from persistence.group_commit import GroupCommitter
from tests.memory_coordinator import MemoryCoordinator, MemoryService
from tests.test_metrics_values import FIXED_PROCESS, scrape, value

RAFT = ("rabbitmq_raft_term_total", "rabbitmq_raft_log_commit_index", "rabbitmq_raft_log_last_written_index",
        "rabbitmq_raft_log_last_applied_index", "rabbitmq_raft_log_snapshot_index")


def test_a_broker_without_replication_serves_no_raft_family():
    samples = scrape(CoreCollector(Broker(), PER_OBJECT, lambda: FIXED_PROCESS))
    assert not [name for name, _labels in samples if name.startswith("rabbitmq_raft_")]


def test_each_replica_is_a_series_per_queue_and_the_aggregated_endpoint_sums_them(tmp_path):
    async def scenario() -> None:
        broker = Broker()
        replicated = ReplicatedQueues(node="a", coordinator=MemoryCoordinator(MemoryService()), data_dir=tmp_path,
                                      committer=GroupCommitter("always"), live_nodes=lambda: ["a"],
                                      secret="s3cret")
        await replicated.start("127.0.0.1")
        broker.replicate_queues(replicated)
        commits: dict[str, int] = {}
        roles: list[Role] = []
        for name, records in (("orders", 3), ("audit", 1)):
            replica = replicated.manager.host(queue_id("/", name), ["a"],
                                              lambda index, name=name: commits.__setitem__(name, index), roles.append)
            while replica.role is not Role.LEADER:
                await asyncio.sleep(0.01)
            for number in range(records):
                last = replica.publish(f"{name}-{number}".encode())
            while commits.get(name, 0) < last:
                await asyncio.sleep(0.01)
        per_object = scrape(CoreCollector(broker, PER_OBJECT, lambda: FIXED_PROCESS))
        # term 1; the term's no-op is entry 1, then the records
        assert value(per_object, "rabbitmq_raft_term_total", vhost="/", queue="orders") == 1
        assert value(per_object, "rabbitmq_raft_log_commit_index", vhost="/", queue="orders") == 4
        assert value(per_object, "rabbitmq_raft_log_last_written_index", vhost="/", queue="orders") == 4
        assert value(per_object, "rabbitmq_raft_log_last_applied_index", vhost="/", queue="audit") == 2
        assert value(per_object, "rabbitmq_raft_log_snapshot_index", vhost="/", queue="audit") == 0
        aggregated = scrape(CoreCollector(broker, AGGREGATED, lambda: FIXED_PROCESS))
        assert value(aggregated, "rabbitmq_raft_log_commit_index") == 6
        assert value(aggregated, "rabbitmq_raft_term_total") == 2
        assert all((name, frozenset()) in aggregated for name in RAFT)
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
