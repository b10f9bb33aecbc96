"""A replicated stream's log (cluster/replication/stream_replica_log.py) under the replication
protocol's state machines, sans-I/O: leader and followers exchange frames by hand and fsync is a
call the test makes, so every step is visible. The stream's own segment files are the log: the
tests compare the copies' files byte for byte."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.replication.follower import FollowerReplication
from cluster.replication.leader import LeaderReplication
from cluster.replication.replica import Role
from cluster.replication.replicated_streams import ReplicatedStream
from cluster.replication.stream_replica_log import StreamReplicaLog
from cluster.replication.wire import Ack, Mismatch, Refuse, Reset, State
from persistence.stream_segment import HEADER_SIZE
from tests.replication_by_hand import frame, fsync

PROPS = b"\x00\x00"  # no properties


def open_log(path: Path) -> StreamReplicaLog:
    return StreamReplicaLog.open(path, "/", "orders", committer=None)


def segment_files(log: StreamReplicaLog) -> dict[str, bytes]:
    """The stream's segment files (name -> their records' bytes, after the header), as the copies
    must agree on them (a header's creation time is each copy's own)."""
    log.flush()
    directory = log.stream.directory
    return {p.name: p.read_bytes()[HEADER_SIZE:] for p in sorted(directory.glob("*.seg"))}


def bodies(log: StreamReplicaLog, first: int = 0) -> list[tuple[int, bytes]]:
    """(offset, body) of every committed (readable) record."""
    cursor = log.stream.reader(first)
    try:
        return [(r.offset, r.body) for r in cursor.read(100000)]
    finally:
        cursor.close()


class Group:
    """A leader and its followers, each with a stream replica in its own directory."""

    def __init__(self, tmp_path: Path, names=("a", "b", "c"), leader="a", term=1, logs=None):
        self.tmp_path = tmp_path
        self.names = names
        self.logs = logs or {n: open_log(tmp_path / n) for n in names}
        self.start(leader, term)

    def start(self, leader: str, term: int) -> None:
        self.leader_name = leader
        self.leader = LeaderReplication(leader, term, self.logs[leader], self.names)
        self.leader.start_term()
        self.followers = {n: FollowerReplication(n, "q", self.logs[n]) for n in self.names if n != leader}
        self.logs[leader].stream.set_writable(True)
        for name in self.names:
            if name != leader:
                self.logs[name].stream.set_writable(False)

    @property
    def stream(self):
        return self.logs[self.leader_name].stream

    def publish(self, *texts: str) -> list[int]:
        return [self.stream.append("", "orders", PROPS, text.encode()) for text in texts]

    def connect(self, name: str) -> None:
        assert self.leader.follower_connected(frame(self.followers[name].hello()))

    def replicate(self, name: str) -> None:
        """Send, fsync and acknowledge until the leader has nothing more for ``name``."""
        follower = self.followers[name]
        for _ in range(10000):
            sent = self.leader.outgoing(name)
            if sent is None:
                return
            received = frame(sent)
            if isinstance(received, Reset):
                reply = follower.on_reset(received)
            else:
                reply = follower.on_append(received)
            if reply is not None:
                self.answer(name, frame(reply))
                continue
            fsync(self.logs[name])
            self.logs[name].committed(follower.committed_index)
            ack = follower.ack()
            if ack is not None:
                self.answer(name, frame(ack))
        raise AssertionError("replication did not settle")

    def answer(self, name: str, reply) -> None:
        if isinstance(reply, Ack):
            if self.leader.on_ack(name, reply):
                self.logs[self.leader_name].committed(self.leader.commit_index)
        elif isinstance(reply, Mismatch):
            self.leader.on_mismatch(name, reply)
        elif isinstance(reply, Refuse):
            self.leader.on_refuse(name, reply)

    def leader_fsync(self) -> None:
        fsync(self.logs[self.leader_name])
        if self.leader.local_synced():
            self.logs[self.leader_name].committed(self.leader.commit_index)


def test_followers_hold_the_leaders_records_byte_for_byte_at_the_same_offsets(tmp_path):
    group = Group(tmp_path)
    for name in ("b", "c"):
        group.connect(name)
    assert group.publish("m0", "m1", "m2") == [0, 1, 2]
    group.leader_fsync()
    group.replicate("b")
    group.publish("m3")
    group.leader_fsync()
    group.replicate("b")
    group.replicate("c")
    assert segment_files(group.logs["b"]) == segment_files(group.logs["c"]) == segment_files(group.logs["a"])
    for name in ("a", "b", "c"):
        assert bodies(group.logs[name]) == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"m3")], name
    # entry 1 is the term's no-op; messages follow it
    assert group.logs["a"].last_index == 5 and group.logs["a"].term_at(1) == 1


def test_a_record_is_readable_and_confirmed_only_once_a_majority_fsynced_it(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.connect("c")
    confirmed = []
    group.publish("m0")
    stream = group.stream
    stream.request_commit(lambda error: confirmed.append(error))
    group.leader_fsync()  # the leader's own fsync: one of three
    assert bodies(group.logs["a"]) == [] and stream.next_offset == 0
    sent = group.leader.outgoing("b")
    assert group.followers["b"].on_append(frame(sent)) is None
    # b has the no-op (a control entry, fsynced as it is written) and m0, not fsynced yet: its
    # ACK covers the no-op alone, which commits nothing readable.
    group.answer("b", frame(group.followers["b"].ack()))
    assert group.logs["b"].durable_index == 1
    assert bodies(group.logs["a"]) == [] and confirmed == []
    fsync(group.logs["b"])
    group.answer("b", frame(group.followers["b"].ack()))
    assert bodies(group.logs["a"]) == [(0, b"m0")]
    assert group.stream.next_offset == 1
    assert confirmed == [None]


def test_followers_alone_make_the_majority_when_the_leaders_fsync_lags(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.connect("c")
    group.publish("m0", "m1")
    group.replicate("b")
    assert bodies(group.logs["a"]) == []  # b and the no-op... the leader's log is not fsynced yet
    group.replicate("c")
    assert bodies(group.logs["a"]) == [(0, b"m0"), (1, b"m1")]


def test_a_new_leader_keeps_every_committed_record_at_its_offset_and_the_old_leaders_tail_goes(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.connect("c")
    group.publish(*[f"m{n}" for n in range(10)])
    group.leader_fsync()
    group.replicate("b")
    group.replicate("c")
    # Five more reach a alone (written, fsynced, never sent): not committed, never readable.
    group.publish(*[f"x{n}" for n in range(5)])
    group.leader_fsync()
    assert [b for _, b in bodies(group.logs["a"])] == [f"m{n}".encode() for n in range(10)]
    old = group.logs["a"]
    # b is elected (its log is as up to date as c's); a comes back as a follower.
    group.start("b", term=2)
    group.connect("c")
    group.connect("a")
    group.publish("n0", "n1")
    group.leader_fsync()
    group.replicate("c")
    group.replicate("a")
    expected = [(n, f"m{n}".encode()) for n in range(10)] + [(10, b"n0"), (11, b"n1")]
    for name in ("a", "b", "c"):
        assert bodies(group.logs[name]) == expected, name
    assert segment_files(old) == segment_files(group.logs["b"]) == segment_files(group.logs["c"])


def test_a_reopened_copy_reads_only_what_was_committed_and_keeps_its_index(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.publish("m0", "m1")
    group.leader_fsync()
    group.replicate("b")
    group.publish("u0")  # appended and fsynced on a alone
    group.leader_fsync()
    last_index, last_term = group.logs["a"].last_index, group.logs["a"].last_term
    group.logs["a"].close()
    reopened = open_log(tmp_path / "a")
    assert (reopened.last_index, reopened.last_term) == (last_index, last_term)
    assert bodies(reopened) == [(0, b"m0"), (1, b"m1")]  # u0 is there but not committed
    assert reopened.stream.appended_offset == 3


def test_retention_drops_the_same_segments_on_every_copy_once_committed(tmp_path):
    group = Group(tmp_path)
    for name in ("b", "c"):
        group.connect(name)
    group.logs["a"].set_segment_size(400)  # a CONFIG entry: every copy rolls at the same records
    group.stream.set_retention(1200, None)
    for n in range(40):
        group.publish(f"message {n:03d} " + "x" * 40)
        group.leader_fsync()
        group.replicate("b")
        group.replicate("c")
    group.stream.apply_retention()
    group.leader_fsync()
    group.replicate("b")
    group.replicate("c")
    names = {name: sorted(segment_files(group.logs[name])) for name in group.names}
    assert names["a"] == names["b"] == names["c"]
    assert len(names["a"]) < 40 // 5  # segments were dropped
    first = group.stream.first_offset
    assert first > 0
    for name in group.names:
        assert group.logs[name].stream.first_offset == first
        assert segment_files(group.logs[name]) == segment_files(group.logs["a"])


def test_a_follower_behind_retention_is_reset_and_gets_every_record_kept(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.logs["a"].set_segment_size(400)
    group.stream.set_retention(1200, None)
    for n in range(40):
        group.publish(f"message {n:03d} " + "x" * 40)
        group.leader_fsync()
        group.replicate("b")
    group.stream.apply_retention()
    group.leader_fsync()
    group.replicate("b")
    assert group.stream.first_offset > 0
    # c was away the whole time: it starts from an empty log, which the leader no longer has.
    group.connect("c")
    group.replicate("c")
    assert segment_files(group.logs["c"]) == segment_files(group.logs["a"])
    assert bodies(group.logs["c"]) == bodies(group.logs["a"])
    assert group.logs["c"].last_index == group.logs["a"].last_index
    # and it goes on replicating after the reset
    group.publish("after")
    group.leader_fsync()
    group.replicate("c")
    assert bodies(group.logs["c"])[-1][1] == b"after"
    group.logs["c"].close()
    reopened = open_log(tmp_path / "c")
    assert reopened.last_index == group.logs["a"].last_index
    assert reopened.stream.first_offset == group.stream.first_offset


def test_tracked_consumer_offsets_reach_followers_in_a_state_frame(tmp_path):
    leader, follower = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    leader.stream.offsets.store("billing", 41)
    state = frame(__import__("cluster.replication.wire", fromlist=["encode_state"]).encode_state(
        1, leader.state_document()))
    assert isinstance(state, State)
    follower.apply_state(state.document)
    assert follower.stream.offsets.items() == {"billing": 41}
    leader.stream.offsets.store("billing", 50)
    leader.stream.offsets.store("audit", 3)
    follower.apply_state(leader.state_document())
    assert follower.stream.offsets.items() == {"billing": 50, "audit": 3}


def test_a_copy_that_does_not_lead_refuses_publishes(tmp_path):
    group = Group(tmp_path)
    with pytest.raises(OSError):
        group.logs["b"].stream.append("", "orders", PROPS, b"no")


def test_a_reset_cut_short_by_a_crash_is_done_again_when_the_copy_opens(tmp_path, monkeypatch):
    group = Group(tmp_path, names=("a", "b"))
    group.connect("b")
    group.publish("m0", "m1", "m2")
    group.leader_fsync()
    group.replicate("b")
    follower = group.logs["b"]

    def crash(next_offset):
        raise KeyboardInterrupt("the process died here")

    monkeypatch.setattr(follower.stream, "reset", crash)
    with pytest.raises(KeyboardInterrupt):
        follower.reset(40, 3, 37, b"")  # the control file says so; the stream was not reset yet
    reopened = open_log(tmp_path / "b")
    assert (reopened.base.index, reopened.last_index, reopened.last_term) == (40, 40, 3)
    assert reopened.stream.first_offset == reopened.stream.appended_offset == 37
    assert sorted(segment_files(reopened)) == ["00000000000000000037.seg"]


def test_control_entries_placed_after_messages_a_crash_lost_are_dropped_when_the_copy_opens(tmp_path):
    log = open_log(tmp_path / "a")
    log.append(1, b"")  # the term's no-op
    log.stream.set_writable(True)
    log.stream.append("", "orders", PROPS, b"kept")
    fsync(log)
    log.stream.append("", "orders", PROPS, b"lost")  # in the write buffer only
    log.set_segment_size(4096)  # a control entry after it: written and fsynced at once
    assert log.last_index == 4
    # The process dies: the buffered record never reached the file, the control entry did.
    reopened = open_log(tmp_path / "a")
    assert reopened.stream.appended_offset == 1
    assert reopened.last_index == 2 and reopened.stream.max_segment_bytes != 4096


def test_a_truncation_never_cuts_committed_records(tmp_path):
    group = Group(tmp_path, names=("a", "b"))
    group.connect("b")
    group.publish("m0", "m1")
    group.leader_fsync()
    group.replicate("b")
    with pytest.raises(ValueError):
        group.logs["b"].stream.truncate(1)


def test_retention_by_age_is_the_leaders_decision_and_every_copy_drops_the_same_segments(tmp_path):
    group = Group(tmp_path)
    for name in ("b", "c"):
        group.connect(name)
    group.logs["a"].set_segment_size(400)
    for n in range(20):
        group.publish(f"message {n:03d} " + "x" * 40)
        group.leader_fsync()
        group.replicate("b")
        group.replicate("c")
    group.stream.set_retention(None, 60_000)  # x-max-age 60 s
    before = sorted(segment_files(group.logs["b"]))
    # A follower holds no limits of its own (only its leader's broker applies policies): its
    # clock drops nothing.
    group.logs["b"].stream.apply_retention(now_ms=2**62)
    assert sorted(segment_files(group.logs["b"])) == before
    group.stream.apply_retention(now_ms=2**62)  # an hour later, on the leader: all but the newest are too old
    group.leader_fsync()
    group.replicate("b")
    group.replicate("c")
    names = {name: sorted(segment_files(group.logs[name])) for name in group.names}
    assert names["a"] == names["b"] == names["c"] == before[-1:]


@pytest.mark.parametrize("truncate_fails", [False, True])
def test_a_control_entry_a_full_disk_cut_short_leaves_no_torn_record_before_the_next(tmp_path, monkeypatch,
                                                                                      truncate_fails):
    """The disk fills half-way through a control record (a new term's no-op): the append fails,
    and the next control entry, once there is room, is found when the copy opens again (a torn
    record left in the file hid every entry after it, shifting the index of the messages after).
    When even cutting the torn bytes off fails, the next append rewrites the file first."""
    log = open_log(tmp_path / "a")
    log.append(1, b"")  # term 1's no-op
    real_write = os.write
    calls = []

    def filling_up(fd, data):
        calls.append(fd)
        if len(calls) == 1:
            return real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def refused(fd, length):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "write", filling_up)
    if truncate_fails:
        monkeypatch.setattr(os, "ftruncate", refused)
    with pytest.raises(OSError):
        log.append(2, b"")
    monkeypatch.undo()
    assert (log.last_index, log.last_term) == (1, 1)
    log.append(3, b"")  # room again: term 3's no-op
    log.stream.set_writable(True)
    log.stream.append("", "orders", PROPS, b"after")
    fsync(log)
    assert (log.last_index, log.last_term) == (3, 3)
    log.close()
    reopened = open_log(tmp_path / "a")
    assert (reopened.last_index, reopened.last_term, reopened.term_at(2)) == (3, 3, 3)


def control_file_full(monkeypatch, log: StreamReplicaLog) -> None:
    """Writes to ``log``'s control file fail as on a full disk (ENOSPC) until
    ``monkeypatch.undo()``; the stream's segments are written as before."""
    real_write = os.write

    def full_for_the_control_file(fd, data):
        if fd == log._fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_for_the_control_file)


