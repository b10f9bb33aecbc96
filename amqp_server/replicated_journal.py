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
over (amqp_server/cluster_replicated.py).

At a leader change the new leader builds the queue from its log (`recover`): the messages not
settled, in publish order; those a consumer held at the failover come back with a `requeued`
record carrying their delivery count, so they are delivered again with `redelivered=true` and
a higher x-delivery-count, as a requeue would deliver them.

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

from cluster.replication.queue_log import Held, QueueState
from cluster.replication.replica import QueueReplica, Role
from persistence.group_commit import GroupCommitter
from persistence.queue_store import QueueStore
from persistence.record_format import MessageState, Reason, encode_message, encode_state
from queues.journal import JournalRecovery, QueueJournal, SyncCallback
from queues.message import CONTENT_HEADER_PREFIX_SIZE, QueueEntry

log = logging.getLogger(__name__)

# The highest sequence number a record may carry: a purge record settles every ready message up to it.
_MAX_SEQ = (1 << 63) - 1


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

    # -- the replica's reports (ReplicaManager.own) ---------------------------------------------

    def on_commit(self, index: int) -> None:
        self._commit_index = index
        waiting = self._waiting
        while waiting and waiting[0][0] <= index:
            waiting.popleft()[1](None)

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

    # -- records ------------------------------------------------------------------------------------

    def _replicate(self, payload: bytes) -> None:
        if self._leading:
            self.replica.publish(payload)
        else:
            self._unsent.append(payload)

    def published(self, entry: QueueEntry) -> bool:
        if not super().published(entry):
            return False
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
        shutil.rmtree(self.store.directory, ignore_errors=True)
        if log_.last_index == 0:
            return super().recover()
        state = QueueState.rebuild(payload for _, _, payload in log_.entries())
        self.store.recover()
        now = _now_ms()
        held_back: list[bytes] = []
        for seq in sorted(state.messages):
            record = state.messages[seq]
            self.store.append_message(seq, record.published_at_ms, record.exchange, record.routing_key,
                                      record.raw_properties, record.body)
            count = state.delivery_count.get(seq, 0)
            if state.held[seq] is Held.DELIVERED:
                # A consumer held it when the old leader went: it comes back as a requeue would.
                held_back.append(encode_state(MessageState.REQUEUED, seq, now, delivery_count=count))
            if count:
                self.store.append_state(seq, MessageState.REQUEUED, now, delivery_count=count)
        self.store.close()
        for payload in held_back:
            self._replicate(payload)
        self.store = self._reopen()
        recovery = super().recover()
        log.info("%r taken over from its replica log: %d messages (%d held by consumers at the failover)",
                 self.store.queue, recovery.count, len(held_back))
        return recovery._replace(next_seq=max(recovery.next_seq, state.next_seq))
