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

from persistence.replica_files import group_directory, incarnation_number, read_queue_snapshot  # noqa: E402
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


def test_a_streaming_query_refuses_a_replicated_queue_without_commit_marks_or_leaves_it_out(tmp_path):
    """(Files of a broker from before commit marks: the group directory has no ``committed``.)"""
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


# ---- replicated (quorum) queues, read from their replica logs ---------------------------------------


class QueueGroup:
    """A quorum queue's replicas (`QueueReplicaLog`) in each node's group directory, driven by
    hand: frames move and fsyncs happen when the test says; each log hears the commit index as
    the broker's shell tells it (the leader's own, a follower's ``committed_index``)."""

    def __init__(self, tmp_path: Path, *, segment_bytes: int = 1 << 24, names=("a", "b", "c")) -> None:
        from cluster.replication.queue_log import QueueReplicaLog

        self.nodes = {name: tmp_path / name for name in names}
        self.names = names
        self.logs = {}
        for name, node in self.nodes.items():
            group = group_directory(node, "/", "audit", stream=False)
            group.mkdir(parents=True)
            (group / "incarnation").write_text(INCARNATION)
            self.logs[name] = QueueReplicaLog(group, segment_bytes=segment_bytes)
        # The leader's queue files (where a query finds the queue's name), with a record the
        # streaming query must never read: it reads the replica logs.
        store = open_queue(self.nodes["a"], "audit")
        store.append_message(1, T0, "", "audit", PROPS, b"from the queue files")
        store.close()
        self.seq = 0
        self.start("a", 1)

    def start(self, leader: str, term: int) -> None:
        from cluster.replication.follower import FollowerReplication
        from cluster.replication.leader import LeaderReplication

        self.leader_name, self.term = leader, term
        self.leader = LeaderReplication(leader, term, self.logs[leader], self.names)
        self.leader.start_term()
        self.followers = {n: FollowerReplication(n, "q", self.logs[n]) for n in self.names if n != leader}

    def publish(self, *bodies: bytes, seq: int | None = None) -> list[int]:
        """Message records appended by the leader (seqs from ``seq``, else after the last); their seqs."""
        from cluster.replication.queue_log import message_payload

        if seq is not None:
            self.seq = seq - 1
        seqs = []
        for body in bodies:
            self.seq += 1
            self.leader.append(message_payload(self.seq, T0 + self.seq, "", "audit", PROPS, body))
            seqs.append(self.seq)
        return seqs

    def settle(self, *seqs: int) -> None:
        from cluster.replication.queue_log import state_payload
        from persistence.record_format import MessageState

        for seq in seqs:
            self.leader.append(state_payload(seq, MessageState.ACKED, T0))

    def connect(self, name: str) -> None:
        from tests.test_stream_replication import frame

        assert self.leader.follower_connected(frame(self.followers[name].hello()))

    def leader_fsync(self) -> None:
        from tests.replication_by_hand import fsync

        log = self.logs[self.leader_name]
        fsync(log)
        if self.leader.local_synced():
            log.committed(self.leader.commit_index)
        log.apply_committed()

    def replicate(self, name: str) -> None:
        """Send, fsync and acknowledge until the leader has nothing more for ``name``; then a
        heartbeat (an APPEND without entries), which tells it the commit index."""
        from cluster.replication.wire import Mismatch, Reset
        from tests.replication_by_hand import fsync
        from tests.test_stream_replication import frame

        follower, log = self.followers[name], self.logs[name]
        while (data := self.leader.outgoing(name)) is not None:
            sent = frame(data)
            reply = follower.on_reset(sent) if isinstance(sent, Reset) else follower.on_append(sent)
            if reply is not None:
                answer = frame(reply)
                assert isinstance(answer, Mismatch)
                self.leader.on_mismatch(name, answer)
                continue
            fsync(log)
            ack = follower.ack()
            if ack is not None and self.leader.on_ack(name, frame(ack)):
                self.logs[self.leader_name].committed(self.leader.commit_index)
                self.logs[self.leader_name].apply_committed()
            log.committed(follower.committed_index)
            log.apply_committed()
        beat = self.leader.heartbeat(name)
        if beat is not None:
            follower.on_append(frame(beat))
            log.committed(follower.committed_index)
            log.apply_committed()

    def churn_until_compacted(self, follower: str) -> None:
        """Four rounds of 40 published and settled messages, replicated to `follower`: with
        segments of 16 KiB, enough for every copy to compact (a snapshot, segments gone)."""
        for _ in range(4):
            self.settle(*self.publish(*[b"settled" * 20] * 40))
            self.leader_fsync()
            self.replicate(follower)

    def marks(self) -> dict[str, int | None]:
        from persistence.replica_files import read_queue_commit_mark

        found = {}
        for name, log in self.logs.items():
            mark = read_queue_commit_mark(log.directory)
            found[name] = None if mark is None else mark.index
        return found

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


