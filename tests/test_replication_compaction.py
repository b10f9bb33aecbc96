"""Log compaction of a replicated queue (cluster/replication/queue_log.py `QueueReplicaLog`, on
`FileReplicaLog`'s segments and snapshot): the log stays bounded when messages are settled, a
takeover reads the unsettled messages instead of replaying the history, a crash at any point of
a compaction loses nothing, a follower too far behind catches up from the leader's snapshot, and
a new leader on a compacted log serves exactly the unsettled messages, redelivered as before.

Two deliberately broken compactions (test-only subclasses: one folds entries that are not
committed yet, one leaves a live message out of its snapshot) make the same checks fail: the
controls at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from cluster.replication.entries import HEAD_SIZE as ENTRY_HEAD_SIZE
from cluster.replication.follower import FollowerReplication
from cluster.replication.leader import LeaderReplication
from cluster.replication.log import SNAPSHOT_FILE, FileReplicaLog
from cluster.replication.queue_log import (
    Held, QueueReplicaLog, QueueState, horizon_payload, message_payload, state_payload,
)
from cluster.replication.replica import Role
from cluster.replication.replicated_journal import ReplicatedJournal
from cluster.replication.wire import Append, Reset
from persistence import atomic_file
from persistence.queue_store import QueueStore
from persistence.record_format import MessageState
from tests.replication_by_hand import frame, fsync, replicate_queue

SMALL = 64 * 1024  # segment size: a compaction every few hundred messages


def commit(log: QueueReplicaLog, index: int | None = None) -> None:
    """Make the log durable and tell it entries up to ``index`` (all) are committed."""
    fsync(log)
    log.committed(log.last_index if index is None else index)
    log.apply_committed()


def view(state: QueueState) -> tuple[dict[int, tuple[bytes, Held, int]], int, int]:
    """What a new leader serves: each unsettled message's body, whether a consumer held it and
    its delivery count; the delivery horizon; the next seq."""
    return ({seq: (state.messages[seq].body, state.held[seq], state.delivery_count.get(seq, 0))
             for seq in state.held}, state.delivery_horizon, state.next_seq)


class Workload:
    """Appends a queue's records to a leader's log and keeps every payload, so the state a whole
    replay gives (the reference) can be compared with what the compacted log gives."""

    def __init__(self, log: QueueReplicaLog, term: int = 1) -> None:
        self.log = log
        self.term = term
        self.payloads: list[bytes] = []
        self.seq = 0

    def add(self, payload: bytes) -> int:
        self.payloads.append(payload)
        return self.log.append(self.term, payload)

    def publish(self, body: bytes | None = None) -> int:
        self.seq += 1
        self.add(message_payload(self.seq, 1000 + self.seq, "", "q", b"\x10\x00\x02",
                                 body if body is not None else b"m%d" % self.seq))
        return self.seq

    def deliver(self, seq: int, count: int = 1) -> None:
        self.add(state_payload(seq, MessageState.DELIVERED, 0, delivery_count=count))

    def ack(self, seq: int) -> None:
        self.add(state_payload(seq, MessageState.ACKED, 0))

    def requeue(self, seq: int, count: int) -> None:
        self.add(state_payload(seq, MessageState.REQUEUED, 0, delivery_count=count))

    def churn(self, messages: int, *, commit_every: int = 100) -> None:
        """Messages published, delivered and acked, committed every ``commit_every``."""
        for n in range(messages):
            seq = self.publish()
            self.deliver(seq)
            self.ack(seq)
            if n % commit_every == commit_every - 1:
                commit(self.log)

    def reference(self) -> tuple[dict[int, tuple[bytes, Held, int]], int, int]:
        return view(QueueState.rebuild(self.payloads))


def live_and_settled(log: QueueReplicaLog, settled: int, commit_every: int = 100) -> Workload:
    """A queue with a long settled history around a few live messages: one a consumer holds
    (delivered twice), one requeued, one ready, one past the delivery horizon."""
    work = Workload(log)
    held = work.publish(b"held")
    work.deliver(held, 1)
    work.churn(settled // 2, commit_every=commit_every)
    requeued = work.publish(b"requeued")
    work.deliver(requeued, 1)
    work.requeue(requeued, 1)
    work.churn(settled - settled // 2, commit_every=commit_every)
    work.deliver(held, 2)
    ready = work.publish(b"ready")
    work.add(horizon_payload(ready))
    work.publish(b"beyond the horizon")
    commit(log)
    return work


# ---- the log stays bounded, and a takeover does work in proportion to the live messages ------------


def test_the_log_stays_bounded_under_publish_and_ack_churn(tmp_path):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    work = Workload(log)
    sizes = []
    for _ in range(20):
        work.churn(1000)
        commit(log)
        sizes.append(sum(path.stat().st_size for path in tmp_path.iterdir()))
    assert log.last_index == 60_000
    assert log.first_index > 55_000  # the settled history is gone from the log
    assert log.segment_count <= 2
    # On disk: never more than a few segments' worth, however long the history grows.
    assert max(sizes) <= 3 * SMALL, sizes
    assert not log.applied.held


def test_a_takeover_after_200000_settled_entries_reads_the_live_messages_only(tmp_path):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    work = live_and_settled(log, 66_666, commit_every=1000)
    assert log.last_index > 200_000
    work.publish(b"not committed yet")  # a new leader holds it too; its no-op commits it
    state = log.takeover_state()
    assert view(state) == work.reference()
    work_done = log.last_takeover
    assert work_done is not None
    assert work_done.entries_folded == 1  # the entry after the commit index, nothing older
    assert work_done.records_read == 4  # the four live messages' records, read back
    assert work_done.bytes_read < 1024
    # The state a replay of the whole history gives (as before compaction): the same queue.
    assert [seq for seq, (_, held, _) in view(state)[0].items() if held is Held.DELIVERED] == [1]


def test_a_replica_restarted_on_a_compacted_log_folds_only_what_came_after_its_snapshot(tmp_path):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    work = live_and_settled(log, 30_000)
    log.close()
    reopened = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    assert reopened.snapshot_index > 80_000
    assert view(reopened.takeover_state()) == work.reference()
    assert reopened.last_takeover is not None
    # A snapshot is taken whenever a segment can go: what follows it is about two segments.
    entries_per_segment = SMALL // 60
    assert reopened.last_takeover.entries_folded <= 2 * entries_per_segment


def test_the_snapshot_carries_at_most_its_budget_of_records_and_the_base_stops_before_the_rest(tmp_path):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL, snapshot_record_bytes=4096)
    work = Workload(log)
    work.churn(3000)
    backlog = [work.publish(b"x" * 500) for _ in range(40)]  # 20 KB of live records, not consumed yet
    first_of_backlog = log.last_index - 39
    work.churn(3000)
    commit(log)
    # The base never passes the record that would take the snapshot's records past 4096 bytes
    # (the 9th of the backlog): the log keeps the rest of the backlog, and what came after it.
    assert 0 < log.snapshot_index < first_of_backlog + 8
    assert len(log.snapshot().document) < 4096 + 40 * 30 + 100
    assert view(log.takeover_state()) == work.reference()
    assert log.last_takeover is not None and log.last_takeover.records_read == len(backlog)
    log.close()
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL, snapshot_record_bytes=4096)
    assert view(log.takeover_state()) == work.reference()
    # Once the backlog is consumed, compaction goes on past it.
    work.log = log
    for seq in backlog:
        work.deliver(seq)
        work.ack(seq)
    work.churn(3000)
    commit(log)
    assert log.snapshot_index > first_of_backlog + 6000 and not log.applied.held
    assert view(log.takeover_state()) == work.reference()


# ---- crashes -------------------------------------------------------------------------------------


class _Crash(Exception):
    """The process died here."""


def _at_the_edge_of_a_compaction(log: QueueReplicaLog) -> Workload:
    """Settled churn committed up to just before a segment could go; returns the workload."""
    work = Workload(log)
    live = work.publish(b"live")
    work.deliver(live, 3)
    while log.segment_count < 3:
        seq = work.publish()
        work.deliver(seq)
        work.ack(seq)
    return work


def test_a_crash_after_the_snapshot_before_the_segments_go_loses_nothing(tmp_path, monkeypatch):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    work = _at_the_edge_of_a_compaction(log)
    segments = sorted(tmp_path.glob("segment-*.log"))
    with monkeypatch.context() as patch:
        def crash(*args, **kwargs):
            raise _Crash()
        patch.setattr(FileReplicaLog, "_drop_segments", crash)
        with pytest.raises(_Crash):
            commit(log)
    assert (tmp_path / SNAPSHOT_FILE).exists() and all(path.exists() for path in segments)
    reopened = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    assert reopened.snapshot_index > 0
    base = reopened.snapshot_index
    firsts = [int(path.name[8:-4]) for path in segments]
    below = [path for path, after in zip(segments, firsts[1:]) if after <= base + 1]
    assert below  # the compaction had segments to remove: they went at the open
    assert sorted(tmp_path.glob("segment-*.log")) == [path for path in segments if path not in below]
    assert view(reopened.takeover_state()) == work.reference()
    assert [bytes(p) for _, _, p in reopened.entries()] == work.payloads[reopened.first_index - 1:]


def test_a_crash_while_the_snapshot_is_written_loses_nothing(tmp_path, monkeypatch):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    work = _at_the_edge_of_a_compaction(log)
    with monkeypatch.context() as patch:
        def crash(*args, **kwargs):
            raise _Crash()
        patch.setattr(atomic_file.os, "replace", crash)  # the temporary file written, not renamed
        with pytest.raises(_Crash):
            commit(log)
    # (write_atomically removes its temporary file on an exception; a real crash leaves it.)
    (tmp_path / ".snapshot.leftover.tmp").write_bytes(b"half a snapshot")
    reopened = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    assert not list(tmp_path.glob(".*.tmp"))
    assert reopened.snapshot_index == 0 and reopened.first_index == 1
    assert view(reopened.takeover_state()) == work.reference()


def test_a_damaged_snapshot_empties_the_replica_which_is_then_copied_again(tmp_path):
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    Workload(log).churn(3000)
    commit(log)
    log.promise(4)
    log.close()
    data = bytearray((tmp_path / SNAPSHOT_FILE).read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / SNAPSHOT_FILE).write_bytes(bytes(data))
    reopened = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    # It no longer holds what it acknowledged: it says so (it votes only once caught up).
    assert reopened.created_empty and reopened.last_index == 0
    assert reopened.promised_term == 4


def test_a_format_1_log_is_read_as_the_first_segment_and_then_compacted(tmp_path):
    (tmp_path / "legacy").mkdir()
    legacy = QueueReplicaLog(tmp_path / "legacy", segment_bytes=1 << 30)
    work = Workload(legacy)
    work.churn(500)
    legacy.close()
    # A format 1 directory: the same entries in replica.log after a version 1 header.
    segment = next((tmp_path / "legacy").glob("segment-*.log"))
    old = tmp_path / "old"
    old.mkdir()
    from cluster.replication.log import HEADER_SIZE, SEGMENT_HEADER_SIZE, _marker
    (old / "replica.log").write_bytes(_marker(1) + segment.read_bytes()[SEGMENT_HEADER_SIZE:])
    shutil.copy(tmp_path / "legacy" / "term.json", old / "term.json")
    log = QueueReplicaLog(old, segment_bytes=SMALL)
    assert log.last_index == 1500
    assert (old / "replica.log").read_bytes()[:HEADER_SIZE] == _marker()  # now format 2
    assert view(log.takeover_state()) == work.reference()
    work.log = log
    work.churn(3000)
    commit(log)
    assert log.snapshot_index > 1500 and not (old / "segment-00000000000000000001.log").exists()


def test_folding_the_committed_entries_reads_none_after_them(tmp_path, monkeypatch):
    """A leader's log at a commit: the entries after the commit index are still in the group
    commit's buffer. Folding reads the committed ones only: it neither writes the buffer out
    ahead of the next round nor reads back what it cannot fold yet."""
    log = QueueReplicaLog(tmp_path, segment_bytes=SMALL)
    work = Workload(log)
    for _ in range(10):
        work.publish(b"x" * 100)
    fsync(log)
    committed = log.last_index
    for _ in range(5):
        work.publish(b"y" * 100)  # appended after the round: buffered
    written, read = [], []
    real_write, real_pread = os.write, os.pread
    monkeypatch.setattr(os, "write", lambda fd, data: written.append(len(data)) or real_write(fd, data))
    monkeypatch.setattr(os, "pread", lambda fd, n, at: read.append(n) or real_pread(fd, n, at))
    log.committed(committed)
    log.apply_committed()
    monkeypatch.undo()
    assert log.applied_index == committed and len(log.applied.held) == 10
    assert written == []  # the five buffered entries wait for the next round
    first_ten = sum(len(payload) + ENTRY_HEAD_SIZE for payload in work.payloads[:10])
    assert sum(read) == first_ten


# ---- followers ------------------------------------------------------------------------------------


class Group:
    """A leader and followers on `QueueReplicaLog`s; frames move by hand, and each log hears the
    commit index as the shell tells it (the leader's own, a follower's `committed_index`)."""

    def __init__(self, tmp_path: Path, log_class: type[QueueReplicaLog] = QueueReplicaLog,
                 names: tuple[str, ...] = ("a", "b", "c")) -> None:
        self.logs = {n: log_class(tmp_path / n, segment_bytes=SMALL) for n in names}
        self.leader = LeaderReplication("a", 1, self.logs["a"], names)
        self.followers = {n: FollowerReplication(n, "q", self.logs[n]) for n in names if n != "a"}
        self.sent: dict[str, list[type]] = {n: [] for n in names}  # the kinds of frame each was sent

    def connect(self, name: str) -> None:
        assert self.leader.follower_connected(frame(self.followers[name].hello()))

    def replicate(self, name: str) -> None:
        """Send, fsync and acknowledge until the leader has nothing more for ``name``."""
        replicate_queue(self.leader, self.logs["a"], name, self.followers[name], self.logs[name], self.sent[name])

    def round(self, *names: str) -> None:
        fsync(self.logs["a"])
        if self.leader.local_synced():
            self.logs["a"].committed(self.leader.commit_index)
        for name in names:
            self.replicate(name)


def test_a_follower_too_far_behind_catches_up_from_the_leaders_snapshot(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.leader.start_term()
    work = Workload(group.logs["a"])
    work.payloads.append(b"")  # (the no-op)
    held = work.publish(b"held")
    work.deliver(held, 2)
    for _ in range(10):
        work.churn(300, commit_every=10**9)
        group.round("b")
    assert group.logs["a"].first_index > 1  # compacted: c cannot be sent the history
    group.connect("c")
    group.replicate("c")
    # The leader no longer had c's entries: it sent its snapshot, then the entries after it.
    assert group.sent["c"][0] == Reset and set(group.sent["c"][1:]) == {Append}
    c = group.logs["c"]
    assert c.last_index == group.logs["a"].last_index
    assert c.first_index == group.logs["a"].first_index  # it went on after the leader's base
    assert view(c.takeover_state()) == work.reference()
    assert c.last_takeover is not None and c.last_takeover.entries_folded < 10
    c.close()
    assert view(QueueReplicaLog(tmp_path / "c", segment_bytes=SMALL).takeover_state()) == work.reference()


def _a_new_leader_replaces_an_uncommitted_suffix(tmp_path: Path, log_class: type[QueueReplicaLog]) -> None:
    """Follower b got entries the old leader a never committed (three segments of them); the new
    leader c, which has only the committed ones, writes other entries in their place. b must end
    with c's queue, not with the messages it held uncommitted."""
    group = Group(tmp_path, log_class)
    group.connect("b")
    group.leader.start_term()
    work = Workload(group.logs["a"])
    work.payloads.append(b"")
    work.churn(600, commit_every=10**9)
    group.round("b")
    group.connect("c")
    group.replicate("c")
    committed = group.leader.commit_index
    for _ in range(3000):  # to b only, and b's acknowledgement is lost with a
        work.publish(b"never committed")
    b = group.logs["b"]
    follower_b = group.followers["b"]
    while (data := group.leader.outgoing("b")) is not None:
        assert follower_b.on_append(frame(data)) is None
    fsync(b)
    b.committed(follower_b.committed_index)
    b.apply_committed()
    assert b.snapshot_index > 0  # b compacted what it knew to be committed
    # c leads term 2 with the committed entries, and writes its own.
    c = group.logs["c"]
    assert c.last_index == committed
    new_leader = LeaderReplication("c", 2, c, ("a", "b", "c"))
    new_leader.start_term()
    theirs = Workload(c, term=2)
    theirs.payloads = work.payloads[:committed] + [b""]
    theirs.seq = work.seq - 3000
    for _ in range(2):
        theirs.publish(b"the new leader's")
    assert new_leader.follower_connected(frame(follower_b.hello()))
    replicate_queue(new_leader, c, "b", follower_b, b)
    assert b.last_index == c.last_index
    assert view(b.takeover_state()) == theirs.reference()


