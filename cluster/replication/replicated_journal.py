"""The journal of a replicated queue (a durable quorum queue on a clustered broker).

It is a `QueueJournal` whose every record also goes, as the same segment record
(docs/queue-files.md §3), to the queue's replica log (cluster/replication/), and whose
`request_sync` calls back only once the replica's commit index (a majority of the group, leader
included, fsynced) covers everything journaled so far. The queue's local segment files are kept
as on any durable queue (a message paged out is read back from them), but nothing waits for
their fsync: the replica log is what survives.

The journal serves only on the replica's leader. Records made before its replica has become
leader (just after the declaration, while the group takes its first term) wait in memory and go
to the log in order when it does; a journal whose replica stops leading fails every pending
sync (the publishers get basic.nack: nothing unreplicated is confirmed) and its queue is handed
over (cluster/replication/replicated_queues.py).

Deliveries wait for replication too, in batches, as a quorum queue's deliveries are effects
of committed commands: the queue delivers a message only once a **delivery horizon** covering
its seq (a log record, cluster/replication/queue_log.py) is committed. A horizon reaches
HORIZON_AHEAD past the message being delivered, but never past the last message published
(so a message is delivered only once its own record is committed, like its confirm); one
horizon is on its way at a time, and the next is appended when deliveries pass the middle of
the committed one. One small record per batch, no task, future or closure per message
(`may_deliver`, `deliver_check_above`). A basic.get-ok waits for its own `delivered` record
to be committed (`delivery_wait`).

At a leader change the new leader builds the queue from its log (`recover`): the messages not
settled, in publish order; those a consumer held at the failover come back with a `requeued`
record carrying their delivery count, so they are delivered again with `redelivered=true` and
a higher x-delivery-count, as a requeue would deliver them. So do the ready messages at or
below the last delivery horizon: the old leader may have delivered them in its last instant
with their `delivered` record not on a majority yet (it could not deliver any above: their
horizon was not committed, and the new leader holds every committed record).

Imported only on a clustered broker.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.replication.queue_log import Held, QueueReplicaLog, horizon_payload
from cluster.replication.replica import QueueReplica, Role
from persistence.group_commit import GroupCommitter
from persistence.queue_store import QueueStore
from persistence.record_format import MessageState, Reason, encode_message, encode_state
from queues.journal import DeliveringQueue, JournalRecovery, QueueJournal, SyncCallback
from queues.message import CONTENT_HEADER_PREFIX_SIZE, QueueEntry

if TYPE_CHECKING:
    from queues.queue import Queue

log = logging.getLogger(__name__)

# The highest sequence number a record may carry: a purge record settles every ready message up to it.
_MAX_SEQ = (1 << 63) - 1
# How far past the message being delivered a delivery horizon may reach, for consumers without
# a prefetch limit (with one, it reaches as far as their free prefetch): at a failover, ready
# messages up to the horizon come back marked redelivered, delivered or not.
HORIZON_AHEAD = 256


class NotReplicated(OSError):
    """The replica stopped leading before the record reached a majority."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReplicatedJournal(QueueJournal):
    """See the module docstring. ``reopen()`` opens the queue's local store afresh (same
    options); ``on_lost(journal)`` is called when the replica stops leading, ``on_deleted(journal)``
    when the queue is deleted (not when it is handed over to another node: `hand_over`)."""

    # Every message, whatever its delivery_mode, is journaled and replicated, so a transient
    # message confirmed on a quorum queue survives the leader's loss as on RabbitMQ.
    keeps_transient = True

    def __init__(self, store: QueueStore, committer: GroupCommitter, replica: QueueReplica,
                 reopen: Callable[[], QueueStore], on_lost: Callable[["ReplicatedJournal"], None],
                 on_deleted: Callable[["ReplicatedJournal"], None]) -> None:
        super().__init__(store, committer)
        self.replica = replica
        self._reopen = reopen
        self._on_lost = on_lost
        self._on_deleted = on_deleted
        self._leading = replica.role is Role.LEADER
        self._unsent: list[bytes] = []  # records made before the replica led
        self._unplaced: list[SyncCallback] = []  # sync requests made before the replica led
        self._waiting: deque[tuple[int, SyncCallback]] = deque()  # (log index, callback)
        self._commit_index = 0
        self._handing_over = False
        self._lost = False  # it led and stopped: nothing it is given from now on is replicated
        # The delivery horizon (module docstring): deliverable up to `_deliverable` (committed);
        # `_horizon` the highest appended, at log index `_horizon_index` (0: none on its way);
        # `_resume` dispatches the queue again once a horizon it waits for is committed.
        self.deliver_check_above = 0
        self._deliverable = 0
        self._horizon = 0
        self._horizon_index = 0
        self._horizon_early = 0  # past this seq (in the committed horizon) the next one is appended
        self._resume: Callable[[], None] | None = None
        self._last_published = 0  # the highest seq published: no horizon reaches past it

    # -- the replica's reports (ReplicaManager.own) ---------------------------------------------

    def on_commit(self, index: int) -> None:
        self._commit_index = index
        waiting = self._waiting
        while waiting and waiting[0][0] <= index:
            waiting.popleft()[1](None)
        if self._horizon_index and index >= self._horizon_index:
            self._horizon_index = 0
            self._deliverable = self._horizon
            self.deliver_check_above = self._horizon_early
            resume, self._resume = self._resume, None
            if resume is not None:
                resume()

    def on_role(self, role: Role) -> None:
        if role is Role.LEADER:
            if self._leading:
                return
            self._leading = True
            unsent, self._unsent = self._unsent, []
            for payload in unsent:
                self.replica.publish(payload)
            unplaced, self._unplaced = self._unplaced, []
            index = self.replica.log.last_index
            self._waiting.extend((index, callback) for callback in unplaced)
            resume, self._resume = self._resume, None
            if resume is not None:  # deliveries waited for the replica to lead
                resume()
            return
        was_leading, self._leading = self._leading, False
        self._fail_pending()
        if was_leading:
            self._lost = True
            self._on_lost(self)

    def _fail_pending(self) -> None:
        failed = [callback for _, callback in self._waiting] + self._unplaced
        self._waiting.clear()
        self._unplaced = []
        error = NotReplicated(f"the replica of {self.store.queue!r} stopped leading before a majority stored it")
        for callback in failed:
            callback(error)

    @property
    def leading(self) -> bool:
        return self._leading

    # -- deliveries -----------------------------------------------------------------------------

    def may_deliver(self, seq: int, queue: "DeliveringQueue") -> bool:
        """Message `seq` may be delivered once a committed delivery horizon covers it. Near the
        end of the committed horizon the next one is appended, before it is needed."""
        if seq <= self._deliverable:
            self._extend(seq, queue)
            return True
        self._resume = queue.dispatch
        self._extend(seq, queue)
        return False

    def _extend(self, seq: int, queue: "DeliveringQueue") -> None:
        """Append a horizon from `seq` on covering what the queue's consumers have room for
        (their free prefetch; HORIZON_AHEAD for consumers without a limit), never past the last
        message published, unless one is on its way; until it is committed, messages past the
        committed one wait."""
        self.deliver_check_above = self._deliverable
        if not self._leading or self._lost or self._horizon_index:
            return  # (not leading yet: on_role resumes the queue, which asks again)
        room = queue.delivery_room()
        reach = HORIZON_AHEAD if room is None else max(1, room)
        horizon = min(seq - 1 + reach, max(self._last_published, seq))
        if horizon > self._horizon:
            self._horizon = horizon
            self._horizon_early = horizon - reach // 2
            self._horizon_index = self.replica.publish(horizon_payload(horizon))

    def delivery_wait(self, callback: SyncCallback) -> None:
        """Call `callback(error)` once the records journaled so far (a basic.get's `delivered`
        among them) are committed: a get-ok waits for it."""
        self.request_sync(callback)

    # -- records ------------------------------------------------------------------------------------

    def _replicate(self, payload: bytes) -> None:
        if self._leading:
            self.replica.publish(payload)
        else:
            self._unsent.append(payload)

    def published(self, entry: QueueEntry) -> bool:
        if not super().published(entry):
            return False
        if entry.seq > self._last_published:
            self._last_published = entry.seq
        message = entry.message
        head, body = encode_message(entry.seq, int(message.published_at * 1000), message.exchange,
                                    message.routing_key, message.raw_header[CONTENT_HEADER_PREFIX_SIZE:], message.body)
        self._replicate(head + body)
        return True

    def _state(self, seq: int, state: MessageState, *, at_ms: int = 0, delivery_count: int = 0, due_at_ms: int = 0,
               reason: Reason = Reason.UNSPECIFIED) -> bool:
        """Record it locally and replicate it. A local write that fails does not stop the
        replication (the replica log is what a failover reads)."""
        at = at_ms or _now_ms()
        if not super()._state(seq, state, at_ms=at, delivery_count=delivery_count, due_at_ms=due_at_ms,
                              reason=reason):
            return False
        self._replicate(encode_state(state, seq, at, delivery_count=delivery_count, due_at_ms=due_at_ms,
                                     reason=reason))
        return True

    def purge(self) -> None:
        super().purge()
        self._replicate(encode_state(MessageState.PURGED, _MAX_SEQ, _now_ms()))

    def hand_over(self) -> None:
        """The queue is dropped here because another node leads it now: its local files go,
        its replica and group stay."""
        self._handing_over = True

    def delete(self) -> None:
        super().delete()
        self._fail_pending()
        if not self._handing_over:
            self._on_deleted(self)

    def request_sync(self, callback: SyncCallback) -> None:
        """Call `callback(error)` once a majority of the group fsynced everything journaled so far."""
        if self._lost:  # until the queue here is handed over (the same loop iteration or the next)
            asyncio.get_running_loop().call_soon(callback, NotReplicated(
                f"the replica of {self.store.queue!r} no longer leads its group"))
            return
        if not self._leading:
            self._unplaced.append(callback)
            return
        index = self.replica.log.last_index
        if index <= self._commit_index:
            asyncio.get_running_loop().call_soon(callback, None)
        else:
            self._waiting.append((index, callback))

    # -- taking the queue over ------------------------------------------------------------------------

    def recover(self) -> JournalRecovery:
        """The queue as the replica log holds it (see the module docstring); the local segment
        files are written anew from it."""
        log_ = self.replica.log
        assert isinstance(log_, QueueReplicaLog)  # (a queue's replica: streams have their own)
        shutil.rmtree(self.store.directory, ignore_errors=True)
        if log_.last_index == 0:
            return super().recover()
        # The replica's applied state and the few entries after it: O(unsettled messages).
        state = log_.takeover_state()
        self.store.recover()
        now = _now_ms()
        held_back: list[bytes] = []
        maybe_delivered = set(state.maybe_delivered())
        for seq in sorted(state.messages):
            record = state.messages[seq]
            self.store.append_message(seq, record.published_at_ms, record.exchange, record.routing_key,
                                      record.raw_properties, record.body)
            count = state.delivery_count.get(seq, 0)
            if state.held[seq] is Held.DELIVERED:
                # A consumer held it when the old leader went: it comes back as a requeue would.
                held_back.append(encode_state(MessageState.REQUEUED, seq, now, delivery_count=count))
            elif seq in maybe_delivered:
                # Ready here, but within the old leader's delivery horizon: it may have gone to a
                # consumer in the old leader's last instant, its `delivered` record lost with it.
                count += 1
                held_back.append(encode_state(MessageState.REQUEUED, seq, now, delivery_count=count))
            if count:
                self.store.append_state(seq, MessageState.REQUEUED, now, delivery_count=count)
        self.store.close()
        for payload in held_back:
            self._replicate(payload)
        # This leader's deliveries start from nothing: the messages the old horizon covered are
        # marked above, and must not be counted again at a later failover.
        self._replicate(horizon_payload(0))
        self.store = self._reopen()
        recovery = super().recover()
        log.info("%r taken over from its replica log: %d messages (%d held by consumers at the failover, "
                 "%d more within its delivery horizon); %s", self.store.queue, recovery.count,
                 len(held_back) - len(maybe_delivered), len(maybe_delivered), log_.last_takeover)
        self._last_published = max(recovery.next_seq, state.next_seq) - 1
        return recovery._replace(next_seq=max(recovery.next_seq, state.next_seq))