def queue_rows(r: AmqpQueueStreamReader, start: dict, max_rows: int | None = None) -> tuple[dict, list[tuple[int, bytes]]]:
    """One batch: its end and its rows' (seq, body), in the order read."""
    end = r.latestOffset(start, ReadAllAvailable() if max_rows is None else ReadMaxRows(max_rows))
    rows = []
    for partition in r.partitions(start, end):
        for b in r.read(partition):
            rows.extend(zip(b.column("seq").to_pylist(), b.column("body").to_pylist()))
    return end, rows


def queue_reader(nodes: dict[str, Path], **options) -> AmqpQueueStreamReader:
    given = {"path": paths(nodes), "startingOffsets": "earliest", "queue": "audit"}
    given.update({k: str(v) for k, v in options.items()})
    return AmqpQueueStreamReader(given, ("queue", "seq", "body", "segment", "state_event"), frozenset())


def failover_reads(tmp_path: Path) -> list[list[tuple[int, bytes]]]:
    """A quorum queue across a change of leader, read batch by batch over the three directories:
    a (leader, term 1) replicates m1..m10 to b; x11..x15 it writes and fsyncs but never sends;
    b leads term 2 with c and gives seqs 11, 12 to n11, n12; a comes back as a follower (its tail
    cut). Each batch's rows, and the marks checked on the way."""
    group = QueueGroup(tmp_path)
    r = queue_reader(group.nodes)
    start = r.initialOffset()
    batches = []
    group.connect("b")
    group.connect("c")
    group.publish(*[b"m%d" % n for n in range(1, 11)])
    group.leader_fsync()
    group.replicate("b")  # a and b: a majority; c has nothing yet
    group.publish(*[b"x%d" % n for n in range(11, 16)])  # a alone: fsynced, never sent
    group.leader_fsync()
    assert group.marks() == {"a": 11, "b": 11, "c": 0}  # (entry 1 is the leader's no-op; c: nothing yet)
    start, rows = queue_rows(r, start)
    batches.append(rows)
    group.start("b", 2)  # a is cut off; b leads, c follows
    group.connect("c")
    group.publish(b"n11", b"n12", seq=11)
    group.leader_fsync()
    group.replicate("c")
    assert group.marks() == {"a": 11, "b": 14, "c": 14}  # a's log holds x11..x15 at 12..16, unmarked
    start, rows = queue_rows(r, start)
    batches.append(rows)
    group.connect("a")
    group.replicate("a")  # a's tail cut, b's entries appended
    assert group.marks() == {"a": 14, "b": 14, "c": 14}
    end, rows = queue_rows(r, start)
    assert end == start
    batches.append(rows)
    group.close()
    return batches


def test_each_committed_message_of_a_quorum_queue_is_read_once_across_a_failover(tmp_path):
    batches = failover_reads(tmp_path)
    assert batches == [[(n, b"m%d" % n) for n in range(1, 11)], [(11, b"n11"), (12, b"n12")], []]


def test_control_a_reader_that_ignores_the_commit_mark_reads_what_the_next_leader_cut(tmp_path, monkeypatch):
    """A broken build: each copy's 'mark' is its last entry, committed or not. The same scenario
    then gives the old leader's x11.. under seqs that confirmed messages get later."""
    from persistence import replica_files
    from spark import replicated_queue_log

    def last_entry(group_dir):
        return replica_files.QueueCommitMark(_last_index(group_dir), 0)

    monkeypatch.setattr(replicated_queue_log, "read_queue_commit_mark", last_entry)
    batches = failover_reads(tmp_path)
    assert batches[0] != [(n, b"m%d" % n) for n in range(1, 11)]
    assert (11, b"x11") in batches[0]