def test_a_new_leaders_entries_replace_an_uncommitted_suffix_compaction_never_touched(tmp_path):
    _a_new_leader_replaces_an_uncommitted_suffix(tmp_path, QueueReplicaLog)


# ---- a new leader's queue on a compacted log --------------------------------------------------------


class _Replica:
    """What the journal uses of a QueueReplica: its role, its log and `publish`."""

    def __init__(self, log: QueueReplicaLog, term: int = 1) -> None:
        self.queue = '["/","q"]'
        self.role = Role.LEADER
        self.log = log
        self.term = term

    def publish(self, payload: bytes) -> int:
        return self.log.append(self.term, payload)


def _taken_over(tmp_path: Path, log: QueueReplicaLog) -> list[tuple[int, int, bytes]]:
    """The queue a new leader builds from ``log``: (seq, delivery count, body) in order."""
    def open_store() -> QueueStore:
        return QueueStore.for_queue(tmp_path / "new", "/", "q")

    journal = ReplicatedJournal(open_store(), None, _Replica(log, 2), open_store,  # type: ignore[arg-type]
                                lambda journal: None, lambda journal: None)
    journal.recover()
    rows = list(QueueStore.for_queue(tmp_path / "new", "/", "q").recover().rows())
    out = []
    for seq, count, *_ in rows:
        message = journal.load_message(seq)
        assert message is not None
        out.append((seq, count, message.body))
    return out


