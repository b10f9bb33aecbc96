"""What a queue costs CPython's garbage collector: few tracked objects, and no cycle once deleted.

A full (generation 2) collection scans every live tracked object, and pauses every connection
while it does. A broker with 10,000 durable queues used to hold 36 tracked objects per queue, and
each deleted queue was a reference cycle that only such a pass could free: a storm of
declarations or deletions then stalled other clients for 60 to 120 ms (docs/benchmarks.md,
"Durable definition storms"). These tests keep both from coming back.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pamqp import commands

from amqp_server.broker.broker import Broker
from amqp_server.broker.vhost import VirtualHost
from persistence.queue_store import QueueStore
from queues.consumer import Consumer
from queues.delays.delayed_retry import FAILED
from queues.journal import QueueJournal
from queues.memory_budget import MemoryBudget
from queues.message import Message, QueueEntry, content_header
from queues.ready_messages import KEEP_PER_QUEUE
from queues.timers import Timers

QUEUES = 500
# Tracked objects a new durable queue (no arguments) adds, everything the broker keeps for it
# included: the queue, its ready messages, its counters, its journal, its store and the journal's
# loader (it was 36). No slack: each one more is 10,000 more objects for every full pass over a
# broker with 10,000 queues. Raise it knowingly, with the storm benchmark's figures.
TRACKED_PER_DURABLE_QUEUE = 6


@contextmanager
def collector_off() -> Iterator[None]:
    """No automatic collection meanwhile: whatever is freed is freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def tracked_objects() -> int:
    gc.collect()  # tuples and dicts that hold nothing trackable are untracked by a pass
    return len(gc.get_objects())


def test_a_declared_durable_queue_adds_few_objects_for_the_garbage_collector(tmp_path: Path) -> None:
    broker = Broker(message_dir=tmp_path)
    vhost = broker.vhosts["/"]
    vhost.declare_queue("warm-up", connection=None, durable=True)  # first use of every code path
    with collector_off():
        before = tracked_objects()
        for n in range(QUEUES):
            vhost.declare_queue(f"q{n}", connection=None, durable=True)
        per_queue = (tracked_objects() - before) / QUEUES
    assert len(vhost.queues) == QUEUES + 1
    assert per_queue <= TRACKED_PER_DURABLE_QUEUE, f"{per_queue:.1f} tracked objects per durable queue"


# -- a deleted queue is freed at once -------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class SilentSink:
    """A channel stand-in that keeps nothing (so it holds no reference to the queue)."""

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        pass

    def consumer_cancelled(self, consumer: Consumer) -> None:
        pass


def persistent(body: bytes, clock: Clock, **properties: object) -> Message:
    raw = commands.Basic.Properties(delivery_mode=2, **properties).marshal()
    message = Message("", "q", content_header(len(body), raw), body)
    message.published_at = clock.now
    return message


def durable_vhost(directory: Path, clock: Clock) -> VirtualHost:
    """A vhost whose durable queues journal under `directory` and page out past KEEP_PER_QUEUE."""

    def journal_for(vhost: str, queue: str, archive: bool) -> QueueJournal:
        return QueueJournal(QueueStore.for_queue(directory, vhost, queue), None)

    return VirtualHost("/", timers=Timers(clock), journal_factory=journal_for, memory_budget=MemoryBudget(limit=0))


def declared_idle(vhost: VirtualHost, clock: Clock) -> None:
    vhost.declare_queue("q", connection=None, durable=True)


def with_expiring_backlog(vhost: VirtualHost, clock: Clock) -> None:
    """Messages with a TTL, in memory and paged out (both expiry timers armed)."""
    queue, _ = vhost.declare_queue("q", connection=None, durable=True, arguments={"x-message-ttl": 60_000})
    for n in range(KEEP_PER_QUEUE + 10):
        queue.publish(persistent(b"m%d" % n, clock))
    assert queue.paged_expiry is not None and queue.expiry is not None


def with_queue_ttl(vhost: VirtualHost, clock: Clock) -> None:
    vhost.declare_queue("q", connection=None, durable=True, arguments={"x-expires": 60_000})


def with_priorities(vhost: VirtualHost, clock: Clock) -> None:
    queue, _ = vhost.declare_queue("q", connection=None, durable=True, arguments={"x-max-priority": 3})
    for priority in range(4):
        queue.publish(persistent(b"p", clock, priority=priority))


def with_a_message_waiting_for_its_retry(vhost: VirtualHost, clock: Clock) -> None:
    arguments = {"x-delayed-retry-type": "all", "x-delayed-retry-min": 60_000}
    queue, _ = vhost.declare_queue("q", connection=None, durable=True, arguments=arguments)
    queue.publish(persistent(b"r", clock))
    entry = queue.get(no_ack=False)
    queue.after_get(entry)
    queue.requeue([(entry, None)], FAILED)
    assert queue.waiting_count == 1


def with_a_consumer(vhost: VirtualHost, clock: Clock) -> None:
    queue, _ = vhost.declare_queue("q", connection=None, durable=True)
    queue.add_consumer(Consumer("c", queue, SilentSink(), no_ack=True))
    queue.publish(persistent(b"c", clock))


def with_deduplication(vhost: VirtualHost, clock: Clock) -> None:
    queue, _ = vhost.declare_queue("q", connection=None, durable=True, arguments={"x-message-deduplication": True})
    queue.publish(persistent(b"d", clock, message_id="m1"))


@pytest.mark.parametrize(
    "prepare",
    [declared_idle, with_expiring_backlog, with_queue_ttl, with_priorities, with_a_message_waiting_for_its_retry,
     with_a_consumer, with_deduplication],
)
def test_a_deleted_queue_is_freed_by_reference_counting_alone(
    tmp_path: Path, prepare: Callable[[VirtualHost, Clock], None]
) -> None:
    clock = Clock()
    vhost = durable_vhost(tmp_path, clock)
    with collector_off():
        prepare(vhost, clock)
        gone = weakref.ref(vhost.queues["q"])
        vhost.delete_queue(vhost.queues["q"])
        assert gone() is None, f"still referred to by {[type(r).__name__ for r in gc.get_referrers(gone())]}"
    assert not vhost.timers.run_due(clock.now + 3600), "the deleted queue's timers do nothing"
