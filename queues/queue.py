"""A queue: ready messages, consumers, fair dispatch, and what acks and rejects do.

Dispatch is synchronous and cheap: whenever a message arrives, a consumer appears or a
consumer gains room (an ack, a new basic.qos, a socket that drained), `dispatch()` hands ready
messages to consumers that have room, highest consumer priority first and round-robin within a
priority, until messages or room run out. No task or future is created per message.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from queues import dead_letter
from queues.arguments import QueueArguments
from queues.consumer import Consumer
from queues.deduplication import DeduplicationCache
from queues.delayed_retry import DelayedRetry, retry_delay_ms
from queues.journal import QueueJournal
from queues.memory_budget import KEEP_PER_QUEUE, MemoryBudget
from queues.message import FLAG_EXPIRATION, Message
from queues.priority_ready_messages import PriorityReadyMessages
from queues.queue_entry import GONE, READY, QueueEntry
from queues.ready_messages import ReadyMessages
from queues.recovered_expiry import RecoveredExpiry
from queues.single_active_consumer import ActiveConsumer
from queues.timers import Timer, Timers

# Flow control: while a queue that has consumers holds more than FLOW_HIGH ready messages,
# publishers into it are paused until it drains below FLOW_LOW. Like RabbitMQ's credit flow,
# this keeps a fast publisher from taking all of the broker's time from the consumers that
# would drain the queue; without consumers the queue just grows (memory alarms handle that).
FLOW_HIGH = 2000
FLOW_LOW = 1000

# What Queue.publish reports.
REJECTED = 0  # x-overflow reject-publish at the length limit: the publisher gets a nack
ENQUEUED = 1
ENQUEUED_DURABLY = 2  # written to the journal: a confirm must wait for its fsync
DUPLICATE = 3  # x-message-deduplication saw its id recently: accepted (confirmed), not enqueued

# Called to dead-letter entries that left `queue` for `reason` (set by the vhost, which routes).
DeadLetterer = Callable[["Queue", list[QueueEntry], str], None]


class QueueStats:
    """Plain integer counters, read at scrape time (no library call per message)."""

    __slots__ = (
        "published", "delivered", "delivered_no_ack", "redelivered", "acked", "get", "get_no_ack", "get_empty",
        "dead_lettered_expired", "dead_lettered_rejected", "dead_lettered_maxlen", "dead_lettered_delivery_limit",
    )

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def add(self, other: "QueueStats") -> None:
        """Fold another queue's counters into these (a deleted queue's history stays counted)."""
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Queue:
    """One queue of one vhost.

    `exclusive_owner` is the connection that owns an exclusive queue (None otherwise): the
    queue itself only compares it by identity.

    This class coordinates; each lifecycle feature lives in its own module: delayed retry
    (delayed_retry.py, retry_lanes.py), priorities (priority_ready_messages.py), single active
    consumer (single_active_consumer.py), deduplication (deduplication.py), dead-lettering
    (dead_letter.py), TTL of recovered messages (recovered_expiry.py). docs/lifecycle.md.
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
    ) -> None:
        """Raises queues.arguments.InvalidArgument for x-arguments RabbitMQ would refuse.

        `defaults` are x-arguments from the configuration ([[queue_defaults]]); the queue's own
        `arguments` win over them.
        """
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.settings = settings = QueueArguments.parse(self.arguments, defaults)
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
        self.dedup: DeduplicationCache | None = None
        if settings.deduplication:
            self.dedup = DeduplicationCache(settings.dedup_cache_size, settings.dedup_cache_ttl_ms, settings.dedup_header)
            self.publish = self._publish_once  # type: ignore[method-assign]
        self.single_active: ActiveConsumer | None = None
        if settings.single_active_consumer:
            self.single_active = ActiveConsumer()
            self._next_consumer = self.single_active.next_with_room  # type: ignore[method-assign]
        self._recovered_expiry: RecoveredExpiry | None = None
        self.unacked_count = 0
        self.stats = QueueStats()
        self.deleted = False
        # Called with the queue when an auto-delete queue loses its last consumer.
        self.on_unused: Callable[[Queue], None] | None = None
        # Called with the queue when its x-expires time passes without use.
        self.on_unused_expired: Callable[[Queue], None] | None = None
        self._next_seq = 1
        self._groups: list[tuple[int, deque[Consumer]]] = []
        self._consumer_count = 0
        self._had_consumers = False
        self._dispatching = False
        # (expires_at, seq, entry) of ready messages that can expire; one timer for the earliest.
        self._expiry_heap: list[tuple[float, int, QueueEntry]] = []
        self._expiry_timer: Timer | None = None
        self._unused_timer: Timer | None = None
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
        return [consumer for _priority, group in self._groups for consumer in group]

    # -- messages in -------------------------------------------------------------------

    def publish(self, message: Message) -> int:
        """Enqueue a routed message and deliver it if a consumer has room.

        Returns REJECTED when the queue refused it (x-overflow reject-publish at its length
        limit: the publisher gets a basic.nack), ENQUEUED_DURABLY when it went to the journal
        (a confirm waits for the fsync), ENQUEUED otherwise.
        """
        settings = self.settings
        limited = settings.max_length is not None or settings.max_length_bytes is not None
        if limited and settings.overflow != "drop-head" and self._over_limit(1, len(message.body)):
            if settings.overflow == "reject-publish-dlx":
                self._dead_letter([QueueEntry(message, 0)], dead_letter.MAXLEN)
            return REJECTED
        expires_at = self._expiry_of(message)
        entry = QueueEntry(message, self._next_seq, expires_at)
        self._next_seq += 1
        self.stats.published += 1
        if self.journal is not None and message.is_persistent:
            self.journal.published(entry)
            if self._should_page():
                # Memory is tight and a consumer will not want it soon: keep it on disk only.
                self.ready.page(entry)
                return ENQUEUED_DURABLY
            outcome = ENQUEUED_DURABLY
        else:
            outcome = ENQUEUED
        self.ready.append(entry)
        if expires_at:
            self._track_expiry(entry)
        if self._consumer_count:
            # Judge expiry at publish time: a TTL of 0 still reaches a consumer that has room.
            self.dispatch(message.published_at)
        if limited:
            self._drop_head_over_limit()
        return outcome

    def _publish_once(self, message: Message) -> int:
        """publish() of a queue with x-message-deduplication: a recently seen id is not enqueued."""
        dedup = self.dedup
        key = dedup.id_of(message)
        if key is None:
            return Queue.publish(self, message)
        if dedup.is_duplicate(key, message.published_at):
            return DUPLICATE
        outcome = Queue.publish(self, message)
        if outcome != REJECTED:
            dedup.remember(key, message, message.published_at)
        return outcome

    def _should_page(self) -> bool:
        ready = self.ready
        return ready.in_memory >= KEEP_PER_QUEUE and (ready.budget.exhausted or len(ready) > ready.in_memory)

    def load_paged(self, seq: int, delivery_count: int) -> QueueEntry | None:
        """Read a paged-out message back from the journal (None if it cannot be read)."""
        entry = self.journal.load(seq, delivery_count)
        if entry is not None:
            entry.expires_at = self._expiry_of(entry.message)
        return entry

    def recover(self) -> int:
        """Take back the journaled messages (at startup), paged out; returns how many came back.

        They are read from disk as they near the head of the queue, so recovering a long
        queue costs its index, not its messages. A message that was waiting for a delayed
        retry waits again until its due time, or is ready at once if that passed meanwhile.
        """
        if self.journal is None:
            return 0
        recovered, self._next_seq = self.journal.recover()
        now_ms = int(self.timers.now() * 1000)
        waiting: list[tuple[int, int, int]] = []
        by_priority = isinstance(self.ready, PriorityReadyMessages)
        for seq, delivery_count, size, due_ms in recovered:
            if due_ms is not None and due_ms > now_ms:
                waiting.append((seq, delivery_count, due_ms))
            elif by_priority:
                # Its level depends on its properties: read it once to know (priority queues only).
                entry = self.journal.load(seq, delivery_count)
                if entry is not None:
                    self.ready.page(entry)
            else:
                self.ready.append_paged(seq, delivery_count, size)
        if waiting:
            self._delayed_retry().recover(waiting)
        if self.settings.message_ttl_ms is not None and len(self.ready) and not by_priority:
            # Recovered messages are paged out, so no expiry timer knows them: expire from the head.
            self._recovered_expiry = RecoveredExpiry(self, self._next_seq)
        return len(recovered)

    # -- length limits -----------------------------------------------------------------

    def _over_limit(self, extra_messages: int, extra_bytes: int) -> bool:
        settings = self.settings
        if settings.max_length is not None and len(self.ready) + extra_messages > settings.max_length:
            return True
        limit = settings.max_length_bytes
        return limit is not None and self.ready.bytes + extra_bytes > limit

    def _drop_head_over_limit(self) -> None:
        dropped = []
        while self.ready and self._over_limit(0, 0):
            entry = self.ready.pop()
            entry.state = GONE
            dropped.append(entry)
        self._dead_letter(dropped, dead_letter.MAXLEN)

    # -- expiry ------------------------------------------------------------------------

    def _expiry_of(self, message: Message) -> float:
        ttl_ms = self.settings.message_ttl_ms
        if message.property_flags & FLAG_EXPIRATION:
            try:
                per_message = int(message.properties.expiration)
            except (TypeError, ValueError):
                per_message = None
            if per_message is not None and (ttl_ms is None or per_message < ttl_ms):
                ttl_ms = per_message
        if ttl_ms is None:
            return 0.0
        return message.published_at + ttl_ms / 1000.0

    def _track_expiry(self, entry: QueueEntry) -> None:
        heap = self._expiry_heap
        heapq.heappush(heap, (entry.expires_at, entry.seq, entry))
        if heap[0][2] is entry:
            if self._expiry_timer is not None:
                self._expiry_timer.cancel()
            self._expiry_timer = self.timers.call_at(entry.expires_at, self.expire_due)

    def expire_due(self, now: float | None = None) -> int:
        """Remove (or dead-letter) every ready message whose TTL has passed; returns how many."""
        now = self.timers.now() if now is None else now
        heap = self._expiry_heap
        expired = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.state == READY:
                self.ready.remove(entry)
                expired.append(entry)
        self._expiry_timer = None
        if heap and not self.deleted:
            self._expiry_timer = self.timers.call_at(heap[0][0], self.expire_due)
        self._dead_letter(expired, dead_letter.EXPIRED)
        return len(expired)

    def _pop_live(self, now: float) -> QueueEntry | None:
        """Pop the next ready message, expiring any at the head whose time has come."""
        ready = self.ready
        while ready:
            entry = ready.pop()
            if entry.expires_at and entry.expires_at < now:
                entry.state = GONE
                self._dead_letter([entry], dead_letter.EXPIRED)
                continue
            return entry
        return None

    # -- dead-lettering ----------------------------------------------------------------

    def _dead_letter(self, entries: list[QueueEntry], reason: str) -> None:
        """Entries left the queue for `reason`: count them, journal it, and republish them if
        there is a dead-letter exchange."""
        if not entries:
            return
        counter = "dead_lettered_" + reason
        setattr(self.stats, counter, getattr(self.stats, counter) + len(entries))
        has_dlx = self.dead_letterer is not None and self.settings.dead_letter_exchange is not None
        if self.journal is not None:
            for entry in entries:
                if entry.persisted:
                    self.journal.removed(entry, reason, has_dlx)
        if has_dlx:
            self.dead_letterer(self, entries, reason)

    # -- consumers ---------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        for priority, group in self._groups:
            if priority == consumer.priority:
                group.append(consumer)
                break
        else:
            self._groups.append((consumer.priority, deque([consumer])))
            self._groups.sort(key=lambda item: -item[0])
        self._consumer_count += 1
        self._had_consumers = True
        if self.single_active is not None:
            self.single_active.add(consumer)
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        for index, (_priority, group) in enumerate(self._groups):
            if consumer in group:
                group.remove(consumer)
                self._consumer_count -= 1
                if not group:
                    del self._groups[index]
                break
        else:
            return
        if self.single_active is not None:
            self.single_active.remove(consumer)
        if not self._consumer_count:
            self.release_flow()
            self.touch()
        if self.auto_delete and self._had_consumers and not self._consumer_count and self.on_unused:
            self.on_unused(self)

    def has_exclusive_consumer(self) -> bool:
        return any(consumer.exclusive for consumer in self.consumers())

    def dispatch(self, now: float | None = None) -> None:
        """Deliver ready messages to consumers with room, in fair (round-robin) order.

        Messages whose TTL passed before `now` (default: the current time) are expired instead.
        """
        if self._dispatching or self.deleted:
            return
        self._dispatching = True
        try:
            ready = self.ready
            stats = self.stats
            if self._expiry_heap:
                now = self.timers.now() if now is None else now
            else:
                now = 0.0
            while ready:
                consumer = self._next_consumer()
                if consumer is None:
                    return
                entry = self._pop_live(now) if now else ready.pop()
                if entry is None:
                    return
                if entry.delivery_count:
                    stats.redelivered += 1
                if consumer.no_ack:
                    entry.state = GONE
                    stats.delivered_no_ack += 1
                else:
                    consumer.unacked += 1
                    self.unacked_count += 1
                stats.delivered += 1
                consumer.sink.deliver(consumer, entry)
                entry.delivery_count += 1
                if entry.persisted:
                    # A no-ack delivery is the message's last: journal it as settled.
                    (self.journal.acked if consumer.no_ack else self.journal.delivered)(entry)
        finally:
            self._dispatching = False
            if self.flow_waiters and len(self.ready) < FLOW_LOW:
                self.release_flow()

    @property
    def congested(self) -> bool:
        """True while publishers into this queue should be paused (see FLOW_HIGH)."""
        return self._consumer_count > 0 and len(self.ready) > FLOW_HIGH

    def release_flow(self) -> None:
        waiters = list(self.flow_waiters.values())
        self.flow_waiters.clear()
        for resume in waiters:
            resume()

    def _next_consumer(self) -> Consumer | None:
        for _priority, group in self._groups:
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.has_capacity():
                    return consumer
        return None

    # -- pull --------------------------------------------------------------------------

    def get(self, no_ack: bool) -> QueueEntry | None:
        """basic.get: the next ready message, or None."""
        self.touch()
        entry = self._pop_live(self.timers.now()) if self.ready else None
        if entry is None:
            self.stats.get_empty += 1
            return None
        self.stats.get += 1
        if entry.delivery_count:
            self.stats.redelivered += 1
        if no_ack:
            self.stats.get_no_ack += 1
            entry.state = GONE
        else:
            self.unacked_count += 1
        return entry

    def after_get(self, entry: QueueEntry) -> None:
        entry.delivery_count += 1
        if entry.persisted:
            if entry.state == GONE:  # fetched with no_ack: that was its last delivery
                self.journal.acked(entry)
            else:
                self.journal.delivered(entry)

    # -- settlement --------------------------------------------------------------------

    def settle(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """An unacked delivery is done with (acked, or rejected without requeue)."""
        self.unacked_count -= 1
        entry.state = GONE
        if consumer is not None:
            consumer.unacked -= 1

    def ack(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self.settle(entry, consumer)
        self.stats.acked += 1
        if entry.persisted and not self.deleted:
            self.journal.acked(entry)

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """Rejected without requeue: the message leaves the queue (to its dead-letter exchange)."""
        self.settle(entry, consumer)
        self._dead_letter([entry], dead_letter.REJECTED)

    def requeue(self, entries: Iterable[tuple[QueueEntry, Consumer | None]], cause: str | None = None) -> None:
        """Unacked deliveries come back, then dispatch.

        `cause` is why: delayed_retry.FAILED (reject/nack) or RETURNED (the consumer went away,
        timed out, or basic.recover); None (a management "get" that requeues) neither counts
        towards x-delivery-limit nor waits. A message past its delivery limit is dead-lettered
        (reason delivery_limit); one the queue's delayed retry covers waits; every other one
        goes back to its original position.
        """
        for entry, consumer in entries:
            self.settle(entry, consumer)
            if self.deleted:
                continue
            if cause is not None:
                limit = self.settings.delivery_limit
                if limit is not None and entry.delivery_count > limit:
                    self._dead_letter([entry], dead_letter.DELIVERY_LIMIT)
                    continue
                delay = retry_delay_ms(self.settings, entry.delivery_count, cause)
                if delay:
                    self._delayed_retry().hold(entry, delay)
                    continue
            self._put_back(entry)
        self.dispatch()

    def _put_back(self, entry: QueueEntry) -> None:
        self.ready.put_back(entry)
        if entry.persisted:
            self.journal.requeued(entry)
        if entry.expires_at:
            self._track_expiry(entry)  # a message whose TTL passed meanwhile expires at once

    # -- delayed retry -----------------------------------------------------------------

    def _delayed_retry(self) -> DelayedRetry:
        if self.retry is None:
            self.retry = DelayedRetry(self)
        return self.retry

    def return_from_retry(self, entry: QueueEntry) -> None:
        """A message's retry delay passed: it is ready again at its original position (or expired)."""
        if entry.expires_at and entry.expires_at <= self.timers.now():
            entry.state = GONE
            self._dead_letter([entry], dead_letter.EXPIRED)
            return
        self._put_back(entry)

    def after_retry_release(self) -> None:
        """Messages came back from waiting: enforce the length limit and deliver them."""
        settings = self.settings
        if settings.max_length is not None or settings.max_length_bytes is not None:
            self._drop_head_over_limit()
        self.dispatch()

    # -- queue expiry (x-expires) ------------------------------------------------------

    def touch(self) -> None:
        """The queue was used (declared, consumed from, polled): restart its x-expires clock."""
        expires_ms = self.settings.expires_ms
        if expires_ms is None or self.deleted:
            return
        if self._unused_timer is not None:
            self._unused_timer.cancel()
        self._unused_timer = self.timers.call_later(expires_ms / 1000.0, self._expire_if_unused)

    def _expire_if_unused(self) -> None:
        self._unused_timer = None
        if self.deleted:
            return
        if self._consumer_count:
            return  # consumers keep it alive; removing the last one restarts the clock
        if self.on_unused_expired is not None:
            self.on_unused_expired(self)

    # -- administration ----------------------------------------------------------------

    def purge(self) -> int:
        """Drop every ready message and every message waiting for a retry; return how many."""
        self._expiry_heap.clear()
        if self.journal is not None:
            self.journal.purge()
        waiting = self._clear_waiting()
        return self.ready.clear() + waiting

    def _clear_waiting(self) -> int:
        if self.retry is None:
            return 0
        removed = self.retry.clear()
        for item in removed:
            if item.entry is not None:
                item.entry.state = GONE
        return len(removed)

    def delete(self) -> list[Consumer]:
        """Mark deleted and return the consumers that must be told (basic.cancel)."""
        self.deleted = True
        self.release_flow()
        for timer in (self._expiry_timer, self._unused_timer):
            if timer is not None:
                timer.cancel()
        self._expiry_heap.clear()
        self._clear_waiting()
        if self._recovered_expiry is not None:
            self._recovered_expiry.stop()
        consumers = self.consumers()
        self._groups.clear()
        self._consumer_count = 0
        self.ready.clear()
        if self.journal is not None:
            self.journal.delete()
        return consumers