@pytest.mark.parametrize("reopen", [False, True], ids=["state at hand", "restarted"])
def test_a_new_leader_after_compaction_serves_exactly_the_unsettled_messages_redelivered_as_before(
        tmp_path, reopen, log_class: type[QueueReplicaLog] = QueueReplicaLog):
    log = log_class(tmp_path / "log", segment_bytes=SMALL)
    work = live_and_settled(log, 5000)
    assert log.snapshot_index > 10_000
    if reopen:
        log.close()
        log = log_class(tmp_path / "log", segment_bytes=SMALL)
    # held: a consumer had it (delivered twice): back with count 2, delivered next as the 3rd time;
    # requeued (count 1) and ready, both within the last horizon: may have gone out, so one more;
    # past the horizon: never delivered.
    expected = [(1, 2, b"held"), (2 + 2500, 2, b"requeued"), (work.seq - 1, 1, b"ready"),
                (work.seq, 0, b"beyond the horizon")]
    assert asyncio.run(_async(_taken_over, tmp_path / "compacted", log)) == expected
    done = log.last_takeover
    assert done is not None
    if reopen:  # its state from the snapshot, then what came after it
        assert done.entries_folded <= 2 * SMALL // 60
    else:  # its state at hand: the live records read back, nothing replayed
        assert (done.entries_folded, done.records_read) == (0, 4)
    # As before compaction: a log holding the whole history, replayed whole, gives the same queue.
    whole = QueueReplicaLog(tmp_path / "whole")
    for payload in work.payloads:
        whole.append(1, payload)
    assert asyncio.run(_async(_taken_over, tmp_path / "replayed", whole)) == expected
    assert whole.last_takeover is not None and whole.last_takeover.entries_folded == len(work.payloads)


