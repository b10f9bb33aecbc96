"""A durable queue's journal: what it writes to its segment files, and how it reads them back.

Persistent messages (delivery_mode 2) of a durable queue (every message, when the journal
`keeps_transient`: a replicated queue) are appended to the queue's
`persistence.QueueStore`, and so is everything that happens to them afterwards (delivered,
acked, requeued, dropped, dead-lettered, expired). Records are written to the OS within one
event-loop iteration; `request_sync` asks the group committer for an fsync, which is what a
publisher confirm or a tx.commit waits for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import NamedTuple, Protocol

from persistence.group_commit import GroupCommitter
from persistence.queue_store import QueueStore
from persistence.record_format import MessageState, Reason
from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message, QueueEntry, content_header

log = logging.getLogger(__name__)

SyncCallback = Callable[[OSError | None], None]


class DeliveringQueue(Protocol):
    """What a journal that holds deliveries back (`may_deliver`) uses of its queue (a
    queues.queue.Queue): how much its consumers could take, and dispatch to resume it."""

    def delivery_room(self) -> int | None: ...

    def dispatch(self) -> None: ...


class StoringQueue(Protocol):
    """A queue that can say when what was published to it is stored (a queues.queue.Queue, or
    a cluster's stand-in for a queue on another node)."""

    def when_stored(self, callback: SyncCallback) -> None: ...


class JournalRecovery(NamedTuple):
    """What the journal holds of a queue's messages, read without their bodies."""

    # (seq, delivery_count, body_size, due_at_ms, published_at_ms) in queue order. A message
    # that had been delivered before the restart counts as delivered at least once, so it
    # comes back redelivered; `due_at_ms` is set for one that was waiting for a delayed retry.
    messages: Iterator[tuple[int, int, int, int | None, int]]
    count: int  # type: ignore[assignment]  # a field, hiding tuple.count (never called on it)
    next_seq: int  # the next sequence number to use
    expiring_properties: dict[int, bytes]  # raw basic properties of the messages with an `expiration`


def _now_ms() -> int:
    return int(time.time() * 1000)


class QueueJournal:
    """The queue's side of its QueueStore, and where a failed disk write stops.

    A write that fails (an OSError: disk full, I/O error, a store that failed earlier) never
    reaches the queue's callers, whichever connection or timer made it. It has one outcome per
    kind of record:

    - a message record (`published`) returns False: nothing was written, and the queue refuses
      the message (the publisher gets a basic.nack, a transaction fails);
    - a later state record (delivered, acked, requeued, waiting, removed, purge, delete) is
      logged and the journal is marked failed (`failure`): the queue keeps serving from memory
      and the management API shows it "crashed". After a restart such a message may come back
      (redelivered), never go missing.
    """

    # Whether transient messages (delivery_mode 1) are journaled too. A classic durable queue
    # keeps only persistent ones, as RabbitMQ's does; a replicated (quorum) queue keeps every
    # message, as RabbitMQ's quorum queues do (cluster/replication/replicated_journal.py).
    keeps_transient = False
    # Queue.dispatch asks `may_deliver` before delivering a message whose seq is above this.
    # A journal whose deliveries must wait for their records to be replicated lowers it
    # (cluster/replication/replicated_journal.py); here nothing waits.
    deliver_check_above = (1 << 63) - 1
    # What a basic.get-ok waits for after its `delivered` record (None: nothing; a replicated
    # journal waits for the record to be on a majority).
    delivery_wait: Callable[[Callable[[Exception | None], None]], None] | None = None

    def __init__(self, store: QueueStore, committer: GroupCommitter) -> None:
        self.store = store
        self.committer = committer
        self.failure: OSError | None = None  # the first state record that could not be written

    def may_deliver(self, seq: int, queue: DeliveringQueue) -> bool:
        """May message `seq` of `queue` be delivered now? False: not yet, and the journal calls
        `queue.dispatch()` once it may."""
        return True

    def set_archive(self, archive: bool) -> None:
        """Archive fully acked segments from now on (a policy's `archive`), or stop."""
        self.store.set_archive(archive)

    def recover(self) -> JournalRecovery:
        """What the journal holds of the queue's messages; see JournalRecovery."""
        recovery = self.store.recover()
        return JournalRecovery(recovery.rows(), len(recovery), recovery.next_seq, recovery.expiring_properties)

    def load_message(self, seq: int) -> Message | None:
        """Read a journaled message back; None (logged) if the journal cannot give it."""
        try:
            record = self.store.read_message(seq)
        except (KeyError, OSError, ValueError) as error:
            log.error("%r: message %d could not be read back: %s", self.store.queue, seq, error)
            return None
        message = Message(
            record.exchange,
            record.routing_key,
            content_header(len(record.body), record.raw_properties),
            record.body,
        )
        message.published_at = record.published_at_ms / 1000.0
        return message

    def load(self, seq: int, delivery_count: int) -> QueueEntry | None:
        """Read a paged-out message back as this queue's entry; None if it cannot be read."""
        message = self.load_message(seq)
        if message is None:
            return None
        return QueueEntry(message, seq, persisted=True, delivery_count=delivery_count)

    # -- records -----------------------------------------------------------------------

    def published(self, entry: QueueEntry) -> bool:
        """Append the message; False (logged, nothing written) when the store cannot take it.

        The caller made `entry` with persisted=True and drops it when this says False."""
        message = entry.message
        try:
            self.store.append_message(
                entry.seq,
                int(message.published_at * 1000),
                message.exchange,
                message.routing_key,
                message.raw_header[CONTENT_HEADER_PREFIX_SIZE:],
                message.body,
            )
        except OSError as error:
            log.error("%r: a published message could not be written: %s", self.store.queue, error)
            return False
        return True

    def delivered(self, entry: QueueEntry) -> None:
        self._state(entry.seq, MessageState.DELIVERED, delivery_count=entry.delivery_count)

    def requeued(self, entry: QueueEntry) -> None:
        self._state(entry.seq, MessageState.REQUEUED, delivery_count=entry.delivery_count)

    def waiting(self, entry: QueueEntry, due_at_ms: int) -> None:
        """The message waits for a delayed retry until `due_at_ms`."""
        self._state(entry.seq, MessageState.WAITING_RETRY, delivery_count=entry.delivery_count, due_at_ms=due_at_ms)

    def acked(self, entry: QueueEntry) -> None:
        self._state(entry.seq, MessageState.ACKED)

    def settled(self, seq: int, state: str, at_ms: int) -> None:
        """Message `seq` is done with: "acked" (or routed, for a delayed exchange), "dropped"."""
        self._state(seq, MessageState(state), at_ms=at_ms)

    def removed(self, entry: QueueEntry, reason: str, dead_lettered: bool) -> None:
        """The message left without an ack: expired, dropped or dead-lettered for `reason`."""
        if reason == "expired" and not dead_lettered:
            self._state(entry.seq, MessageState.EXPIRED)
        else:
            self._state(entry.seq, MessageState.DEAD_LETTERED if dead_lettered else MessageState.DROPPED,
                        reason=Reason[reason.upper()])

    def _state(self, seq: int, state: MessageState, *, at_ms: int = 0, delivery_count: int = 0, due_at_ms: int = 0,
               reason: Reason = Reason.UNSPECIFIED) -> bool:
        """Append a state record (at `at_ms`, default now). Every state record of a message goes
        through here, so a write that fails has its one outcome here: `state_not_written`.
        False when the store had settled the message already (nothing to record); a record
        whose write failed still counts as made (a replicated journal passes it on)."""
        try:
            return self.store.append_state(seq, state, at_ms or _now_ms(), delivery_count=delivery_count,
                                           due_at_ms=due_at_ms, reason=reason)
        except OSError as error:
            self.state_not_written(seq, state.value, error)
            return True

    def purge(self) -> None:
        try:
            self.store.purge()
        except OSError as error:
            self.state_not_written(None, "purged", error)

    def delete(self) -> None:
        try:
            self.store.delete()
        except OSError as error:
            self.state_not_written(None, "deleted", error)

    def close(self) -> None:
        self.store.close()

    def state_not_written(self, seq: int | None, state: str, error: OSError) -> None:
        """A state record could not be written: the journal (and so its queue) has failed. The
        first failure is logged as an error, later ones only at debug level (a failing disk
        fails every record)."""
        what = f"message {seq} as {state}" if seq is not None else f"the queue as {state}"
        if self.failure is None:
            self.failure = error
            log.error("%r: could not record %s: %s; the queue is marked crashed", self.store.queue, what, error)
        else:
            log.debug("%r: could not record %s: %s", self.store.queue, what, error)

    def request_sync(self, callback: SyncCallback) -> None:
        """Call `callback(error)` once everything journaled so far is on disk."""
        self.committer.request_sync(self.store, callback)


def when_synced(queues: Collection[StoringQueue], callback: SyncCallback) -> None:
    """Call `callback(error)` once all `queues` stored what was just published to them (their
    journals fsynced; a remote queue's owner confirmed it); the first error wins."""
    waiting = len(queues)
    failure: list[OSError] = []

    def one_done(error: OSError | None) -> None:
        nonlocal waiting
        if error is not None:
            failure.append(error)
        waiting -= 1
        if waiting == 0:
            callback(failure[0] if failure else None)

    for queue in queues:
        queue.when_stored(one_done)
