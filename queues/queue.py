"""A queue: messages in, fair dispatch to consumers, and what acks, rejects and requeues do.

This file is the Queue, which coordinates; its ready messages are a ReadyMessages (or a
PriorityReadyMessages for an x-max-priority queue, queues/ready_messages.py) charged to the
MemoryBudget the ready lists of a broker share (queues/memory_budget.py). A message's place in
the queue is a QueueEntry (queues/message.py).

Dispatch is synchronous and cheap: whenever a message arrives, a consumer appears or a
consumer gains room (an ack, a new basic.qos, a socket that drained), `dispatch()` hands ready
messages to consumers that have room, highest consumer priority first and round-robin within a
priority, until messages or room run out. No task or future is created per message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from queues import dead_letter, length_limit
from queues.arguments import QueueArguments, queue_type_rules
from queues.consumer import Consumer
from queues.consumer_rotation import NO_CONSUMERS, ConsumerRotation
from queues.deduplication import DeduplicationCache
from queues.delays.delayed_retry import DelayedRetry
from queues.delivery_count import get_ok_header
from queues.journal import QueueJournal
from queues.memory_budget import MemoryBudget
from queues.message import FLAG_EXPIRATION, GONE, Message, QueueEntry
from queues.message_ttl import MessageExpiry, expiry_time, pop_unexpired
from queues.paged_expiry import PagedExpiry
from queues.publish_outcome import DUPLICATE, ENQUEUED, ENQUEUED_DURABLY, REJECTED, WRITE_FAILED
from queues.queue_recovery import take_back
from queues.queue_stats import QueueStats
from queues.queue_ttl import QueueTtl
from queues.queue_type import ConsumeAnswer, CountsAnswer, GetAnswer, QueueType, QueueTypeRefusal
from queues.ready_messages import KEEP_PER_QUEUE, PriorityReadyMessages, ReadyList, ReadyMessages, should_page
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
    delayed retry (delays/), priorities (PriorityReadyMessages, ready_messages.py),
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
            self.ready: ReadyList = PriorityReadyMessages(settings.max_priority, loader, memory_budget)
        else:
            self.ready = ReadyMessages(loader, memory_budget)
        # Redeliveries carry x-delivery-count (read by the channel only for redeliveries).
        self.adds_delivery_count = settings.adds_delivery_count
        self.retry: DelayedRetry | None = None  # messages waiting for a delayed retry, made on first use
        # Ids of recent messages (x-message-deduplication), consulted by publish; None: no deduplication.
        self.dedup = DeduplicationCache.for_settings(settings)
        self._rotation: ConsumerRotation[Consumer] = NO_CONSUMERS  # its own ConsumerRotation from the first consumer on
        self.single_active: ActiveConsumer[Consumer] | None = None
        if settings.single_active_consumer:
            self.single_active = ActiveConsumer()
        # What dispatch asks for the next consumer with room (next_with_room()): the single
        # active consumer's order, or the rotation. An object, not a stored bound method (one
        # object more per queue for the garbage collector).
        self._picker: ConsumerRotation[Consumer] | ActiveConsumer[Consumer] = self.single_active or self._rotation
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

    def consumer_offsets(self) -> list[tuple[Consumer, int]]:
        """A stream's consumers and the offset each reads next, as the management API and the
        metrics show them (a stream and a stream's stand-in on another node); none here."""
        return []

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
        if durable and not journal.published(entry):  # type: ignore[union-attr]  # durable implies a journal
            return WRITE_FAILED
        self.next_seq += 1
        self.stats.published += 1
        if dedup_key is not None:
            # Accepted: a repeat is a duplicate from now (a key implies the cache).
            dedup.remember(dedup_key, message, message.published_at)  # type: ignore[union-attr]
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
        self.journal.request_sync(callback)  # type: ignore[union-attr]  # the outcome implies a journal

    def load_paged(self, seq: int, delivery_count: int) -> QueueEntry | None:
        """Read a paged-out message back from the journal (None if it cannot be read)."""
        entry = self.journal.load(seq, delivery_count)  # type: ignore[union-attr]  # set only with a journal
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

    def check_consumer_arguments(self, arguments: dict[str, Any]) -> None:
        rules = queue_type_rules.rules_for(self.settings.queue_type)
        if "x-stream-offset" in arguments and rules.name != queue_type_rules.STREAM:
            raise QueueTypeRefusal(406, f"invalid arg 'x-stream-offset' for queue '{self.name}' in vhost "
                                        f"'{self.vhost}' of queue type {rules.module}")

    def exclusive_use_refused(self, exclusive: bool) -> bool:
        return self.has_exclusive_consumer() or (exclusive and self.consumer_count > 0)

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
            entry: QueueEntry | None  # (None: pop_unexpired found only expired messages)
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
                    # (expiring: `now` is set)
                    entry = pop_unexpired(self, now) if expiring else ready.pop()  # type: ignore[arg-type]
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
                    # (persisted implies a journal)
                    (journal.acked if no_ack else journal.delivered)(entry)  # type: ignore[union-attr]
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
            # (persisted implies a journal)
            if entry.state == GONE:  # fetched with no_ack: that was its last delivery
                self.journal.acked(entry)  # type: ignore[union-attr]
            else:
                self.journal.delivered(entry)  # type: ignore[union-attr]

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
            self.journal.acked(entry)  # type: ignore[union-attr]  # persisted implies a journal

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
            self.journal.requeued(entry)  # type: ignore[union-attr]  # persisted implies a journal
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