async def _async(function, *args):
    return function(*args)


# ---- controls: broken compactions make the checks above fail -----------------------------------------


class FoldsUncommitted(QueueReplicaLog):
    """Broken: folds (and so compacts past) entries that are fsynced here but not committed."""

    def _apply_target(self) -> int:
        return min(self.durable_index, self.last_index)


class LosesALiveMessage(QueueReplicaLog):
    """Broken: its first compaction forgets the oldest unsettled message (its record is dropped
    with the segment that held it)."""

    def _snapshot_document(self, cut: int) -> tuple[bytes, dict[int, tuple[int, int]]]:
        applied = self.applied
        if applied.held and not self.snapshot_index:
            seq = next(iter(applied.held))
            applied.held.pop(seq), applied.where.pop(seq), applied.delivery_count.pop(seq, None)
        return super()._snapshot_document(cut)


def test_control_compaction_past_the_commit_index_keeps_entries_a_new_leader_replaced(tmp_path):
    # (b compacts its uncommitted entries away, takes them for committed when the new leader's
    # run starts below its base, and never gets the new leader's entries in their place.)
    with pytest.raises(AssertionError):
        _a_new_leader_replaces_an_uncommitted_suffix(tmp_path, FoldsUncommitted)


@pytest.mark.parametrize("reopen", [False, True], ids=["state at hand", "restarted"])
def test_control_a_compaction_that_drops_a_live_message_loses_it(tmp_path, reopen):
    with pytest.raises(AssertionError):
        test_a_new_leader_after_compaction_serves_exactly_the_unsettled_messages_redelivered_as_before(
            tmp_path, reopen, LosesALiveMessage)