def test_retention_a_full_disk_keeps_from_being_logged_waits_and_fails_no_commit(tmp_path, monkeypatch):
    """The leader's stream wants segments dropped while its control file cannot be written (a
    full disk): its records still commit and are readable, and retention goes in the log
    at a later step once there is room (not an OSError out of the commit or the append)."""
    group = Group(tmp_path, names=("a", "b"))
    group.connect("b")
    leader_log = group.logs["a"]
    leader_log.set_segment_size(400)
    group.stream.set_retention(1200, None)
    control_file_full(monkeypatch, leader_log)
    for n in range(40):
        group.publish(f"message {n:03d} " + "x" * 40)
        group.leader_fsync()
        group.replicate("b")
    assert len(bodies(leader_log)) == 40 and group.stream.first_offset == 0  # nothing dropped: not logged
    monkeypatch.undo()
    for n in range(40, 45):
        group.publish(f"message {n:03d} " + "x" * 40)
        group.leader_fsync()
        group.replicate("b")
    assert group.stream.first_offset > 0  # logged and applied once the disk had room
    assert segment_files(group.logs["a"]) == segment_files(group.logs["b"])


def test_a_segment_size_a_full_disk_cannot_log_fails_no_role_change(tmp_path, monkeypatch):
    """A replica that starts leading logs the stream's segment size (a CONFIG entry); with its
    control file unwritable (a full disk) the role change still goes through: the stream takes
    publishes and rolls at the size in force, as every copy does, until a later term logs it."""
    log = open_log(tmp_path / "a")
    log.append(1, b"")
    lost: list[ReplicatedStream] = []
    owner = ReplicatedStream(SimpleNamespace(role=Role.FOLLOWER, queue="q"), log, 4096, lost.append,
                             lambda _owner: None, new_group=False)
    control_file_full(monkeypatch, log)
    size = log.stream.max_segment_bytes
    owner.on_role(Role.LEADER)
    assert log.stream.writable and log.stream.max_segment_bytes == size != 4096 and log.last_index == 1
    monkeypatch.undo()
    owner.on_role(Role.FOLLOWER)
    assert lost == [owner] and not log.stream.writable
