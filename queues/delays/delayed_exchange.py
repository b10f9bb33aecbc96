"""Messages an x-delayed-message exchange holds until their x-delay passes.

The exchange type itself (exchanges/delayed.py) only routes like its x-delayed-type; holding
is here. `hold_delayed_messages` gives a new delayed exchange its `DelayedMessages` (and
recovers what its store held). Routing treats a `DelayedMessages` like a queue: the vhost
routes a message with a positive x-delay that reaches a delayed exchange here instead of
through its bindings, and `publish` holds it. When it is due, `route_released` routes it
through the exchange's bindings as they are then (nothing, if the exchange was deleted
meanwhile), with x-delay negated as the plugin does (so it is not delayed again) and its
publish time reset (a queue's TTL counts from then).

Pending messages are a heap of integers `due_ms << 40 | seq` (about 44 bytes each); the
message itself stays in memory only when it is not journaled. A durable exchange journals its
persistent messages in a QueueStore under the reserved internal name
`amq.x-delayed-message.<exchange>` (a queue name no client can declare): a message record,
then a `waiting_retry` state record carrying the due time; `acked` once it was routed,
`dropped` when nothing took it. So pending messages survive a restart and are released at
their due time, or at once when it passed while the broker was down. Any delay is allowed
(no 2^32-1 ms ceiling): due times are 64-bit milliseconds.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from queues.journal import QueueJournal
from queues.message import CONTENT_HEADER_PREFIX_SIZE, Message, QueueEntry
from queues.raw_properties import RawProperties
from queues.publish_outcome import ENQUEUED, ENQUEUED_DURABLY, WRITE_FAILED
from queues.timers import Deadline, Timers

DELAY_HEADER = "x-delay"
STORE_PREFIX = "amq.x-delayed-message."
_SEQ_BITS = 40
_SEQ_MASK = (1 << _SEQ_BITS) - 1
RELEASE_BATCH = 10_000  # messages released per timer run before yielding to the event loop

# Routes a released message; returns True if any queue took it.
Release = Callable[[Message], bool]

log = logging.getLogger(__name__)


class DelayingExchange(Protocol):
    """An x-delayed-message exchange (exchanges.delayed.DelayedMessageExchange)."""

    name: str
    durable: bool
    pending: "DelayedMessages | None"

    def hold_in(self, pending: "DelayedMessages") -> None: ...


class Vhost(Protocol):
    """What holding and releasing need of the vhost (amqp_server.broker.vhost.VirtualHost)."""

    name: str
    timers: Timers

    @property
    def exchanges(self) -> Mapping[str, Any]: ...  # read only: a vhost's dict of its Exchanges

    journal_factory: Callable[[str, str, bool], QueueJournal] | None

    def route(self, exchange: Any, message: Message, routing_keys: Collection[str] | None = None) -> Collection[Any]:
        ...


def hold_delayed_messages(vhost: Vhost, exchange: DelayingExchange) -> None:
    """Give a new delayed exchange the store its held messages wait in, and recover them."""
    journal = None
    if exchange.durable and vhost.journal_factory is not None:
        journal = vhost.journal_factory(vhost.name, store_name(exchange.name), False)
    pending = DelayedMessages(
        exchange.name, vhost.timers, lambda message: route_released(vhost, exchange, message), journal
    )
    recovered = pending.recover()
    if recovered:
        log.info("recovered %d delayed messages of exchange '%s' in vhost '%s'", recovered, exchange.name, vhost.name)
    exchange.hold_in(pending)


def route_released(vhost: Vhost, exchange: DelayingExchange, message: Message) -> bool:
    """A delayed message is due: route it through the exchange's bindings as they are now.

    Returns whether any queue took it.
    """
    if vhost.exchanges.get(exchange.name) is not exchange:
        return False
    targets = list(vhost.route(exchange, message))
    for target in targets:
        target.publish(message)
    return bool(targets)


def delay_of(headers: dict[str, Any] | None) -> int:
    """The delay in ms an x-delay header asks for; 0 when there is none or it is not positive.

    Integers are taken as they are, text is parsed and a float truncated, as the plugin does;
    anything else means no delay.
    """
    if not headers:
        return 0
    value = headers.get(DELAY_HEADER)
    if value is None or isinstance(value, bool):
        return 0
    if isinstance(value, int):
        delay = value
    elif isinstance(value, float):
        delay = int(value)
    elif isinstance(value, (str, bytes)):
        try:
            delay = int(value)
        except ValueError:
            return 0
    else:
        return 0
    return delay if delay > 0 else 0


def store_name(exchange: str) -> str:
    """The internal queue-store name that journals a durable delayed exchange's messages."""
    return STORE_PREFIX + exchange


