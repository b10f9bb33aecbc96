"""Spark over a cluster's node directories: a replicated stream and a replicated (quorum) queue are
each read once, whatever copies hold them, across a kill -9 of their leader in the middle of a
streaming query (the queue from its replica logs, up to each copy's commit mark); the quorum queue
is read once by a batch query, from the files of the node that leads it, not from the copy its
killed leader left behind (docs/spark.md, "On a cluster").

Three broker nodes and etcd (interop_tests/cluster_nodes.py), real Spark (local[2]): the streaming
query runs in a driver process of its own (interop_tests/spark_streaming_driver.py) over
``a=<dir>,b=<dir>,c=<dir>``; batch queries in this process's session.

Controls: ``AMQP_QUEUE_BROKEN=every-copy`` (interop_tests/spark_faults.py) is a source that reads a
range of a replicated stream or queue from every copy holding it;
``test_the_check_catches_a_source_that_reads_every_copy`` runs it and requires the exactly-once
check to fail for both. (A source that ignores the queue's commit mark is the control of
tests/test_spark_replicas.py, where the uncommitted tail can be made by hand.)
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pika = pytest.importorskip("pika")


from interop_tests.cluster_nodes import ClusterNode, pika_parameters, restart_node, three_nodes  # noqa: E402
from interop_tests.pika_helpers import publish_across_failovers  # noqa: E402
from interop_tests.spark_streaming_checks import Driver, batch_log, body, committed_rows  # noqa: E402
from interop_tests.test_replicated_streams import _declare, _leader  # noqa: E402
from interop_tests.waiting import wait_until  # noqa: E402

STREAM, QUEUE = "orders", "audit"
STREAM_ARGUMENTS = {"x-stream-max-segment-size-bytes": 64 * 1024}  # many segments, rolled while it runs


@pytest.fixture(scope="module")
def spark_session() -> Iterator[object]:
    from spark.session import local_session

    session = local_session()  # local[2]
    yield session
    session.stop()


class ClusterPublisher(threading.Thread):
    """Publishes ``m-<i>`` to each target with a confirm, through any node that answers; a message
    whose confirm did not come (the node died, a nack while no replica led) is never sent again, so
    each id is in a target at most once, and ``confirmed[target]`` are those it must hold."""

    def __init__(self, nodes: dict[str, ClusterNode], targets: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.hosts = [pika_parameters(node) for node in nodes.values()]
        for host in self.hosts:
            host.socket_timeout = 5
        self.targets = targets
        self.confirmed: dict[str, set[str]] = {target: set() for target in targets}
        self.next = 0
        self.halt = threading.Event()

    def publish(self, n: int) -> None:
        """``n`` messages now, each confirmed (the cluster is healthy)."""
        connection = pika.BlockingConnection(self.hosts)
        channel = connection.channel()
        channel.confirm_delivery()
        for _ in range(n):
            self._one(channel)
        connection.close()

    def _one(self, channel) -> None:
        i, self.next = self.next, self.next + 1
        for target in self.targets:
            channel.basic_publish("", target, body(i), pika.BasicProperties(message_id=f"m-{i}", delivery_mode=2))
            self.confirmed[target].add(f"m-{i}")  # (basic_publish raised if it was nacked)

    def run(self) -> None:
        publish_across_failovers(self.hosts, self.halt, self._one, pause_s=0.003)

    def finish(self) -> None:
        self.halt.set()
        self.join(timeout=60)
        assert not self.is_alive()


def node_paths(nodes: dict[str, ClusterNode]) -> str:
    return ",".join(f"{name}={node.broker.data_dir}" for name, node in nodes.items())


def assert_once(rows: list[dict], queue: str, confirmed: set[str], stream: bool) -> None:
    """Every confirmed message of ``queue`` in ``rows`` once; no record twice; a stream's offsets
    from 0 with none skipped (records whose confirm was lost in a failover may be there, once)."""
    mine = [r for r in rows if r["queue"] == queue]
    twice = [seq for seq, n in Counter(r["seq"] for r in mine).items() if n > 1]
    assert not twice, f"{queue}: {len(twice)} records read twice, e.g. seqs {sorted(twice)[:5]}"
    ids = Counter(r["message_id"] for r in mine)
    assert not [i for i, n in ids.items() if n > 1], f"{queue}: a message in two records"
    missing = sorted(confirmed - set(ids), key=lambda m: int(m[2:]))
    assert not missing, f"{queue}: {len(missing)} of {len(confirmed)} confirmed messages missing, e.g. {missing[:5]}"
    for r in mine:
        assert r["body"] == body(int(r["message_id"][2:]))
    if stream:
        assert sorted(r["seq"] for r in mine) == list(range(len(mine))), "offsets from 0, none skipped"


def queue_mark(node: ClusterNode) -> int | None:
    """The commit mark of the node's copy of the quorum queue."""
    from persistence.replica_files import group_directory, read_queue_commit_mark

    mark = read_queue_commit_mark(group_directory(node.broker.data_dir, "/", QUEUE, stream=False))
    return None if mark is None else mark.index


