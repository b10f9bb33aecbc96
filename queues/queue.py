"""A queue: messages in, fair dispatch to consumers, and what acks, rejects and requeues do.

This file is the queue's in-memory structure: the Queue, and its ready list (ReadyMessages,
at the end, with PriorityReadyMessages for an x-max-priority queue) with the MemoryBudget the
ready lists of a broker share (what their in-memory messages cost; past its limit durable
queues page out). A message's place in the queue is a QueueEntry (queues/message.py).

Dispatch is synchronous and cheap: whenever a message arrives, a consumer appears or a
consumer gains room (an ack, a new basic.qos, a socket that drained), `dispatch()` hands ready
messages to consumers that have room, highest consumer priority first and round-robin within a
priority, until messages or room run out. No task or future is created per message.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from queues import dead_letter, length_limit
from queues.arguments import QueueArguments
from queues.consumer import Consumer
from queues.consumer_rotation import NO_CONSUMERS, ConsumerRotation
from queues.deduplication import DeduplicationCache
from queues.delays.delayed_retry import DelayedRetry
from queues.delivery_count import get_ok_header
from queues.journal import QueueJournal
from queues.message import FLAG_EXPIRATION, FLAG_PRIORITY, GONE, READY, Message, QueueEntry
from queues.message_ttl import MessageExpiry, expiry_time, pop_unexpired
from queues.paged_expiry import PagedExpiry
from queues.publish_outcome import DUPLICATE, ENQUEUED, ENQUEUED_DURABLY, REJECTED, WRITE_FAILED
from queues.queue_recovery import take_back
from queues.queue_stats import QueueStats
from queues.queue_ttl import QueueTtl
from queues.queue_type import ConsumeAnswer, CountsAnswer, GetAnswer, QueueType
from queues.requeue import requeue
from queues.single_active_consumer import ActiveConsumer
from queues.timers import Timers

# Flow control: while a queue that has consumers holds more than FLOW_HIGH ready messages,
# publishers into it are paused until it drains below FLOW_LOW. Like RabbitMQ's credit flow,
# this keeps a fast publisher from taking all of the broker's time from the consumers that
# would drain the queue; without consumers the queue just grows (memory alarms handle that).
FLOW_HIGH = 2000
FLOW_LOW = 1000

# Called to dead-letter entries that left `queue` for `reason` (set by the vhost, which routes).
DeadLetterer = Callable[["Queue", list[QueueEntry], str], None]


class Queue(QueueType):
    """One queue of one vhost: the classic and quorum queue types (queues/queue_type.py).

    `exclusive_owner` is the connection that owns an exclusive queue (None otherwise): the
    queue itself only compares it by identity.

    This class coordinates; each other concern lives in its own module: message TTL
    (message_ttl.py, paged_expiry.py), queue TTL (queue_ttl.py), length limits
    (length_limit.py), consumer order (consumer_rotation.py, single_active_consumer.py),
    delayed retry (delays/), priorities (PriorityReadyMessages, below),
    deduplication (deduplication.py), dead-lettering (dead_letter.py), recovery from the
    journal (queue_recovery.py). docs/lifecycle.md.
    """

    def __init__(
        self,
        name: str,
        vhost: str,
        *,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        timers: Timers | None = None,
        dead_letterer: DeadLetterer | None = None,
        journal: QueueJournal | None = None,
        memory_budget: MemoryBudget | None = None,
        defaults: dict[str, Any] | None = None,
        settings: QueueArguments | None = None,
    ) -> None:
        """Raises queues.arguments.InvalidArgument for x-arguments RabbitMQ would refuse.

        `defaults` are x-arguments from the configuration ([[queue_defaults]]); the queue's own
        `arguments` win over them. `settings`, when the caller already parsed them, saves a
        second parse.
        """
        # 29 attributes: past 30, CPython 3.11 stops sharing the class's keys and gives every
        # queue a dict of its own, one more object for the garbage collector per queue
        # (tests/test_queue_footprint.py notices). Group new state in a part made on first use.
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        if settings is None:
            settings = QueueArguments.parse(self.arguments, defaults)
        self.settings = settings
        self.timers = timers if timers is not None else Timers()
        self.dead_letterer = dead_letterer
        self.journal = journal
        loader = self.load_paged if journal is not None else None
        if settings.max_priority:
            self.ready = PriorityReadyMessages(settings.max_priority, loader, memory_budget)
        else:
            self.ready = ReadyMessages(loader, memory_budget)
        # Redeliveries carry x-delivery-count (read by the channel only for redeliveries).
        self.adds_delivery_count = settings.adds_delivery_count
        self.retry: DelayedRetry | None = None  # messages waiting for a delayed retry, made on first use
        # Ids of recent messages (x-message-deduplication), consulted by publish; None: no deduplication.
        self.dedup = DeduplicationCache.for_settings(settings)
        self._rotation = NO_CONSUMERS  # its own ConsumerRotation from the first consumer on
        self.single_active: ActiveConsumer | None = None
        if settings.single_active_consumer:
            self.single_active = ActiveConsumer()
        # What dispatch asks for the next consumer with room (next_with_room()): the single
        # active consumer's order, or the rotation. An object, not a stored bound method (one
        # object more per queue for the garbage collector).
        self._picker: ConsumerRotation | ActiveConsumer = self.single_active or self._rotation
        # The parts below refer back to the queue; each is made when first needed (most queues
        # never need them: fewer objects for each full garbage collection to scan), and dropped
        # on delete, so a deleted queue holds no reference cycle and reference counting frees it.
        self.expiry: MessageExpiry | None = None  # ready messages that can expire (message_expiry())
        self._queue_ttl = QueueTtl(self, settings.expires_ms) if settings.expires_ms is not None else None
        # Paged-out messages that can expire (paged_message_expiry(); only a durable queue pages).
        self.paged_expiry: PagedExpiry | None = None
        self.unacked_count = 0
        self.stats = QueueStats()
        self.deleted = False
        # Called with the queue when an auto-delete queue loses its last consumer.
        self.on_unused: Callable[[Queue], None] | None = None
        # Called with the queue when its x-expires time passes without use.
        self.on_unused_expired: Callable[[Queue], None] | None = None  # both set by when_unused
        self.next_seq = 1  # the sequence number of the next message in (journal order)
        self._consumer_count = 0
        self._dispatching = False
        # Publishers paused by flow control: callables that resume them.
        self.flow_waiters: dict[object, Callable[[], None]] = {}
        self.touch()

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} vhost={self.vhost!r}>"

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        """Ready messages (what queue.declare-ok and basic.get-ok report)."""
        return len(self.ready)

    @property
    def consumer_count(self) -> int:
        return self._consumer_count

    @property
    def waiting_count(self) -> int:
        """Messages waiting for a delayed retry (neither ready nor unacked)."""
        return len(self.retry) if self.retry is not None else 0

    def consumers(self) -> list[Consumer]:
        return list(self._rotation)

    def delivery_room(self) -> int | None:
        """How many more messages the consumers could take now, at most (None: no limit); a
        replicated queue's journal sizes what it lets through with it."""
        room = 0
        for consumer in self._rotation:
            if consumer.no_ack or not consumer.prefetch_count:
                return None
            room += max(consumer.prefetch_count - consumer.unacked, 0)
        return room

    @property
    def failure(self) -> OSError | None:
        """Why the queue failed: the first state record its journal could not write (it keeps
        serving from memory; the management API shows it "crashed"). None while it is well."""
        return self.journal.failure if self.journal is not None else None

    # -- messages in -------------------------------------------------------------------

    def when_unused(self, callback: Callable[["Queue"], None]) -> None:
        """Call `callback(queue)` when the queue falls unused: an auto-delete queue loses its
        last consumer, or its x-expires time passes without use (the vhost then deletes it)."""
        self.on_unused = callback
        self.on_unused_expired = callback

    def publish(self, message: Message) -> int:
        """Enqueue a routed message and deliver it if a consumer has room.

        The steps, in order: deduplication (a message whose id the queue saw recently is
        DUPLICATE: confirmed, not enqueued; on a durable queue ENQUEUED_DURABLY, so that its confirm
        waits for the journal like the first copy's), the length limit (x-overflow reject-publish at the
        limit: REJECTED, the publisher gets a basic.nack), the journal for a persistent message
        of a durable queue, or any message of a replicated one (ENQUEUED_DURABLY: a confirm waits for the fsync; WRITE_FAILED when
        the disk write failed: nothing was enqueued, the publisher gets a basic.nack), then the
        ready messages and dispatch (ENQUEUED).
        """
        dedup = self.dedup
        dedup_key = None
        if dedup is not None:
            dedup_key = dedup.id_of(message)
            if dedup_key is not None and dedup.is_duplicate(dedup_key, message.published_at):
                # The first copy may still wait for its fsync: on a durable queue the duplicate's
                # confirm waits for the journal too, or a crash could lose a confirmed message.
                return DUPLICATE if self.journal is None else ENQUEUED_DURABLY
        settings = self.settings
        limited = settings.max_length is not None or settings.max_length_bytes is not None
        if limited and length_limit.refuses(self, message):
            return REJECTED
        # (expiry_time's own first test, inline: no call for a message without any TTL)
        if settings.message_ttl_ms is None and not message.property_flags & FLAG_EXPIRATION:
            expires_at = 0.0
        else:
            expires_at = expiry_time(message, settings.message_ttl_ms)
        journal = self.journal
        # A replicated (quorum) queue journals transient messages too; the class attribute is
        # looked up only for a transient message to a durable queue.
        durable = journal is not None and (message.is_persistent or journal.keeps_transient)
        entry = QueueEntry(message, self.next_seq, expires_at, durable)  # dropped if the write fails
        if durable and not journal.published(entry):
            return WRITE_FAILED
        self.next_seq += 1
        self.stats.published += 1
        if dedup_key is not None:
            dedup.remember(dedup_key, message, message.published_at)  # accepted: a repeat is a duplicate from now
        if durable:
            # (should_page's first test, inline: a queue with few messages in memory never pages)
            if self.ready.in_memory >= KEEP_PER_QUEUE and should_page(self.ready):
                # Memory is tight and a consumer will not want it soon: keep it on disk only.
                self.ready.page(entry)
                if expires_at:
                    self.paged_message_expiry().track(entry.seq, expires_at)
                return ENQUEUED_DURABLY
            outcome = ENQUEUED_DURABLY
        else:
            outcome = ENQUEUED
        if self._consumer_count and not self.ready.count and not expires_at and not self._dispatching and not self.deleted:
            # Nothing waits ahead of it: a consumer with room gets it without the ready list
            # (no budget, count or deque traffic for a message that does not stay).
            self.dispatch(message.published_at, entry)
        else:
            self.ready.append(entry)
            if expires_at:
                self.message_expiry().track(entry)
            if self._consumer_count:
                # Judge expiry at publish time: a TTL of 0 still reaches a consumer that has room.
                self.dispatch(message.published_at)
        if limited:
            length_limit.drop_head_over_limit(self)
        return outcome

    def when_stored(self, callback: Callable[[OSError | None], None]) -> None:
        """Call `callback(error)` once what was published here so far is stored as durably as
        the queue promises (its journal fsynced). Only after a publish that returned
        ENQUEUED_DURABLY."""
        self.journal.request_sync(callback)

    def load_paged(self, seq: int, delivery_count: int) -> QueueEntry | None:
        """Read a paged-out message back from the journal (None if it cannot be read)."""
        entry = self.journal.load(seq, delivery_count)
        if entry is not None:
            entry.expire_at(expiry_time(entry.message, self.settings.message_ttl_ms))
        return entry

    def recover(self) -> int:
        """Take back the journaled messages (at startup), paged out; returns how many came back.

        A message that was waiting for a delayed retry waits again until its due time, or is
        ready at once if that passed meanwhile; see queue_recovery.py.
        """
        if self.journal is None:
            return 0
        recovery = self.journal.recover()
        self.next_seq = recovery.next_seq
        take_back(self, recovery)
        return recovery.count

    def expire_due(self, now: float | None = None) -> int:
        """Remove (or dead-letter) every in-memory ready message whose TTL has passed; returns how many."""
        return self.expiry.expire_due(now) if self.expiry is not None else 0

    def may_hold_expired(self) -> bool:
        """Could a ready message have an expiry time (so dispatch must look at the clock)?"""
        return (
            (self.expiry is not None and bool(self.expiry.heap))
            or (self.paged_expiry is not None and len(self.paged_expiry) > 0)
            or self.settings.message_ttl_ms is not None  # paged-out messages are timed when read back
        )

    def message_expiry(self) -> MessageExpiry:
        """The in-memory ready messages that can expire (made on first use)."""
        if self.expiry is None:
            self.expiry = MessageExpiry(self)
        return self.expiry

    def paged_message_expiry(self) -> PagedExpiry:
        """The paged-out ready messages that can expire (made on first use)."""
        if self.paged_expiry is None:
            self.paged_expiry = PagedExpiry(self)
        return self.paged_expiry

    # -- settings ----------------------------------------------------------------------

    def reconfigure(self, settings: QueueArguments) -> None:
        """Take new effective settings (a policy changed) without a restart or a lost message.

        A lowered length limit drops (or dead-letters) the oldest ready messages at once, as
        drop-head does; a new message TTL times the ready messages from when they were
        published, so those already past it expire now (paged-out ones when they are read
        back); a new x-expires restarts the queue's clock. Messages waiting for a delayed
        retry keep their schedule. The queue type and x-max-priority never change (no policy
        sets them); consumer timeouts apply to consumers that start afterwards.
        """
        old = self.settings
        if settings == old:
            return
        self.settings = settings
        self.adds_delivery_count = settings.adds_delivery_count
        if settings.expires_ms != old.expires_ms:
            if self._queue_ttl is not None:
                self._queue_ttl.stop()
            self._queue_ttl = QueueTtl(self, settings.expires_ms) if settings.expires_ms is not None else None
            self.touch()
        if settings.message_ttl_ms != old.message_ttl_ms:
            if self.paged_expiry is not None:
                self.paged_expiry.clear()  # their times were under the old TTL
            self.message_expiry().retime(settings.message_ttl_ms)
        if self._deduplication_changed(old, settings):
            self.dedup = DeduplicationCache.for_settings(settings)  # a new cache: ids seen so far are forgotten
        length_limit.drop_head_after_return(self)

    @staticmethod
    def _deduplication_changed(old: QueueArguments, new: QueueArguments) -> bool:
        return (old.deduplication, old.dedup_cache_size, old.dedup_cache_ttl_ms, old.dedup_header) != (
            new.deduplication, new.dedup_cache_size, new.dedup_cache_ttl_ms, new.dedup_header
        )

    # -- consumers ---------------------------------------------------------------------

    def consume(self, consumer: Consumer, answer: ConsumeAnswer) -> None:
        answer.started()  # consume-ok before the first delivery
        self.add_consumer(consumer)

    def add_consumer(self, consumer: Consumer) -> None:
        if self._rotation is NO_CONSUMERS:
            self._rotation = ConsumerRotation()
            if self.single_active is None:
                self._picker = self._rotation
        self._rotation.add(consumer)
        self._consumer_count += 1
        if self.single_active is not None:
            self.single_active.add(consumer)
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        if not self._rotation.remove(consumer):
            return
        self._consumer_count -= 1
        if self.single_active is not None:
            self.single_active.remove(consumer)
        if not self._consumer_count:
            self.release_flow()
            self.touch()
        if self.auto_delete and not self._consumer_count and self.on_unused:
            self.on_unused(self)

    def has_exclusive_consumer(self) -> bool:
        return any(consumer.exclusive for consumer in self._rotation)

    def dispatch(self, now: float | None = None, first: QueueEntry | None = None) -> None:
        """Deliver ready messages to consumers with room, in fair (round-robin) order.

        Messages whose TTL passed before `now` (default: the current time) are expired instead.
        `first` is a message just published (without expiry) to a queue with no ready messages:
        it goes first, and to the ready list only if no consumer has room.
        """
        if self._dispatching or self.deleted:
            return
        self._dispatching = True
        try:
            ready = self.ready
            stats = self.stats
            picker = self._picker
            journal = self.journal
            # Whether ready messages may have expired (then `now` is the time to judge them by)
            # is asked at the first one taken from the ready list: a message published straight
            # to a consumer (`first`) never needs it.
            expiring: bool | None = None
            while first is not None or ready.count:
                consumer = picker.next_with_room()
                if consumer is None:
                    if first is not None:
                        ready.append(first)
                    return
                if first is not None:
                    entry = first
                    first = None
                    if journal is not None and entry.seq > journal.deliver_check_above and \
                            not journal.may_deliver(entry.seq, self):
                        ready.append(entry)  # its journal calls dispatch again when it may go
                        return
                else:
                    if expiring is None:
                        expiring = self.may_hold_expired()
                        if expiring and now is None:
                            now = self.timers.now()
                    entry = pop_unexpired(self, now) if expiring else ready.pop()
                    if entry is None:
                        return
                    if journal is not None and entry.seq > journal.deliver_check_above and \
                            not journal.may_deliver(entry.seq, self):
                        ready.put_back(entry)  # its journal calls dispatch again when it may go
                        return
                if entry.delivery_count:
                    stats.redelivered += 1
                no_ack = consumer.no_ack
                if no_ack:
                    stats.delivered_no_ack += 1
                else:
                    consumer.count_unacked()
                    self.unacked_count += 1
                stats.delivered += 1
                consumer.sink.deliver(consumer, entry)
                entry.delivered(no_ack)
                if entry.persisted:
                    # A no-ack delivery is the message's last: journal it as settled.
                    (journal.acked if no_ack else journal.delivered)(entry)
        finally:
            self._dispatching = False
            if self.flow_waiters and self.ready.count < FLOW_LOW:
                self.release_flow()

    @property
    def congested(self) -> bool:
        """True while publishers into this queue should be paused (see FLOW_HIGH)."""
        return self._consumer_count > 0 and self.ready.count > FLOW_HIGH

    def release_flow(self) -> None:
        waiters = list(self.flow_waiters.values())
        self.flow_waiters.clear()
        for resume in waiters:
            resume()

    # -- pull --------------------------------------------------------------------------

    def get(self, no_ack: bool) -> QueueEntry | None:
        """basic.get: the next ready message, or None."""
        self.touch()
        entry = pop_unexpired(self, self.timers.now()) if self.ready else None
        if entry is None:
            self.stats.get_empty += 1
            return None
        self.stats.get += 1
        if entry.delivery_count:
            self.stats.redelivered += 1
        if no_ack:
            self.stats.get_no_ack += 1
            entry.mark_gone()
        else:
            entry.mark_unacked()
            self.unacked_count += 1
        return entry

    def get_for(self, no_ack: bool, answer: GetAnswer) -> None:
        entry = self.get(no_ack)
        if entry is None:
            answer.empty()
            return
        raw_header = get_ok_header(self.settings, entry.message, entry.delivery_count)
        redelivered = entry.redelivered
        count = self.message_count
        self.after_get(entry)
        # A replicated queue's get-ok leaves once its `delivered` record is on a majority.
        answer.got(entry, raw_header, redelivered, count,
                   self.journal.delivery_wait if self.journal is not None and entry.persisted else None)

    def after_get(self, entry: QueueEntry) -> None:
        entry.count_delivery()
        if entry.persisted:
            if entry.state == GONE:  # fetched with no_ack: that was its last delivery
                self.journal.acked(entry)
            else:
                self.journal.delivered(entry)

    # -- settlement --------------------------------------------------------------------

    def settle(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """An unacked delivery is done with (acked, or rejected without requeue)."""
        self.unacked_count -= 1
        entry.mark_gone()
        if consumer is not None:
            consumer.count_settled()

    def ack(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        # (settle(entry, consumer), inline: this runs once per acked message)
        self.unacked_count -= 1
        entry.mark_gone()
        if consumer is not None:
            consumer.count_settled()
        self.stats.acked += 1
        if entry.persisted and not self.deleted:
            self.journal.acked(entry)

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """Rejected without requeue: the message leaves the queue (to its dead-letter exchange)."""
        self.settle(entry, consumer)
        dead_letter.hand_off(self, [entry], dead_letter.REJECTED)

    def requeue(self, entries: Iterable[tuple[QueueEntry, Consumer | None]], cause: str | None = None) -> None:
        """Unacked deliveries come back for `cause` (delayed_retry.FAILED: reject/nack; RETURNED:
        the consumer went away, timed out, or basic.recover; None: a management "get" that
        requeues); then dispatch. requeue.py says where each one goes.
        """
        requeue(self, entries, cause)

    def put_back(self, entry: QueueEntry) -> None:
        """A message that was out (delivered, or waiting for a retry) is ready again at its
        original position."""
        self.ready.put_back(entry)
        if entry.persisted:
            self.journal.requeued(entry)
        if entry.expires_at:
            self.message_expiry().track(entry)  # a message whose TTL passed meanwhile expires at once

    def delayed_retry(self) -> DelayedRetry:
        """The messages waiting for a delayed retry (made on first use)."""
        if self.retry is None:
            self.retry = DelayedRetry(self)
        return self.retry

    # -- administration ----------------------------------------------------------------

    def touch(self) -> None:
        """The queue was used (declared, consumed from, polled): restart its x-expires clock."""
        if self._queue_ttl is not None and not self.deleted:
            self._queue_ttl.restart()

    def purge(self) -> int:
        """Drop every ready message and every message waiting for a retry; return how many."""
        if self.expiry is not None:
            self.expiry.clear()
        if self.paged_expiry is not None:
            self.paged_expiry.clear()
        if self.journal is not None:
            self.journal.purge()
        waiting = self.retry.clear() if self.retry is not None else 0
        return self.ready.clear() + waiting

    def purge_for(self, answer: CountsAnswer) -> None:
        answer.counted(self.purge(), self._consumer_count)

    def count(self, answer: CountsAnswer) -> None:
        answer.counted(self.message_count, self._consumer_count)

    def delete(self) -> list[Consumer]:
        """Mark deleted and return the consumers that must be told (basic.cancel).

        Every part that refers back to the queue is stopped and dropped, so once the vhost and
        the consumers' channels let go of it, reference counting frees the queue at once (no
        full garbage collection needed)."""
        self.deleted = True
        self.release_flow()
        if self.expiry is not None:
            self.expiry.stop()
            self.expiry = None
        if self._queue_ttl is not None:
            self._queue_ttl.stop()
            self._queue_ttl = None
        if self.retry is not None:
            self.retry.stop()
            self.retry = None
        if self.paged_expiry is not None:
            self.paged_expiry.stop()
            self.paged_expiry = None
        consumers = self.consumers()
        self._rotation.clear()
        self._consumer_count = 0
        self.ready.close()
        if self.journal is not None:
            self.journal.delete()
        return consumers


class CongestedQueues:
    """The congested queues that hold one publisher back (flow control, FLOW_HIGH above): each
    is asked to say when it drained (`flow_waiters`); `held` is called when the first one holds
    the publisher, `drained` when the last one let it go. A client connection stops reading
    (amqp_server/connection/publisher_flow.py), a cluster link's channel sends channel.flow
    (cluster/links/forwarded.py)."""

    __slots__ = ("queues", "_held", "_drained")

    def __init__(self, held: Callable[[], None], drained: Callable[[], None]) -> None:
        self.queues: set[Queue] = set()
        self._held = held
        self._drained = drained

    def add(self, queue: Queue) -> None:
        """`queue` is congested by this publisher's publishes: hold it until the queue drains."""
        queues = self.queues
        if queue in queues:
            return
        first = not queues
        queues.add(queue)
        queue.flow_waiters[self] = lambda: self._one_drained(queue)
        if first:
            self._held()

    def _one_drained(self, queue: Queue) -> None:
        self.queues.discard(queue)
        if not self.queues:
            self._drained()

    def clear(self) -> None:
        """The publisher is gone: no queue keeps a way to resume it."""
        for queue in self.queues:
            queue.flow_waiters.pop(self, None)
        self.queues.clear()


# -- the ready list ----------------------------------------------------------------------
#
# The ready messages of a queue, in delivery order, with the tail kept on disk when it is long.

# Loads a paged-out message back: (seq, delivery_count) -> entry, or None if it cannot be read.
Loader = Callable[[int, int], "QueueEntry | None"]


# -- the memory budget: how many bytes of ready messages the broker keeps as objects before
# paging out to disk (one MemoryBudget shared by every queue's ready list) --------------------

# Python holds a message as several objects (entry, message, header, body); this is roughly
# what they cost beyond the body itself, so the budget counts memory, not only payload.
PER_MESSAGE_OVERHEAD = 400
DEFAULT_LIMIT_BYTES = 48 * 1024 * 1024
# A queue always keeps this many ready messages in memory, so dispatch never waits on a read.
KEEP_PER_QUEUE = 64


class MemoryBudget:
    """Shared by every queue of a broker: `held` is what their in-memory ready messages cost.

    Once `held` passes `limit`, durable queues keep new persistent messages in their journal
    only (see ReadyMessages.append_paged) and read them back when they near the head.
    """

    __slots__ = ("limit", "held")

    def __init__(self, limit: int = DEFAULT_LIMIT_BYTES) -> None:
        self.limit = limit
        self.held = 0

    @property
    def exhausted(self) -> bool:
        return self.held > self.limit

    def hold(self, size: int) -> None:
        """A ready message of `size` body bytes is now kept in memory."""
        self.held += size + PER_MESSAGE_OVERHEAD

    def release(self, size: int) -> None:
        """A ready message of `size` body bytes is no longer kept in memory (taken or paged out)."""
        self.held -= size + PER_MESSAGE_OVERHEAD


def should_page(ready: "ReadyMessages | PriorityReadyMessages") -> bool:
    """Should a new persistent message of a durable queue stay in its journal only?

    Yes once the queue keeps KEEP_PER_QUEUE messages in memory and either the budget is spent
    or messages ahead of it are paged out already (a consumer will not want it soon).
    """
    if ready.in_memory < KEEP_PER_QUEUE:
        return False
    budget = ready.budget
    # (budget.exhausted and len(ready), inline: this runs once per message of a backlog)
    return budget.held > budget.limit or ready.count > ready.in_memory


class PagedRun:
    """Consecutive persistent messages held only in the journal: their numbers and sizes.

    About 16 bytes a message instead of the message itself, which is what keeps a queue of
    a million messages within bounded memory.
    """

    __slots__ = ("seqs", "delivery_counts", "sizes", "start")

    def __init__(self) -> None:
        self.seqs = array("Q")
        self.delivery_counts = array("I")
        self.sizes = array("I")
        self.start = 0  # index of the next message to hand out

    def __len__(self) -> int:
        return len(self.seqs) - self.start

    def add(self, seq: int, delivery_count: int, size: int) -> None:
        self.seqs.append(seq)
        self.delivery_counts.append(delivery_count)
        self.sizes.append(size)

    def release(self) -> None:
        """Every message was handed out or taken: free the arrays (the run may still sit in the FIFO)."""
        self.seqs = array("Q")
        self.delivery_counts = array("I")
        self.sizes = array("I")
        self.start = 0


# What the structures of a queue that never had a message (never paged out, never had one
# returned) hold: shared and immutable, so an idle queue carries no objects of its own for them
# (fewer for each full garbage collection to scan, and no 600-byte deque). The first change
# replaces them with its own.
_NO_MESSAGES: "tuple[QueueEntry | PagedRun, ...]" = ()
_NO_RUNS: "tuple[PagedRun, ...]" = ()
_NO_RETURNED: "tuple[tuple[int, QueueEntry], ...]" = ()
_NOTHING_TAKEN: frozenset[int] = frozenset()


class ReadyMessages:
    """FIFO of new messages plus the messages that came back, which go first.

    A message that was delivered and then requeued (nack, reject, a channel closing) goes
    back to its original position, as in RabbitMQ: every message still in the FIFO arrived
    after every message that was delivered from it, so returned messages, ordered by their
    sequence number among themselves, all come before the FIFO.

    A message can also leave from the middle (it expired): `remove()` marks it gone and
    `pop()` skips it later, so removal costs O(1).

    Persistent messages of a durable queue may be paged out (`append_paged`): the FIFO then
    holds a PagedRun instead of the entries, and `pop()` reads them back through `loader`.
    """

    __slots__ = ("_fifo", "_runs", "_returned", "count", "bytes", "in_memory", "loader", "budget", "_taken")

    def __init__(self, loader: Loader | None = None, budget: MemoryBudget | None = None) -> None:
        self._fifo: deque[QueueEntry | PagedRun] | tuple[QueueEntry | PagedRun, ...] = _NO_MESSAGES
        # The PagedRuns of the FIFO, in order (lookup by seq); a deque from the first one.
        self._runs: deque[PagedRun] | tuple[PagedRun, ...] = _NO_RUNS
        # Returned messages, a heap by seq; a list from the first one.
        self._returned: list[tuple[int, QueueEntry]] | tuple[tuple[int, QueueEntry], ...] = _NO_RETURNED
        # Ready messages: what len() says, read as an attribute by the queue's per-message code
        # (no __len__/__bool__ call there). Only this class changes it.
        self.count = 0
        self.bytes = 0
        self.in_memory = 0  # ready messages held as objects (not paged out)
        self.loader = loader
        self.budget = budget if budget is not None else MemoryBudget()
        # Paged-out messages taken from the middle of their run (they expired): skipped later;
        # a set from the first one.
        self._taken: set[int] | frozenset[int] = _NOTHING_TAKEN

    def _hold(self, size: int) -> None:
        self.in_memory += 1
        self.budget.hold(size)

    def _release(self, size: int) -> None:
        self.in_memory -= 1
        self.budget.release(size)

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def append(self, entry: QueueEntry) -> None:
        """Add a new message (READY, as QueueEntry makes it; one that comes back is put_back)."""
        fifo = self._fifo
        if fifo is _NO_MESSAGES:
            fifo = self._fifo = deque()
        fifo.append(entry)
        self.count += 1
        size = len(entry.message.body)
        # _hold(size), inline: this runs once per message.
        self.in_memory += 1
        self.budget.hold(size)
        self.bytes += size

    def append_paged(self, seq: int, delivery_count: int, size: int, priority: int = 0) -> None:
        """Add a message that only the journal holds (`priority` is for PriorityReadyMessages)."""
        fifo = self._fifo
        if fifo is _NO_MESSAGES:
            fifo = self._fifo = deque()
        tail = fifo[-1] if fifo else None
        if not isinstance(tail, PagedRun):
            tail = PagedRun()
            fifo.append(tail)
            if self._runs is _NO_RUNS:
                self._runs = deque()
            self._runs.append(tail)
        tail.add(seq, delivery_count, size)
        self.count += 1
        self.bytes += size

    def page(self, entry: QueueEntry) -> None:
        """Add a journaled message but keep only its number in memory (memory is tight)."""
        self.append_paged(entry.seq, entry.delivery_count, len(entry.message.body))

    def put_back(self, entry: QueueEntry) -> None:
        entry.mark_ready()
        if self._returned is _NO_RETURNED:
            self._returned = []
        heapq.heappush(self._returned, (entry.seq, entry))
        self.count += 1
        size = len(entry.message.body)
        self._hold(size)
        self.bytes += size

    def remove(self, entry: QueueEntry) -> None:
        """Take a ready message out wherever it is (it stays in place as a skipped tombstone)."""
        if entry.state == READY:
            entry.mark_gone()
            self.count -= 1
            size = len(entry.message.body)
            self._release(size)
            self.bytes -= size

    def take_paged(self, seq: int) -> QueueEntry | None:
        """Take out the paged-out message `seq` from wherever it is, read back; None if it is
        not paged out here (delivered or read back already, or gone)."""
        taken = self._taken
        for run in self._runs:
            if not len(run):
                continue
            seqs = run.seqs
            if seq > seqs[-1]:
                continue
            i = bisect_left(seqs, seq, run.start)
            if seqs[i] != seq or seq in taken:
                return None
            size, delivery_count = run.sizes[i], run.delivery_counts[i]
            if i == run.start:
                # The run's first: advance past it (and past any taken before), so that expiring
                # in queue order, the usual case, leaves nothing behind.
                run.start += 1
                while taken and run.start < len(seqs) and seqs[run.start] in taken:
                    taken.discard(seqs[run.start])
                    run.start += 1
                if not len(run):
                    run.release()
            else:
                if taken is _NOTHING_TAKEN:
                    taken = self._taken = set()
                taken.add(seq)
            self.count -= 1
            self.bytes -= size
            entry = self.loader(seq, delivery_count) if self.loader else None
            if entry is not None:
                entry.mark_gone()
            return entry
        return None

    def pop(self) -> QueueEntry:
        """Remove and return the next message to deliver; IndexError when empty. It is still
        READY: the caller says what became of it (QueueEntry.delivered, mark_gone...)."""
        fifo = self._fifo
        if not self._returned and fifo and fifo[0].__class__ is QueueEntry and fifo[0].state == READY:
            entry = fifo.popleft()  # the usual case: nothing came back, the head is in memory
        else:
            entry = self._take_head()
        self.count -= 1
        size = len(entry.message.body)
        # _release(size), inline: this runs once per message.
        self.in_memory -= 1
        self.budget.release(size)
        self.bytes -= size
        return entry

    def _take_head(self) -> QueueEntry:
        returned = self._returned
        while returned:
            entry = heapq.heappop(returned)[1]
            if entry.state == READY:
                return entry
        fifo = self._fifo
        while True:
            head = fifo[0]  # IndexError when empty
            if isinstance(head, QueueEntry):
                fifo.popleft()
                if head.state == READY:
                    return head
                continue
            if not len(head):  # every message of the run was taken out (they expired)
                fifo.popleft()
                self._runs.popleft()
                continue
            entry = self._load_from(head)
            if entry is not None:
                return entry

    def _load_from(self, run: PagedRun) -> QueueEntry | None:
        i = run.start
        run.start += 1
        if not len(run):
            self._fifo.popleft()
            self._runs.popleft()
        if self._taken and run.seqs[i] in self._taken:
            self._taken.discard(run.seqs[i])
            return None  # counted out when it was taken
        entry = self.loader(run.seqs[i], run.delivery_counts[i]) if self.loader else None
        if entry is None:  # unreadable: it is gone; keep the counts true
            self.count -= 1
            self.bytes -= run.sizes[i]
            return None
        # It counts as in memory from now on, and its size is what was read.
        size = len(entry.message.body)
        self._hold(size)
        self.bytes += size - run.sizes[i]
        return entry

    def in_memory_entries(self) -> list[QueueEntry]:
        """The ready messages held as objects (not paged out), in no particular order."""
        entries = [entry for _seq, entry in self._returned if entry.state == READY]
        entries.extend(item for item in self._fifo if isinstance(item, QueueEntry) and item.state == READY)
        return entries

    def peek(self, count: int) -> list[QueueEntry]:
        """The first `count` ready messages in delivery order, left where they are."""
        returned = heapq.nsmallest(count, (item for item in self._returned if item[1].state == READY))
        entries = [entry for _seq, entry in returned]
        for item in self._fifo:
            if len(entries) >= count:
                break
            if isinstance(item, QueueEntry):
                if item.state == READY:
                    entries.append(item)
                continue
            for i in range(item.start, len(item.seqs)):
                if len(entries) >= count:
                    break
                if item.seqs[i] in self._taken:
                    continue
                loaded = self.loader(item.seqs[i], item.delivery_counts[i]) if self.loader else None
                if loaded is not None:
                    entries.append(loaded)
        return entries

    def clear(self) -> int:
        """Remove every ready message; returns how many there were."""
        count = self.count
        for _seq, entry in self._returned:
            if entry.state == READY:
                entry.mark_gone()
                self._release(len(entry.message.body))
        for item in self._fifo:
            if isinstance(item, QueueEntry) and item.state == READY:
                item.mark_gone()
                self._release(len(item.message.body))
        self._returned = _NO_RETURNED
        self._fifo = _NO_MESSAGES
        self._runs = _NO_RUNS
        self._taken = _NOTHING_TAKEN
        self.count = 0
        self.bytes = 0
        return count

    def close(self) -> int:
        """The queue is deleted: remove every ready message (returns how many) and forget the
        loader, which refers back to the queue (no reference cycle outlives the queue)."""
        self.loader = None
        return self.clear()


# -- the ready list by priority -------------------------------------------------------------
#
# The ready messages of an x-max-priority queue: higher priority first, FIFO within a priority.
#
# One ReadyMessages per priority level in use, so everything ReadyMessages promises holds within
# a level: a requeued message goes back to its original position among the messages of its
# priority, a message can expire from the middle, and persistent messages of a durable queue
# page out to the journal and are read back near the head. As in RabbitMQ, a message without a
# priority has priority 0 and one above the queue's maximum counts as the maximum.
#
# Only queues declared with x-max-priority >= 1 use this store; every other queue keeps the plain
# ReadyMessages, so their path costs nothing more.


def message_priority(message: Message, max_priority: int) -> int:
    """The priority level `message` is kept at in a queue with `max_priority`."""
    if not message.property_flags & FLAG_PRIORITY:
        return 0
    priority = message.properties.priority or 0
    return priority if priority < max_priority else max_priority


class PriorityReadyMessages:
    """Same interface as ReadyMessages; see the module docstring."""

    __slots__ = ("max_priority", "loader", "budget", "_levels", "_order", "count")

    def __init__(self, max_priority: int, loader: Loader | None = None, budget: MemoryBudget | None = None) -> None:
        self.max_priority = max_priority
        self.loader = loader
        self.budget = budget if budget is not None else MemoryBudget()
        self._levels: dict[int, ReadyMessages] = {}
        self._order: list[ReadyMessages] = []  # the levels in use, highest priority first
        self.count = 0  # ready messages, as ReadyMessages.count

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    @property
    def bytes(self) -> int:
        return sum(level.bytes for level in self._order)

    @property
    def in_memory(self) -> int:
        return sum(level.in_memory for level in self._order)

    def _level(self, priority: int) -> ReadyMessages:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = ReadyMessages(self.loader, self.budget)
            self._order = [self._levels[p] for p in sorted(self._levels, reverse=True)]
        return level

    def _level_of(self, entry: QueueEntry) -> ReadyMessages:
        return self._level(message_priority(entry.message, self.max_priority))

    def append(self, entry: QueueEntry) -> None:
        self._level_of(entry).append(entry)
        self.count += 1

    def append_paged(self, seq: int, delivery_count: int, size: int, priority: int = 0) -> None:
        self._level(min(priority, self.max_priority)).append_paged(seq, delivery_count, size)
        self.count += 1

    def page(self, entry: QueueEntry) -> None:
        """Keep `entry` in the journal only (see ReadyMessages.page)."""
        self._level_of(entry).page(entry)
        self.count += 1

    def put_back(self, entry: QueueEntry) -> None:
        self._level_of(entry).put_back(entry)
        self.count += 1

    def remove(self, entry: QueueEntry) -> None:
        level = self._level_of(entry)
        before = len(level)
        level.remove(entry)
        self.count -= before - len(level)

    def take_paged(self, seq: int) -> QueueEntry | None:
        """Take out the paged-out message `seq` (see ReadyMessages.take_paged)."""
        for level in self._order:
            before = len(level)
            entry = level.take_paged(seq)
            if len(level) != before:
                self.count -= before - len(level)
                return entry
        return None

    def pop(self) -> QueueEntry:
        """Remove and return the next message to deliver; IndexError when empty."""
        for level in self._order:
            if level:
                before = len(level)
                try:
                    entry = level.pop()
                except IndexError:  # its paged-out messages could not be read back
                    self.count -= before - len(level)
                    continue
                self.count -= before - len(level)
                return entry
        raise IndexError("no ready messages")

    def in_memory_entries(self) -> list[QueueEntry]:
        return [entry for level in self._order for entry in level.in_memory_entries()]

    def peek(self, count: int) -> list[QueueEntry]:
        entries: list[QueueEntry] = []
        for level in self._order:
            if len(entries) >= count:
                break
            entries.extend(level.peek(count - len(entries)))
        return entries

    def clear(self) -> int:
        count = sum(level.clear() for level in self._order)
        self.count = 0
        return count

    def close(self) -> int:
        """The queue is deleted: see ReadyMessages.close."""
        self.loader = None
        count = sum(level.close() for level in self._order)
        self.count = 0
        return count

    def levels(self) -> Iterator[tuple[int, int]]:
        """(priority, ready messages) of each level in use, highest first (for inspection)."""
        for priority in sorted(self._levels, reverse=True):
            yield priority, len(self._levels[priority])