class DelayedMessages:
    """The pending messages of one delayed exchange; see the module docstring."""

    congested = False  # routing asks every destination; holding never pushes back on publishers
    home_node = ""  # held on this node (a transaction asks where each destination lives)

    def __init__(self, name: str, timers: Timers, release: Release, journal: QueueJournal | None = None) -> None:
        self.name = name
        self.release = release
        self.journal = journal
        self.timers = timers
        self._due: list[int] = []
        self._held: dict[int, Message] = {}  # seq -> message, for messages not journaled
        self._next_seq = 1
        self.deadline = Deadline(timers, self.release_due)

    def __len__(self) -> int:
        return len(self._due)

    def recover(self) -> int:
        """Take back the journaled pending messages (at startup); returns how many."""
        if self.journal is None:
            return 0
        recovery = self.journal.store.recover()
        now_ms = self._now_ms()
        self._due = [
            ((message.due_at_ms if message.due_at_ms is not None else now_ms) << _SEQ_BITS) | message.seq
            for message in recovery
        ]
        heapq.heapify(self._due)
        self._next_seq = recovery.next_seq
        self._rearm(now_ms)
        return len(self._due)

    def publish(self, message: Message) -> int:
        """Hold `message` (it carries a positive x-delay) until its time; like Queue.publish."""
        delay = delay_of(message.headers)
        due_ms = int(message.published_at * 1000) + delay
        seq = self._next_seq
        self._next_seq = seq + 1
        if self.journal is not None and message.is_persistent:
            entry = QueueEntry(message, seq, persisted=True)
            if not self.journal.published(entry):
                return WRITE_FAILED  # nothing written (queues/journal.py): the publisher gets a nack
            self.journal.waiting(entry, due_ms)
            outcome = ENQUEUED_DURABLY
        else:
            self._held[seq] = message
            message.forget_decoded_properties()  # held for long: keep only its raw bytes
            outcome = ENQUEUED
        heapq.heappush(self._due, (due_ms << _SEQ_BITS) | seq)
        self.deadline.arm(due_ms / 1000.0)
        return outcome

    def when_stored(self, callback: Callable[[OSError | None], None]) -> None:
        """Like Queue.when_stored: once the journal holding what was published here is fsynced."""
        # Only after a hold that journaled (ENQUEUED_DURABLY): there is a journal.
        self.journal.request_sync(callback)  # type: ignore[union-attr]

    def release_due(self) -> None:
        """Timer callback: route the messages whose time has come (a batch at a time)."""
        now_ms = self._now_ms()
        due = self._due
        limit = (now_ms + 1) << _SEQ_BITS
        released = 0
        while due and due[0] < limit and released < RELEASE_BATCH:
            seq = heapq.heappop(due) & _SEQ_MASK
            released += 1
            message = self._held.pop(seq, None)
            journaled = message is None
            # A message not held here was journaled: there is a journal.
            if message is None:
                message = self.journal.load_message(seq)  # type: ignore[union-attr]
                if message is None:
                    continue
            routed = self.release(_released_copy(message, now_ms / 1000.0))
            if journaled:
                self.journal.settled(seq, "acked" if routed else "dropped", now_ms)  # type: ignore[union-attr]
        self._rearm(now_ms, released >= RELEASE_BATCH)

    def _rearm(self, now_ms: int, batch_full: bool = False) -> None:
        if self._due:
            due_ms = self._due[0] >> _SEQ_BITS
            if batch_full:
                due_ms = max(due_ms, now_ms + 1)  # more are due: continue after other work
            self.deadline.arm(due_ms / 1000.0)

    def _now_ms(self) -> int:
        return int(self.timers.now() * 1000)

    def delete(self) -> None:
        """The exchange was deleted: its pending messages go, and so do their files."""
        self.deadline.disarm()
        self._due.clear()
        self._held.clear()
        if self.journal is not None:
            self.journal.delete()

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()


def _released_copy(message: Message, now: float) -> Message:
    """The message as routed when due: x-delay negated (a signed 32-bit integer, as the plugin
    writes it, 64-bit beyond that), published now; the other headers keep their bytes."""
    negated = -delay_of(message.headers)
    encoded = b"I" + struct.pack(">i", negated) if negated >= -(1 << 31) else b"l" + struct.pack(">q", negated)
    raw = RawProperties(message.raw_header[CONTENT_HEADER_PREFIX_SIZE:])
    raw.set_header_fields(
        [(name, encoded if name == DELAY_HEADER else value) for name, value in raw.header_fields()]
    )
    copy = message.with_raw_properties(raw.encode())
    copy.published_at = now
    return copy
