"""The replication core's state machines, sans-I/O: leader and followers exchange frames by
hand, fsync is a call the test makes, so every step of the protocol is observable."""

from __future__ import annotations


import pytest

from cluster.replication.election import GroupRecord, Vote, choose_leader
from cluster.replication.entries import encode_entry, scan_entries
from cluster.replication.follower import FollowerReplication
from cluster.replication.leader import LeaderReplication, LeaderRole, NotLeader
from cluster.replication.log import FileReplicaLog
from cluster.replication.queue_log import QueueState, message_payload, state_payload
from cluster.replication.wire import (
    Ack, Append, FrameReader, Hello, Mismatch, ProtocolError, Refuse, encode_append, encode_hello, encode_refuse,
)
from persistence.record_format import MessageState
from tests.replication_by_hand import frame, fsync


class Group:
    """A leader and its followers, each with a log in its own directory; frames move by hand."""

    def __init__(self, tmp_path, names=("a", "b", "c"), term=1, leader="a"):
        self.logs = {n: FileReplicaLog(tmp_path / n) for n in names}
        self.names = names
        self.leader = LeaderReplication(leader, term, self.logs[leader], names)
        self.followers = {n: FollowerReplication(n, "q", self.logs[n]) for n in names if n != leader}

    def connect(self, name):
        assert self.leader.follower_connected(frame(self.followers[name].hello()))

    def replicate(self, name):
        """Send, fsync and acknowledge until the leader has nothing more for ``name``."""
        while True:
            sent = self.leader.outgoing(name)
            if sent is None:
                return
            reply = self.followers[name].on_append(frame(sent))
            if reply is not None:
                self.answer(name, frame(reply))
            self.deliver(name)
            self.sync_and_ack(name)

    def deliver(self, name):
        """Send everything the leader has for ``name``; return the follower's immediate replies."""
        replies = []
        while (data := self.leader.outgoing(name)) is not None:
            reply = self.followers[name].on_append(frame(data))
            if reply is not None:
                replies.append(frame(reply))
                self.answer(name, frame(reply))
        return replies

    def answer(self, name, reply):
        if isinstance(reply, Ack):
            return self.leader.on_ack(name, reply)
        if isinstance(reply, Mismatch):
            self.leader.on_mismatch(name, reply)
        elif isinstance(reply, Refuse):
            self.leader.on_refuse(name, reply)
        return False

    def sync_and_ack(self, name):
        fsync(self.logs[name])
        ack = self.followers[name].ack()
        return self.answer(name, frame(ack)) if ack is not None else False


def test_frames_survive_any_split_and_reject_garbage():
    data = (encode_hello(3, 10, 2, "node-1", "/:q") + encode_append(3, 9, 2, 5, encode_entry(10, 3, b"x")))
    reader = FrameReader()
    frames = []
    for i in range(len(data)):  # one byte at a time
        frames += reader.feed(data[i:i + 1])
    assert frames[0] == Hello(3, 10, 2, "node-1", "/:q")
    assert frames[1] == Append(3, 9, 2, 5, encode_entry(10, 3, b"x"))
    with pytest.raises(ProtocolError):
        FrameReader().feed(b"\xff\xff\xff\xff\x02")  # a 4 GiB frame is refused before buffering it
    with pytest.raises(ProtocolError):
        FrameReader().feed(b"\x00\x00\x00\x02\x63\x00")  # unknown kind


def test_log_keeps_entries_across_reopen_and_drops_a_torn_tail(tmp_path):
    log = FileReplicaLog(tmp_path)
    for n in range(1, 6):
        assert log.append(1, b"entry %d" % n) == n
    log.append(2, b"six")
    fsync(log)
    assert log.durable_index == 6
    log.close()
    with open(sorted(tmp_path.glob("segment-*.log"))[-1], "ab") as f:
        f.write(encode_entry(7, 2, b"seven")[:-3])  # a write torn by a crash
    reopened = FileReplicaLog(tmp_path)
    assert (reopened.last_index, reopened.last_term, reopened.durable_index) == (6, 2, 6)
    assert [bytes(p) for _, _, p in reopened.entries()] == [b"entry 1", b"entry 2", b"entry 3", b"entry 4",
                                                          b"entry 5", b"six"]
    assert reopened.promised_term == 2  # never below the last entry's term
    assert reopened.first_index_of_term(2) == 6
    reopened.append(2, b"seven")
    assert reopened.last_index == 7