def batch_rows(session, nodes: dict[str, ClusterNode]) -> list[dict]:
    df = session.read.format("amqp-queue").load(node_paths(nodes)).select("queue", "seq", "message_id", "body")
    return [row.asDict() for row in df.collect()]


def _declare_both(nodes: dict[str, ClusterNode]) -> None:
    """The stream and the quorum queue, both led by a (declared there)."""
    _declare(nodes, nodes["a"], STREAM, **{"x-queue-type": "stream", **STREAM_ARGUMENTS})
    connection = pika.BlockingConnection(pika_parameters(nodes["a"]))
    connection.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()
    wait_until(lambda: all(_leader(node, QUEUE) == "a" for node in nodes.values()), "every node sees a lead the queue")


@pytest.mark.timeout(900)
def test_a_replicated_stream_is_read_once_across_a_leader_kill_and_a_quorum_queue_once_by_a_batch(
        spark_session, tmp_path):
    with three_nodes(tmp_path) as nodes:
        _declare_both(nodes)
        publisher = ClusterPublisher(nodes, (STREAM, QUEUE))
        publisher.publish(800)
        checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
        # No queue option: the query reads both, the stream and the quorum queue.
        settings = {"data_dir": node_paths(nodes), "checkpoint": str(checkpoint), "output": str(output),
                    "max_records": 300, "trigger": "200 milliseconds"}
        driver = Driver(tmp_path, dict(settings), "live")
        publisher.start()
        try:
            wait_until(lambda: len(batch_log(checkpoint)[1]) >= 2 or driver.check_alive(), "two batches done",
                       within=300)
            done_before = len(batch_log(checkpoint)[1])
            nodes["a"].broker.kill()  # the leader of both, in the middle of the query
            wait_until(lambda: _leader(nodes["b"], STREAM) in ("b", "c"), "the stream has a new leader", within=60)
            wait_until(lambda: _leader(nodes["b"], QUEUE) in ("b", "c"), "the queue has a new leader", within=60)
            confirmed_at_kill = len(publisher.confirmed[STREAM])
            wait_until(lambda: len(publisher.confirmed[STREAM]) > confirmed_at_kill + 300, "publishing goes on",
                       within=120)
            wait_until(lambda: len(batch_log(checkpoint)[1]) >= done_before + 3 or driver.check_alive(),
                       "batches done after the kill", within=300)
        finally:
            publisher.finish()
        driver.kill()
        final = Driver(tmp_path, {**settings, "trigger": "available-now"}, "final")
        assert final.wait(within=400) == 0, final.tail()
        streamed = committed_rows(output)
        assert_once(streamed, STREAM, publisher.confirmed[STREAM], stream=True)
        assert_once(streamed, QUEUE, publisher.confirmed[QUEUE], stream=False)

        # Batch, a still down: its copy of the stream is one of three, its files of the queue are
        # what it held when killed, left behind (the queue's leader is b or c now).
        stale = nodes["a"].broker.data_dir / "queues"
        assert any(stale.rglob("*.seg")), "a's copy of the queue is still on its disk"
        rows = batch_rows(spark_session, nodes)
        assert_once(rows, STREAM, publisher.confirmed[STREAM], stream=True)
        assert_once(rows, QUEUE, publisher.confirmed[QUEUE], stream=False)

        # a back, its copy caught up: three full copies, still each record once.
        restart_node(nodes["a"])
        wait_until(lambda: sorted(nodes["b"].api(f"queues/%2F/{STREAM}").json().get("in_sync", [])) == ["a", "b", "c"],
                   "a's copy of the stream is in sync", within=120)
        rows = batch_rows(spark_session, nodes)
        assert_once(rows, STREAM, publisher.confirmed[STREAM], stream=True)
        assert_once(rows, QUEUE, publisher.confirmed[QUEUE], stream=False)


@pytest.mark.timeout(600)
def test_the_check_catches_a_source_that_reads_every_copy(tmp_path):
    with three_nodes(tmp_path) as nodes:
        _declare_both(nodes)
        publisher = ClusterPublisher(nodes, (STREAM, QUEUE))
        publisher.publish(500)
        wait_until(lambda: all(sorted(nodes["a"].api(f"queues/%2F/{name}").json().get("in_sync", []))
                               == ["a", "b", "c"] for name in (STREAM, QUEUE)), "every copy in sync")
        # (a follower's queue mark moves with the leader's next APPEND or heartbeat: the same on all soon)
        wait_until(lambda: len({queue_mark(node) for node in nodes.values()}) == 1, "the queue's copies marked alike")
        checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"
        broken = Driver(tmp_path, {"data_dir": node_paths(nodes), "checkpoint": str(checkpoint),
                                   "output": str(output), "trigger": "available-now",
                                   "env": {"AMQP_QUEUE_BROKEN": "every-copy"}}, "broken")
        assert broken.wait(within=400) == 0, broken.tail()
        rows = committed_rows(output)
        with pytest.raises(AssertionError, match="read twice"):
            assert_once(rows, STREAM, publisher.confirmed[STREAM], stream=True)
        with pytest.raises(AssertionError, match="read twice"):
            assert_once(rows, QUEUE, publisher.confirmed[QUEUE], stream=False)