def _last_index(group_dir: Path) -> int:
    """The index of the last whole entry in a replica's segments (committed or not)."""
    from cluster.replication.entries import scan_entries
    from cluster.replication.log import SEGMENT_HEADER_SIZE
    from persistence import replica_files

    last = 0
    for first, path in replica_files.queue_log_segments(group_dir):
        heads, _ = scan_entries(path.read_bytes()[SEGMENT_HEADER_SIZE:], first, stop_at_damage=True)
        if heads:
            last = heads[-1].index
    return last


def test_a_quorum_queue_query_from_earliest_gets_the_live_messages_of_the_snapshot_and_loss_is_reported(tmp_path):
    """Compaction drops a copy's oldest segments once their messages are settled, carrying the
    live ones in its snapshot. A query from earliest reads those and every message still in a
    segment, once; a query that had not read entries compacted since fails (failOnDataLoss), or
    with false still reads the live ones."""
    group = QueueGroup(tmp_path, segment_bytes=16 * 1024)
    group.connect("b")
    group.connect("c")
    (live,) = group.publish(b"live " * 20)
    lagging = queue_reader(group.nodes)
    lagging_start = lagging.initialOffset()
    lagging_start, rows = queue_rows(lagging, lagging_start)  # it reads the first message, then falls behind
    assert rows == []  # (nothing committed yet)
    for _ in range(6):
        seqs = group.publish(*[b"settled" * 20] * 40)
        group.settle(*seqs)
        group.leader_fsync()
        group.replicate("b")
        group.replicate("c")
    (later,) = group.publish(b"later")
    group.leader_fsync()
    group.replicate("b")
    group.replicate("c")
    for log in group.logs.values():
        assert log.snapshot_index > 10, "every copy compacted"
    fresh = queue_reader(group.nodes)
    start = fresh.initialOffset()
    end, rows = queue_rows(fresh, start)
    seqs = [seq for seq, _ in rows]
    assert seqs[0] == live and seqs[-1] == later and len(seqs) == len(set(seqs))
    assert set(seqs) < set(range(1, later + 1)), "settled messages of compacted segments are gone"
    compacted_from = min(log.snapshot_index for log in group.logs.values())
    kept = [log for log in group.logs.values() if log.snapshot_index == compacted_from][0]
    in_segments = [i for i, _, p in kept.entries() if len(p) > 9 and p[8] == 1]
    carried = read_queue_snapshot(kept.directory).carried  # unsettled when the snapshot was taken: live among them
    assert len(seqs) == len(carried) + len(in_segments), "the snapshot's live messages, then every one in a segment"
    assert queue_rows(fresh, end) == (end, [])

    # A checkpoint from before the compaction: a query going on from it is told what is gone.
    stale = {**lagging_start}
    stale["replicated"]["queues"]["/"]["audit"] = {**lagging_start["replicated"]["queues"]["/"]["audit"],
                                                   "first": 0, "next": 2, "segment": 2}
    with pytest.raises(DataLoss, match="compaction removed entries 2"):
        queue_reader(group.nodes).latestOffset(stale, ReadAllAvailable())
    tolerant = queue_reader(group.nodes, failOnDataLoss="false")
    _, rows = queue_rows(tolerant, stale)
    assert [seq for seq, _ in rows] == seqs[1:] or [seq for seq, _ in rows] == seqs
    group.close()


def test_quorum_queue_rows_are_one_per_message_record_with_the_classic_columns(tmp_path):
    group = QueueGroup(tmp_path)
    group.connect("b")
    group.publish(b"one", b"two")
    group.settle(1)
    group.publish(b"three")
    group.leader_fsync()
    group.replicate("b")
    r = queue_reader(group.nodes, startingOffsets="latest")
    start = r.initialOffset()
    assert start["replicated"]["queues"]["/"]["audit"]["next"] == 6  # no-op, two, ack, one
    group.publish(b"four")
    group.leader_fsync()
    assert queue_rows(r, start)[1] == [], "not committed: only the leader holds it"
    group.replicate("b")
    end = r.latestOffset(start, ReadAllAvailable())
    batch = [b for p in r.partitions(start, end) for b in r.read(p)]
    assert [row for b in batch for row in b.to_pylist()] == [
        {"queue": "audit", "seq": 4, "body": b"four", "segment": "replica.log", "state_event": "published"}]
    earliest = queue_reader(group.nodes)
    assert [s for s, _ in queue_rows(earliest, earliest.initialOffset())[1]] == [1, 2, 3, 4]
    at = queue_reader(group.nodes, startingOffsets=str(T0 + 3))
    assert [s for s, _ in queue_rows(at, at.initialOffset())[1]] == [3, 4]
    group.close()