def test_truncation_lowers_the_durable_index_and_survives_reopen(tmp_path):
    log = FileReplicaLog(tmp_path)
    for n in range(5):
        log.append(1, b"%d" % n)
    fsync(log)
    log.truncate_after(3)
    assert (log.last_index, log.durable_index) == (3, 3)
    log.append(2, b"new")
    assert log.durable_index == 3  # the new entry 4 is not fsynced yet
    fsync(log)
    log.close()
    reopened = FileReplicaLog(tmp_path)
    assert [(i, t, bytes(p)) for i, t, p in reopened.entries(3)] == [(3, 1, b"2"), (4, 2, b"new")]


def test_promise_is_durable(tmp_path):
    log = FileReplicaLog(tmp_path)
    log.promise(7)
    log.close()
    assert FileReplicaLog(tmp_path).promised_term == 7


def test_commit_waits_for_a_majority_of_fsyncs_leader_included(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.connect("c")
    index = group.leader.append(b"m1")
    fsync(group.logs["a"])
    assert not group.leader.local_synced() and group.leader.commit_index == 0  # leader alone: 1 of 3
    group.deliver("b")
    group.deliver("c")
    assert group.followers["b"].ack() is None  # received, not fsynced: nothing to acknowledge
    assert group.leader.commit_index == 0
    assert group.sync_and_ack("b")  # leader + b: a majority
    assert group.leader.commit_index == index


def test_followers_fsync_alone_does_not_commit_without_the_leaders_unless_majority(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.connect("c")
    index = group.leader.append(b"m1")
    group.deliver("b")
    group.deliver("c")
    assert not group.sync_and_ack("b")  # b alone: 1 of 3 (the leader has not fsynced)
    assert group.sync_and_ack("c")  # b + c: a majority even before the leader's own fsync
    assert group.leader.commit_index == index


def test_a_stale_leader_is_refused_and_can_never_commit(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    group.connect("c")
    group.leader.append(b"m1")
    group.logs["b"].promise(2)  # b and c voted in an election for term 2
    group.logs["c"].promise(2)
    fsync(group.logs["a"])
    group.leader.local_synced()
    assert group.deliver("b") == [Refuse(2)]
    assert group.leader.role is LeaderRole.STEPPED_DOWN
    assert group.leader.commit_index == 0
    with pytest.raises(NotLeader):
        group.leader.append(b"m2")
    group.followers["c"].on_append(Append(1, 0, 0, 0, encode_entry(1, 1, b"late")))
    assert group.logs["c"].last_index == 0  # the follower did not take it
    assert not group.leader.on_ack("c", Ack(1, 1)) and group.leader.commit_index == 0


def test_follower_truncates_a_suffix_the_new_leader_does_not_have(tmp_path):
    logs = {n: FileReplicaLog(tmp_path / n) for n in "abc"}
    for n in "abc":  # entries 1-3 of term 1 everywhere
        for k in range(3):
            logs[n].append(1, b"common %d" % k)
        fsync(logs[n])
    for k in range(4):  # the old leader b wrote 4 more that only it has, then died
        logs["b"].append(1, b"lost %d" % k)
    fsync(logs["b"])
    leader = LeaderReplication("a", 2, logs["a"], "abc")
    leader.start_term()  # index 4, term 2
    leader.append(b"new")  # index 5
    follower = FollowerReplication("b", "q", logs["b"])
    assert leader.follower_connected(frame(follower.hello()))
    for _ in range(5):
        data = leader.outgoing("b")
        if data is None:
            break
        reply = follower.on_append(frame(data))
        if reply is not None:
            leader.on_mismatch("b", frame(reply))
    fsync(logs["b"])
    assert leader.on_ack("b", frame(follower.ack())) is False  # a's own fsync is still missing
    assert [(t, bytes(p)) for _, t, p in logs["b"].entries()] == [
        (1, b"common 0"), (1, b"common 1"), (1, b"common 2"), (2, b""), (2, b"new")]
    fsync(logs["a"])
    assert leader.local_synced() and leader.commit_index == 5


def test_a_new_or_wiped_member_gets_the_whole_log_and_joins_the_in_sync_set_when_caught_up(tmp_path):
    group = Group(tmp_path)
    group.connect("b")
    for k in range(2000):
        group.leader.append(b"x" * 1000 + b"%d" % k)
    fsync(group.logs["a"])
    group.replicate("b")
    assert group.leader.commit_index == 2000
    assert group.leader.in_sync_members() == ["a", "b"]
    group.connect("c")  # c has nothing
    first = group.leader.outgoing("c")
    group.followers["c"].on_append(frame(first))
    fsync(group.logs["c"])
    group.answer("c", frame(group.followers["c"].ack()))
    assert group.leader.in_sync_members() == ["a", "b"]  # one batch in: not caught up yet
    group.replicate("c")
    assert group.logs["c"].last_index == 2000
    assert group.leader.in_sync_members() == ["a", "b", "c"]
    group.leader.follower_lost("c")
    assert group.leader.in_sync_members() == ["a", "b"]


def test_an_ack_never_vouches_for_an_unchecked_stale_suffix(tmp_path):
    logs = {n: FileReplicaLog(tmp_path / n) for n in "ab"}
    for n in "ab":
        logs[n].append(1, b"common")
    logs["b"].append(1, b"stale")  # b has an extra entry the new leader a never had
    fsync(logs["a"])
    fsync(logs["b"])
    follower = FollowerReplication("b", "q", logs["b"])
    # The new leader's heartbeat-like APPEND with no entries, prev = index 1: verified up to 1 only.
    assert follower.on_append(Append(2, 1, 1, 0, b"")) is None
    fsync(logs["b"])
    assert frame(follower.ack()) == Ack(2, 1)


def test_election_needs_a_majority_of_votes_and_picks_the_most_complete_log():
    record = GroupRecord("/:q", 4, "a", "", ("a", "b", "c"), ("a", "b"))
    assert choose_leader([Vote("b", 4, 10)], record) is None
    assert choose_leader([Vote("b", 4, 10), Vote("c", 4, 12)], record) == "c"
    assert choose_leader([Vote("b", 4, 10), Vote("c", 3, 50)], record) == "b"  # a newer term wins
    assert choose_leader([Vote("b", 4, 10), Vote("c", 4, 10)], record) == "b"  # tie: the in-sync member
    assert choose_leader([Vote("b", 4, 10), Vote("x", 9, 99)], record) is None  # not a member


def test_queue_state_after_failover_returns_held_messages_with_a_higher_delivery_count():
    payloads = [message_payload(seq, 0, "", "q", b"", b"body %d" % seq) for seq in (1, 2, 3, 4)]
    payloads += [state_payload(1, MessageState.DELIVERED, 0, delivery_count=0),
                 state_payload(1, MessageState.ACKED, 0),
                 state_payload(2, MessageState.DELIVERED, 0, delivery_count=0),
                 state_payload(3, MessageState.DELIVERED, 0, delivery_count=2), b""]
    state = QueueState.rebuild(payloads)
    assert state.held_at_failover() == [(2, 1), (3, 3)]
    assert state.next_ready() == 4 and state.next_seq == 5
    for seq, count in state.held_at_failover():
        state.apply(state_payload(seq, MessageState.REQUEUED, 0, delivery_count=count))
    assert state.next_ready() == 2  # back at its original position
    assert 1 not in state.messages


def test_scan_refuses_entries_out_of_order():
    data = encode_entry(1, 1, b"a") + encode_entry(3, 1, b"c")
    heads, end = scan_entries(data, 1, stop_at_damage=True)
    assert [h.index for h in heads] == [1] and end == len(encode_entry(1, 1, b"a"))


def test_a_follower_far_behind_on_a_long_log_still_gets_entries(tmp_path):
    """The in-flight window counts from where the follower's log is, not from index 0."""
    logs = {n: FileReplicaLog(tmp_path / n) for n in "ab"}
    for n in "ab":
        for k in range(70_000):
            logs[n].append(1, b"")
        fsync(logs[n])
    leader = LeaderReplication("a", 2, logs["a"], "ab")
    leader.start_term()
    fsync(logs["a"])
    assert not leader.local_synced()  # one of two is not a majority
    follower = FollowerReplication("b", "q", logs["b"])
    assert leader.follower_connected(frame(follower.hello()))
    sent = leader.outgoing("b")
    assert sent is not None
    assert follower.on_append(frame(sent)) is None
    fsync(logs["b"])
    assert leader.on_ack("b", frame(follower.ack()))
    assert leader.commit_index == 70_001


def test_check_quorum_a_leader_that_hears_no_majority_has_no_quorum(tmp_path):
    """Check-quorum, sans-I/O: the heartbeat is an empty APPEND each follower answers at once
    with an ACK; a leader that heard from fewer than a majority within the interval has no
    quorum (the shell then steps down and gives up its lease)."""
    logs = {n: FileReplicaLog(tmp_path / n) for n in "abc"}
    leader = LeaderReplication("a", 1, logs["a"], "abc", now=100.0)
    followers = {n: FollowerReplication(n, "q", logs[n]) for n in "bc"}
    leader.start_term()
    fsync(logs["a"])
    assert leader.has_quorum(101.0, 2.0)  # the term's start counts as heard: time to connect
    assert not leader.has_quorum(102.5, 2.0)  # nobody heard since
    for name, follower in followers.items():
        assert leader.follower_connected(frame(follower.hello()))
        leader.heard_from(name, 102.6)
        while (data := leader.outgoing(name)) is not None:
            follower.on_append(frame(data))
        fsync(logs[name])
        leader.on_ack(name, frame(follower.ack()))
    assert leader.has_quorum(103.0, 2.0) and leader.commit_index == 1
    # A heartbeat brings nothing to fsync: answered at once, repeating the last ACK.
    beat = leader.heartbeat("b")
    assert beat is not None and frame(beat).entries == b""
    assert followers["b"].on_append(frame(beat)) is None
    assert followers["b"].ack() is None  # nothing new fsynced...
    answer = followers["b"].answer_heartbeat()
    assert answer is not None and frame(answer).index == 1  # ...but the heartbeat is owed an answer
    assert followers["b"].answer_heartbeat() is None  # once
    leader.heard_from("b", 104.0)
    assert leader.has_quorum(105.5, 2.0)  # b (with a itself) is a majority
    assert not leader.has_quorum(106.5, 2.0)  # then b went silent too: no majority heard
    leader.on_refuse("c", frame(encode_refuse(5)))
    assert not leader.has_quorum(104.1, 2.0)  # a stepped-down leader has none


def test_a_leader_cut_off_loses_only_what_no_majority_had_and_the_new_leader_has_every_commit(tmp_path):
    """The partition the issue measured, sans-I/O: leader a commits entries 1-3 with b, then is
    cut off and appends 4-6 that nobody else gets; it steps down (check-quorum) and abstains; b
    and c vote: the winner has every committed entry; a, healed, follows it and loses only 4-6."""
    logs = {n: FileReplicaLog(tmp_path / n) for n in "abc"}
    old = LeaderReplication("a", 1, logs["a"], "abc")
    old.start_term()
    old.append(b"one")
    old.append(b"two")
    to_b = FollowerReplication("b", "q", logs["b"])
    assert old.follower_connected(frame(to_b.hello()))
    while (data := old.outgoing("b")) is not None:
        to_b.on_append(frame(data))
    fsync(logs["a"])
    fsync(logs["b"])
    old.on_ack("b", frame(to_b.ack()))
    assert old.commit_index == 3  # confirmed: a and b have it
    for k in range(3):
        old.append(b"cut off %d" % k)  # 4-6: never on a majority, never confirmed
    fsync(logs["a"])
    assert old.commit_index == 3
    record = GroupRecord("q", 1, "a", "", ("a", "b", "c"), ("a", "b"))
    # a abstains (it stepped down for want of a quorum): only b and c vote.
    votes = [Vote(n, logs[n].last_term, logs[n].last_index) for n in "bc"]
    winner = choose_leader(votes, record)
    assert winner == "b" and logs[winner].last_index >= old.commit_index
    # Had a voted with its longer log it would have won, and still reached nobody.
    assert choose_leader(votes + [Vote("a", 1, logs["a"].last_index)], record) == "a"
    new = LeaderReplication("b", 2, logs["b"], "abc")
    new.start_term()
    back = FollowerReplication("a", "q", logs["a"])
    assert new.follower_connected(frame(back.hello()))
    for _ in range(10):
        data = new.outgoing("a")
        if data is None:
            break
        reply = back.on_append(frame(data))
        if reply is not None:
            new.on_mismatch("a", frame(reply))
    assert [bytes(p) for _, _, p in logs["a"].entries()] == [b"", b"one", b"two", b""]
