"""The amqp-queue sources over a cluster's node directories, without a JVM: a replicated stream's
copies (the same records at the same offsets in each node's ``replicas/<group>/stream/``) are one
source with one offset, each record read once from a copy that has it committed, whichever copies
are left; a replicated queue is read once by a batch query, from the node that took it over last,
and refused by a streaming query. The files are written by the broker's own StreamLog and
QueueStore; interop_tests/test_spark_replicas.py runs the same against a real cluster in Spark."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from persistence.replica_files import group_directory, incarnation_number  # noqa: E402
from persistence.stream_log import StreamLog  # noqa: E402
from spark.data_loss import DataLoss  # noqa: E402
from spark.data_source import QueueReader  # noqa: E402
from spark.streaming_source import AmqpQueueStreamReader  # noqa: E402
from tests.test_spark_streaming_source import COLUMNS, PROPS, T0, open_queue, publish, read_all  # noqa: E402

INCARNATION = "8f3a0c1d2e4b5a69"


def replica_stream(node: Path, name: str = "events", incarnation: str = INCARNATION) -> StreamLog:
    group = group_directory(node, "/", name, stream=True)
    group.mkdir(parents=True, exist_ok=True)
    (group / "incarnation").write_text(incarnation)
    return StreamLog.open(group / "stream", "/", name, max_segment_bytes=16 * 1024, index_interval_bytes=1024)


def append(log: StreamLog, n: int) -> None:
    for _ in range(n):
        k = log.appended_offset
        log.append("amq.direct", "rk", PROPS, b"s%d" % k, timestamp_ms=T0 + k)
    log.sync_now()


def copy_of(source: Path, node: Path, name: str = "events") -> None:
    """``node`` gets ``source``'s copy as it is now (a follower's files: the same records and marks)."""
    shutil.copytree(group_directory(source, "/", name, stream=True), group_directory(node, "/", name, stream=True),
                    dirs_exist_ok=True)


def three_copies(tmp_path: Path, lagging_at: int = 300, total: int = 500) -> dict[str, Path]:
    """n1 and n2 hold ``total`` records committed, n3 only the first ``lagging_at`` (a follower
    behind: its files and its mark end there)."""
    nodes = {name: tmp_path / name for name in ("n1", "n2", "n3")}
    log = replica_stream(nodes["n1"])
    append(log, lagging_at)
    log.close()
    copy_of(nodes["n1"], nodes["n3"])
    log = replica_stream(nodes["n1"])
    append(log, total - lagging_at)
    log.close()
    copy_of(nodes["n1"], nodes["n2"])
    return nodes


def paths(nodes: dict[str, Path]) -> str:
    return ",".join(f"{name}={path}" for name, path in nodes.items())


def stream_reader(nodes: dict[str, Path], **options) -> AmqpQueueStreamReader:
    given = {"path": paths(nodes), "startingOffsets": "earliest", "partition_bytes": "4096"}
    given.update({k: str(v) for k, v in options.items()})
    return AmqpQueueStreamReader(given, COLUMNS, frozenset())


def test_the_readers_name_the_files_the_cluster_writes():
    from cluster.replication import log as queue_log
    from cluster.replication import stream_replica_log
    from cluster.replication.replicated_queues import queue_id
    from cluster.replication.replicated_streams import stream_id
    from persistence import replica_files

    for vhost, name in (("/", "events"), ("eu", "orders é")):
        assert group_directory("/d", vhost, name, stream=True).name == hashlib.sha1(
            stream_id(vhost, name).encode()).hexdigest()
        assert group_directory("/d", vhost, name, stream=False).name == hashlib.sha1(
            queue_id(vhost, name).encode()).hexdigest()
    assert replica_files.STREAM_DIR == stream_replica_log.STREAM_DIR
    assert replica_files.TERM_FILE == stream_replica_log.TERM_FILE == queue_log.TERM_FILE
    assert replica_files.QUEUE_LOG_FILE == queue_log.LOG_FILE
    assert incarnation_number("ffffffffffffffff") < 2 ** 63


def test_a_replicated_stream_is_one_source_whose_records_are_each_read_once(tmp_path):
    nodes = three_copies(tmp_path)
    r = stream_reader(nodes)
    start = r.initialOffset()
    assert list(start) == ["format", "nodes", "replicated"] and start["nodes"] == {}
    entry = start["replicated"]["streams"]["/"]["events"]
    assert entry["created"] == incarnation_number(INCARNATION)
    rows: list[tuple[str, int]] = []
    while True:
        end = r.latestOffset(start, ReadMaxRows(120))
        if end == start:
            break
        for partition in r.partitions(start, end):
            assert "/n3/" not in partition.value[0].path or partition.value[2] < 300, "n3 has only 300 committed"
        rows.extend(read_all(r, start, end))
        start = end
    assert Counter(rows) == Counter(("events", k) for k in range(500))


def test_a_batch_planned_again_after_its_copy_went_reads_the_same_records_from_another(tmp_path):
    nodes = three_copies(tmp_path)
    r = stream_reader(nodes)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    before = sorted(read_all(r, start, end))
    planned = {p.value[0].path for p in r.partitions(start, end)}
    assert all("/n1/" in path for path in planned), "n1's copy reaches furthest (n2 ties, n1 comes first)"
    shutil.rmtree(nodes["n1"] / "replicas")  # its node gone, and its disk with it: the query goes on
    again = stream_reader(nodes)
    assert sorted(read_all(again, start, end)) == before
    assert {p.value[0].path.split("/replicas/")[0] for p in again.partitions(start, end)} == {str(nodes["n2"])}

    # Planned on n1 and n2, read when both are gone: n3 holds only 300 committed, so the rest is lost.
    planned_parts = r.partitions(start, end)
    shutil.rmtree(nodes["n2"] / "replicas")
    with pytest.raises(DataLoss, match="is gone"):
        for partition in planned_parts:
            list(r.read(partition))


def test_a_copy_that_comes_back_behind_or_ahead_neither_repeats_nor_skips(tmp_path):
    nodes = three_copies(tmp_path)
    only_n3 = {"n3": nodes["n3"]}
    r = stream_reader(only_n3)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    first = read_all(r, start, end)
    assert sorted(first) == [("events", k) for k in range(300)]
    r = stream_reader(nodes)  # the others are listed again: the query goes on at 300
    end2 = r.latestOffset(end, ReadAllAvailable())
    assert sorted(read_all(r, end, end2)) == [("events", k) for k in range(300, 500)]
    behind = stream_reader(only_n3)  # and with only the one behind, nothing new, nothing again
    assert behind.latestOffset(end2, ReadAllAvailable()) == end2


def test_the_batch_source_reads_each_record_of_a_replicated_stream_once(tmp_path):
    nodes = three_copies(tmp_path)
    reader = QueueReader({"path": paths(nodes), "partition_bytes": "4096"}, ("queue", "seq", "body"), frozenset())
    rows = []
    for partition in reader.partitions():
        for b in reader.read(partition):
            rows.extend(zip(b.column("seq").to_pylist(), b.column("body").to_pylist()))
    assert sorted(rows) == [(k, b"s%d" % k) for k in range(500)]


def test_a_stream_declared_again_is_read_from_its_new_incarnation(tmp_path):
    nodes = three_copies(tmp_path)
    r = stream_reader(nodes, failOnDataLoss="false")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    read_all(r, start, end)
    for node in nodes.values():
        shutil.rmtree(node / "replicas")
    log = replica_stream(nodes["n2"], incarnation="0123456789abcdef")
    append(log, 40)
    log.close()
    end2 = r.latestOffset(end, ReadAllAvailable())
    assert end2["replicated"]["streams"]["/"]["events"]["created"] == incarnation_number("0123456789abcdef")
    assert sorted(read_all(r, end, end2)) == [("events", k) for k in range(40)]
    with pytest.raises(DataLoss, match="deleted and declared again"):
        stream_reader(nodes).latestOffset(end, ReadAllAvailable())


def _replicated_queue(node: Path, messages: int, term: int) -> None:
    store = open_queue(node, "audit")
    publish(store, messages)
    store.close()
    group = group_directory(node, "/", "audit", stream=False)
    group.mkdir(parents=True, exist_ok=True)
    (group / "term.json").write_text(json.dumps({"promised_term": term}))


def test_a_replicated_queue_is_read_by_a_batch_from_its_newest_owner_only(tmp_path):
    nodes = {name: tmp_path / name for name in ("n1", "n2", "n3")}
    _replicated_queue(nodes["n1"], 30, term=1)  # the old leader's files, left behind
    _replicated_queue(nodes["n2"], 20, term=2)  # the new leader's
    group = group_directory(nodes["n3"], "/", "audit", stream=False)
    group.mkdir(parents=True)  # a follower: its replica, no queue files
    reader = QueueReader({"path": paths(nodes)}, ("queue", "seq", "body"), frozenset())
    seqs = []
    for partition in reader.partitions():
        for b in reader.read(partition):
            seqs.extend(b.column("seq").to_pylist())
    assert sorted(seqs) == list(range(1, 21)), "n2's files, not n1's as well"


def test_a_streaming_query_refuses_a_replicated_queue_or_leaves_it_out(tmp_path):
    nodes = {"n1": tmp_path / "n1"}
    _replicated_queue(nodes["n1"], 10, term=1)
    publish(open_queue(nodes["n1"], "classic"), 5)
    with pytest.raises(ValueError, match="'audit' in vhost '/' is a replicated \\(quorum\\) queue.*replicatedQueues"):
        stream_reader(nodes).initialOffset()
    r = stream_reader(nodes, replicatedQueues="skip")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert sorted(read_all(r, start, end)) == [("classic", k) for k in range(1, 6)]
    with pytest.raises(ValueError, match="replicatedQueues must be fail or skip"):
        stream_reader(nodes, replicatedQueues="maybe")
    with pytest.raises(ValueError, match="not a directory or label=directory"):
        stream_reader({"": nodes["n1"]})


def test_what_each_copy_marks_committed_is_what_a_majority_holds_across_a_failover(tmp_path):
    """The broker's own replication (sans-I/O, fsync by hand: tests/test_stream_replication.py):
    each copy's commit mark never names a record a majority has not fsynced, and the source over
    the three directories reads the records a majority holds, once, never a leader's tail that the
    next leader cut, across a change of leader."""
    from cluster.replication.stream_replica_log import StreamReplicaLog
    from persistence.stream_commit_mark import mark_unwritten, read_commit_mark
    from tests.test_stream_replication import Group

    nodes = {name: tmp_path / name for name in ("a", "b", "c")}
    logs = {}
    for name, node in nodes.items():
        group_dir = group_directory(node, "/", "orders", stream=True)
        group_dir.mkdir(parents=True)
        (group_dir / "incarnation").write_text(INCARNATION)
        logs[name] = StreamReplicaLog.open(group_dir, "/", "orders", committer=None)
    group = Group(tmp_path, logs=logs)

    def marks() -> dict[str, int | None]:
        """Each copy's commit mark's next offset; None where none is written yet."""
        return {name: None if mark_unwritten(log.stream.directory) else read_commit_mark(log.stream.directory).next_offset
                for name, log in logs.items()}

    def bodies_read(r: AmqpQueueStreamReader, start: dict) -> tuple[dict, list[tuple[int, bytes]]]:
        end = r.latestOffset(start, ReadAllAvailable())
        rows = []
        for partition in r.partitions(start, end):
            for b in r.read(partition):
                rows.extend(zip(b.column("seq").to_pylist(), b.column("body").to_pylist()))
        return end, sorted(rows)

    r = AmqpQueueStreamReader({"path": paths(nodes), "startingOffsets": "earliest", "queue": "orders"},
                              ("seq", "body"), frozenset())
    start = r.initialOffset()
    group.connect("b")
    group.connect("c")
    group.publish(*[f"m{n}" for n in range(10)])
    group.leader_fsync()
    group.replicate("b")  # a and b: a majority; c has nothing yet
    group.publish(*[f"x{n}" for n in range(5)])  # a alone: written and fsynced, never sent
    group.leader_fsync()
    assert marks() == {"a": 10, "b": 10, "c": 0}  # (c holds nothing yet: its mark, written at the open, says so)
    start, rows = bodies_read(r, start)
    assert rows == [(n, f"m{n}".encode()) for n in range(10)]

    group.start("b", term=2)  # a is cut off; b leads, c follows
    group.connect("c")
    group.publish("n0", "n1")
    group.leader_fsync()
    group.replicate("c")
    assert marks() == {"a": 10, "b": 12, "c": 12}  # a's files hold x0..x4 at offsets 10..14, unmarked
    start, rows = bodies_read(r, start)
    assert rows == [(10, b"n0"), (11, b"n1")]
    group.connect("a")  # a back as a follower: its tail is cut, b's records appended
    group.replicate("a")
    assert marks() == {"a": 12, "b": 12, "c": 12}
    assert bodies_read(r, start) == (start, [])
    for log in logs.values():
        log.close()