def test_the_quorum_queue_readers_read_what_the_replica_log_writes(tmp_path):
    from cluster.replication import log as replica_log
    from persistence import replica_files

    assert replica_files.QUEUE_SNAPSHOT_FILE == replica_log.SNAPSHOT_FILE
    assert (replica_files.SEGMENT_PREFIX, replica_files.SEGMENT_SUFFIX) == (replica_log.SEGMENT_PREFIX,
                                                                            replica_log.SEGMENT_SUFFIX)
    log = replica_log.FileReplicaLog(tmp_path / "r", segment_bytes=4096)
    payloads = [bytes([k % 251]) * (k * 7 % 300) for k in range(1, 200)]
    for p in payloads:
        log.append(3, p)
    log.flush()
    got = list(replica_files.queue_log_entries(tmp_path / "r", 5, 150))
    assert [(i, t, p) for i, t, p in got] == [(i, 3, payloads[i - 1]) for i in range(5, 151)]
    assert log.segment_count > 3
    log.close()


def test_a_replicas_mark_survives_a_reopen_and_is_emptied_when_its_log_is_discarded(tmp_path):
    from cluster.replication.log import SNAPSHOT_FILE
    from cluster.replication.queue_log import QueueReplicaLog
    from persistence.replica_files import read_queue_commit_mark

    group = QueueGroup(tmp_path, segment_bytes=16 * 1024)
    group.connect("b")
    group.churn_until_compacted("b")
    b = group.logs["b"]
    marked = read_queue_commit_mark(b.directory)
    assert marked is not None and marked.index == b.last_index and b.snapshot_index > 0
    group.close()
    assert read_queue_commit_mark(QueueReplicaLog(b.directory).directory) == marked  # reopened: kept
    snapshot = b.directory / SNAPSHOT_FILE
    snapshot.write_bytes(snapshot.read_bytes()[:-1] + b"!")  # damaged: the replica starts empty
    emptied = QueueReplicaLog(b.directory)
    assert emptied.created_empty and read_queue_commit_mark(emptied.directory).index == 0
    emptied.close()


def test_a_quorum_queue_read_under_a_row_limit_in_several_partitions_gives_each_message_once(tmp_path):
    group = QueueGroup(tmp_path)
    group.connect("b")
    group.publish(*[b"%d" % n for n in range(1, 12001)])
    group.leader_fsync()
    group.replicate("b")
    r = queue_reader(group.nodes)
    start = r.initialOffset()
    seen: list[int] = []
    partitions = 0
    for _ in range(20):
        end = r.latestOffset(start, ReadMaxRows(9000))
        if end == start:
            break
        planned = r.partitions(start, end)
        partitions = max(partitions, len(planned))
        rows = [row for p in planned for b in r.read(p) for row in b.column("seq").to_pylist()]
        assert len(rows) <= 9000
        seen.extend(rows)
        start = end
    assert seen == list(range(1, 12001)) and partitions >= 2
    group.close()


def test_a_quorum_queue_query_from_a_timestamp_finds_it_window_by_window_past_a_snapshot(tmp_path, monkeypatch):
    """The first message at a timestamp is looked for a few entries at a time (not the whole log
    in memory at once): with tiny windows, and a copy compacted, the query starts at that message."""
    from spark import replicated_queue_log

    monkeypatch.setattr(replicated_queue_log, "_SCAN_ENTRIES", 3)
    group = QueueGroup(tmp_path, segment_bytes=16 * 1024)
    group.connect("b")
    group.churn_until_compacted("b")
    later = group.publish(*[b"later %d" % n for n in range(30)])
    group.leader_fsync()
    group.replicate("b")
    assert group.logs["a"].snapshot_index > 10, "compacted: the search starts past a snapshot"
    at = queue_reader(group.nodes, startingOffsets=str(T0 + later[10]))
    assert [seq for seq, _ in queue_rows(at, at.initialOffset())[1]] == later[10:]
    beyond = queue_reader(group.nodes, startingOffsets=str(T0 + later[-1] + 1))
    assert queue_rows(beyond, beyond.initialOffset())[1] == []
    group.close()
