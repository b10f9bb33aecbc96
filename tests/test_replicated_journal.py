"""The replicated queue's journal (cluster/replication/replicated_journal.py) on a real replica log and
queue store, with the replica's commits and role changes driven by hand:

- a confirm (request_sync) waits for the replica's commit index to cover every record so far,
  never for the local fsync alone;
- records made before the replica leads go to its log in order when it does;
- a replica that stops leading fails what waits (the publisher gets a nack) and everything after;
- a new leader rebuilds the queue from the log: ready messages in order, the ones a consumer held
  requeued with their delivery count, acked ones gone;
- a replicated queue keeps every message, transient ones (delivery_mode 1) too, as a RabbitMQ
  quorum queue does: its confirm waits for the majority and a new leader has it back;
- a state record the local disk refuses still goes to the replica log (what a failover reads),
  and marks the journal failed; one for a message already settled goes nowhere;
- a message a consumer received (taken from the queue, or offered as it was published) is on
  a new leader and comes back with redelivered=true and its delivery count up, even when the
  old leader died before its `delivered` record was committed: the new leader knows only
  what was committed; a message no consumer had room for comes back untouched.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest

from cluster.replication.replicated_journal import NotReplicated, ReplicatedJournal
from cluster.replication.log import FileReplicaLog
from cluster.replication.queue_log import QueueReplicaLog
from cluster.replication.queue_log import Held, QueueState
from cluster.replication.replica import Role
from persistence.queue_store import QueueStore
from queues.message import Message, QueueEntry, content_header
from queues.publish_outcome import ENQUEUED_DURABLY
from queues.consumer import Consumer
from queues.queue import Queue

PERSISTENT_PROPERTIES = b"\x10\x00\x02"  # property flags: delivery-mode; delivery-mode 2
TRANSIENT_PROPERTIES = b"\x10\x00\x01"  # property flags: delivery-mode; delivery-mode 1


class _Replica:
    """What the journal uses of a QueueReplica: its role, its log and `publish`."""

    def __init__(self, directory: Path, role: Role = Role.LEADER) -> None:
        self.queue = '["/","q"]'
        self.role = role
        self.log = QueueReplicaLog(directory)

    def publish(self, payload: bytes) -> int:
        assert self.role is Role.LEADER
        return self.log.append(1, payload)


def _journal(tmp_path: Path, replica: _Replica, lost: list | None = None, *, recover: bool = True) -> ReplicatedJournal:
    def open_store() -> QueueStore:
        return QueueStore.for_queue(tmp_path / "data", "/", "q")

    journal = ReplicatedJournal(open_store(), None, replica, open_store,  # type: ignore[arg-type]
                                (lost if lost is not None else []).append, lambda journal: None)
    if recover:
        journal.recover()
    return journal


def _entry(seq: int, body: bytes) -> QueueEntry:
    return QueueEntry(Message("", "q", content_header(len(body), PERSISTENT_PROPERTIES), body), seq)


async def _test_a_confirm_waits_for_the_commit_index_not_for_the_local_disk(tmp_path):
    replica = _Replica(tmp_path / "log")
    journal = _journal(tmp_path, replica)
    outcomes: list = []
    assert journal.published(_entry(1, b"one"))
    journal.request_sync(outcomes.append)
    assert journal.published(_entry(2, b"two"))
    journal.request_sync(outcomes.append)
    journal.store.flush()
    await asyncio.sleep(0.01)
    assert outcomes == []  # written locally: not enough
    journal.on_commit(1)
    assert outcomes == [None]  # the first confirm only
    journal.on_commit(2)
    assert outcomes == [None, None]
    states = QueueState.rebuild(payload for _, _, payload in replica.log.entries())
    assert [states.messages[s].body for s in sorted(states.messages)] == [b"one", b"two"]


async def _test_records_made_before_the_replica_leads_go_to_its_log_in_order_when_it_does(tmp_path):
    replica = _Replica(tmp_path / "log", Role.FOLLOWER)
    journal = _journal(tmp_path, replica)
    outcomes: list = []
    first = _entry(1, b"early")
    journal.published(first)
    first.delivery_count = 1
    journal.delivered(first)
    journal.request_sync(outcomes.append)
    assert replica.log.last_index == 0
    replica.role = Role.LEADER
    journal.on_role(Role.LEADER)
    assert replica.log.last_index == 2
    journal.on_commit(1)
    assert outcomes == []  # the delivered record is not committed yet
    journal.on_commit(2)
    assert outcomes == [None]


async def _test_a_replica_that_stops_leading_fails_what_waits_and_what_comes_after(tmp_path):
    replica = _Replica(tmp_path / "log")
    lost: list = []
    journal = _journal(tmp_path, replica, lost)
    outcomes: list = []
    journal.published(_entry(1, b"one"))
    journal.request_sync(outcomes.append)
    replica.role = Role.FOLLOWER
    journal.on_role(Role.FOLLOWER)
    assert len(outcomes) == 1 and isinstance(outcomes[0], NotReplicated)
    assert lost == [journal]
    journal.on_commit(5)  # a late commit report changes nothing
    journal.request_sync(outcomes.append)
    await asyncio.sleep(0.01)
    assert len(outcomes) == 2 and isinstance(outcomes[1], NotReplicated)


async def _test_a_new_leader_rebuilds_the_queue_from_the_log(tmp_path, held_count):
    old = _Replica(tmp_path / "log")
    journal = _journal(tmp_path / "old", old)
    entries = [_entry(seq, f"m{seq}".encode()) for seq in range(1, 6)]
    for entry in entries:
        journal.published(entry)
    entries[0].delivery_count = 1
    journal.delivered(entries[0])
    journal.acked(entries[0])  # settled: gone for good
    entries[2].delivery_count = held_count
    journal.delivered(entries[2])  # held by a consumer when the leader went
    old.log.flush()

    new = _Replica(tmp_path / "log")  # the same log, as a follower holds it, now leading
    taken = _journal(tmp_path / "new", new)
    rows = list(QueueStore.for_queue(tmp_path / "new" / "data", "/", "q").recover().rows())
    assert [(seq, count) for seq, count, *_ in rows] == [(2, 0), (3, held_count), (4, 0), (5, 0)]
    message = taken.load_message(3)
    assert message is not None and message.body == b"m3"
    # The hand-back is replicated too: a later failover sees the message ready again.
    state = QueueState.rebuild(payload for _, _, payload in new.log.entries())
    assert state.next_ready() == 2 and state.delivery_count[3] == held_count


async def _test_a_transient_message_is_replicated_and_comes_back_on_the_new_leader(tmp_path):
    old = _Replica(tmp_path / "log")
    queue = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "old", old))
    message = Message("", "q", content_header(len(b"transient"), TRANSIENT_PROPERTIES), b"transient")
    assert not message.is_persistent
    assert queue.publish(message) == ENQUEUED_DURABLY  # its confirm waits for the replicas
    outcomes: list = []
    queue.when_stored(outcomes.append)
    await asyncio.sleep(0.01)
    assert outcomes == []  # not confirmed before a majority has it
    queue.journal.on_commit(old.log.last_index)
    assert outcomes == [None]
    old.log.flush()

    new = _Replica(tmp_path / "log")  # the old leader died; a follower with the same log leads
    taken = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "new", new, recover=False))
    assert taken.recover() == 1
    entry = taken.get(no_ack=False)
    assert entry is not None and entry.message.body == b"transient"
    assert not entry.message.is_persistent  # it keeps its properties, delivery_mode 1 included


def test_a_transient_message_is_replicated_and_comes_back_on_the_new_leader(tmp_path):
    asyncio.run(_test_a_transient_message_is_replicated_and_comes_back_on_the_new_leader(tmp_path))


def test_a_confirm_waits_for_the_commit_index_not_for_the_local_disk(tmp_path):
    asyncio.run(_test_a_confirm_waits_for_the_commit_index_not_for_the_local_disk(tmp_path))


def test_records_made_before_the_replica_leads_go_to_its_log_in_order_when_it_does(tmp_path):
    asyncio.run(_test_records_made_before_the_replica_leads_go_to_its_log_in_order_when_it_does(tmp_path))


def test_a_replica_that_stops_leading_fails_what_waits_and_what_comes_after(tmp_path):
    asyncio.run(_test_a_replica_that_stops_leading_fails_what_waits_and_what_comes_after(tmp_path))


@pytest.mark.parametrize("held_count", [1, 3])
def test_a_new_leader_rebuilds_the_queue_from_the_log(tmp_path, held_count):
    asyncio.run(_test_a_new_leader_rebuilds_the_queue_from_the_log(tmp_path, held_count))


def _no_space(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_state_record_the_local_disk_refuses_is_still_replicated(tmp_path, monkeypatch):
    replica = _Replica(tmp_path / "log")
    journal = _journal(tmp_path, replica)
    entry = _entry(1, b"one")
    assert journal.published(entry)
    entry.delivery_count = 1
    with monkeypatch.context() as patch:
        patch.setattr(journal.store, "append_state", _no_space)
        journal.delivered(entry)
    assert journal.failure is not None and journal.failure.errno == errno.ENOSPC
    state = QueueState.rebuild(payload for _, _, payload in replica.log.entries())
    assert (state.held[1], state.delivery_count[1]) == (Held.DELIVERED, 1)
    journal.acked(entry)
    assert replica.log.last_index == 3
    journal.acked(entry)  # settled already: the store records nothing, and the log gets nothing
    assert replica.log.last_index == 3


class _Sink:
    """A consumer's channel: takes every delivery, and remembers the bodies it was sent and
    the commit index when the last one went out (`committed_then`)."""

    def __init__(self, commit_index: list[int]) -> None:
        self.received: list[bytes] = []
        self._commit_index = commit_index
        self.committed_then = 0

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        self.received.append(entry.message.body)
        self.committed_then = self._commit_index[0]

    def consumer_cancelled(self, consumer: Consumer) -> None:
        pass


def _committed_prefix(log: FileReplicaLog, commit_index: int, directory: Path) -> _Replica:
    """A new leader's replica holding the old leader's log up to `commit_index` only: the
    records after it were on the old leader alone when it died."""
    replica = _Replica(directory)
    for index, term, payload in log.entries():
        if index <= commit_index:
            replica.log.append(term, bytes(payload))
    replica.log.flush()
    return replica


async def _test_a_message_a_consumer_received_comes_back_redelivered_whatever_was_committed(tmp_path,
                                                                                             consumer_first):
    old = _Replica(tmp_path / "log")
    queue = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "old", old))
    commit_index = [0]

    def commit_all() -> None:
        commit_index[0] = old.log.last_index
        queue.journal.on_commit(commit_index[0])

    sink = _Sink(commit_index)
    consumer = Consumer("c", queue, sink, no_ack=False, prefetch_count=2)
    if consumer_first:  # each message is offered to it as it is published
        queue.add_consumer(consumer)
    for number in range(3):
        queue.publish(Message("", "q", content_header(2, PERSISTENT_PROPERTIES), f"m{number}".encode()))
    commit_all()  # the three messages are confirmed
    if not consumer_first:  # they wait in the queue, and it takes them from there
        queue.add_consumer(consumer)
    # The commit index moves only when the test says so, until the consumer has what it has
    # room for; the old leader then dies with only what was committed when the last delivery
    # went out: the records logged after that (the `delivered` ones among them) were on it alone.
    for _ in range(5):
        if len(sink.received) == 2:
            break
        commit_all()
    assert sink.received == [b"m0", b"m1"]
    old.log.flush()
    new = _committed_prefix(old.log, sink.committed_then, tmp_path / "new-log")
    taken = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "new", new, recover=False))
    # (Without the delivery horizon, a consumer there before the publishes got m0 and m1 before
    # even their own records were committed: the new leader had none of them.)
    assert taken.recover() == 3
    back = {}
    while (entry := taken.get(no_ack=True)) is not None:
        back[entry.message.body] = entry.delivery_count
    assert set(back) == {b"m0", b"m1", b"m2"}
    # What the consumer saw comes back redelivered, its delivery count up (before the change
    # the old leader sent m0 and m1 before their `delivered` records were committed, and the
    # new leader gave them back as never delivered: count 0, redelivered=false).
    assert back[b"m0"] == back[b"m1"] == 1, back
    assert back[b"m2"] == 0, "no consumer had room for it: it comes back as never delivered"


@pytest.mark.parametrize("consumer_first", [False, True])
def test_a_message_a_consumer_received_comes_back_redelivered_whatever_was_committed(tmp_path, consumer_first):
    asyncio.run(_test_a_message_a_consumer_received_comes_back_redelivered_whatever_was_committed(
        tmp_path, consumer_first))


async def _test_what_a_consumer_without_a_prefetch_limit_received_comes_back_redelivered(tmp_path, no_ack):
    """A consumer without a prefetch limit (with acks, or no-ack: its deliveries are journaled
    as settled) takes every message the horizon lets through; the old leader dies with only
    what was committed when its last delivery went out: each message it received comes back
    redelivered (its `delivered`/`acked` record was on the old leader alone), none is lost."""
    old = _Replica(tmp_path / "log")
    queue = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "old", old))
    commit_index = [0]
    sink = _Sink(commit_index)
    queue.add_consumer(Consumer("c", queue, sink, no_ack=no_ack, prefetch_count=0))
    for number in range(3):
        queue.publish(Message("", "q", content_header(2, PERSISTENT_PROPERTIES), f"m{number}".encode()))
    assert sink.received == [], "delivered before a committed horizon covered it"
    for _ in range(5):
        if len(sink.received) == 3:
            break
        commit_index[0] = old.log.last_index
        queue.journal.on_commit(commit_index[0])
    assert sink.received == [b"m0", b"m1", b"m2"]
    old.log.flush()
    new = _committed_prefix(old.log, sink.committed_then, tmp_path / "new-log")
    taken = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "new", new, recover=False))
    back = {}
    assert taken.recover() == (2 if no_ack else 3)
    while (entry := taken.get(no_ack=True)) is not None:
        back[entry.message.body] = entry.delivery_count
    if no_ack:
        # m0 went alone under the first horizon; its no-ack settlement was committed with the
        # horizon that let m1 and m2 go, so it is gone for good, as the client had it.
        assert back == {b"m1": 1, b"m2": 1}
    else:
        assert back == {b"m0": 1, b"m1": 1, b"m2": 1}


@pytest.mark.parametrize("no_ack", [False, True])
def test_what_a_consumer_without_a_prefetch_limit_received_comes_back_redelivered(tmp_path, no_ack):
    asyncio.run(_test_what_a_consumer_without_a_prefetch_limit_received_comes_back_redelivered(tmp_path, no_ack))


async def _test_a_get_ok_waits_for_its_delivered_record_and_a_new_leader_gives_it_back_redelivered(tmp_path):
    """basic.get: the get-ok waits (`delivery_wait`) until the `delivered` record of the message
    it carries is committed; once it is, a new leader has the message as held and gives it
    back redelivered with its delivery count up."""
    old = _Replica(tmp_path / "log")
    queue = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "old", old))
    queue.publish(Message("", "q", content_header(2, PERSISTENT_PROPERTIES), b"m0"))
    entry = queue.get(no_ack=False)
    assert entry is not None
    queue.after_get(entry)
    delivered_at = old.log.last_index
    sent: list = []
    queue.journal.delivery_wait(sent.append)
    queue.journal.on_commit(delivered_at - 1)
    assert sent == [], "the get-ok left before its delivered record was committed"
    queue.journal.on_commit(delivered_at)
    assert sent == [None]
    old.log.flush()
    new = _committed_prefix(old.log, delivered_at, tmp_path / "new-log")
    taken = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "new", new, recover=False))
    assert taken.recover() == 1
    again = taken.get(no_ack=True)
    assert again is not None and again.message.body == b"m0" and again.delivery_count == 1


def test_a_get_ok_waits_for_its_delivered_record_and_a_new_leader_gives_it_back_redelivered(tmp_path):
    asyncio.run(_test_a_get_ok_waits_for_its_delivered_record_and_a_new_leader_gives_it_back_redelivered(tmp_path))


def _horizon_records(log: FileReplicaLog) -> int:
    return sum(1 for _, _, payload in log.entries() if bytes(payload[:4]) == b"\0\0\0\0" and len(payload) == 12)


async def _test_horizons_are_one_record_per_batch_and_none_while_the_queue_is_idle(tmp_path):
    replica = _Replica(tmp_path / "log")
    queue = Queue("q", "/", durable=True, arguments={"x-queue-type": "quorum"},
                  journal=_journal(tmp_path / "q", replica))
    sink = _Sink([0])
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False, prefetch_count=0))
    for number in range(1000):
        queue.publish(Message("", "q", content_header(2, PERSISTENT_PROPERTIES), b"%d" % number))
    for _ in range(100):
        if len(sink.received) == 1000:
            break
        queue.journal.on_commit(replica.log.last_index)
    assert len(sink.received) == 1000
    batches = _horizon_records(replica.log)
    assert batches <= 1000 // 64, f"{batches} horizon records for 1000 deliveries"
    # Idle, its consumer still there: dispatching and commits append nothing more.
    idle_from = replica.log.last_index
    for _ in range(50):
        queue.dispatch()
        queue.journal.on_commit(replica.log.last_index)
    assert replica.log.last_index == idle_from


def test_horizons_are_one_record_per_batch_and_none_while_the_queue_is_idle(tmp_path):
    asyncio.run(_test_horizons_are_one_record_per_batch_and_none_while_the_queue_is_idle(tmp_path))
