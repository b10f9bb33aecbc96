"""TTL of paged-out messages: a durable queue's backlog beyond the memory budget, and what it
recovers after a restart, expires where it is, on time, without a consumer (a real journal)."""

from __future__ import annotations

import heapq
import random
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from persistence.queue_store import QueueStore
from queues.consumer import Consumer
from queues.journal import QueueJournal
from queues.memory_budget import MemoryBudget
from queues.paged_expiry import ExpiryHeap
from queues.queue import Queue
from queues.ready_messages import KEEP_PER_QUEUE
from queues.timers import Timers
from tests.test_lifecycle_durable import Clock, persistent
from tests.test_queue_dispatch import FakeSink

BACKLOG = KEEP_PER_QUEUE + 200  # the first KEEP_PER_QUEUE stay in memory, the rest page out


def open_queue(directory: Path, clock: Clock, arguments: dict, dead_letters: list | None = None) -> Queue:
    store = QueueStore.for_queue(directory, "/", "q")
    queue = Queue(
        "q", "/", durable=True, arguments=arguments, timers=Timers(clock),
        journal=QueueJournal(store, None), memory_budget=MemoryBudget(limit=0),
    )
    if dead_letters is not None:
        queue.dead_letterer = lambda _queue, entries, reason: dead_letters.extend(
            (entry.message.body, reason) for entry in entries
        )
    queue.recover()
    return queue


def advance(queue: Queue, clock: Clock, seconds: float) -> None:
    clock.now += seconds
    queue.timers.run_due(clock.now)


def drain(queue: Queue) -> list[bytes]:
    bodies = []
    while (entry := queue.get(no_ack=True)) is not None:
        bodies.append(entry.message.body)
    return bodies


def test_a_paged_out_backlog_expires_on_time_without_a_consumer(tmp_path):
    clock = Clock()
    dead_letters: list = []
    queue = open_queue(tmp_path, clock, {"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"}, dead_letters)
    for n in range(BACKLOG):
        queue.publish(persistent(b"m%d" % n, clock))
    assert queue.ready.in_memory == KEEP_PER_QUEUE and queue.message_count == BACKLOG, "the rest is paged out"

    advance(queue, clock, 0.9)
    assert queue.message_count == BACKLOG
    advance(queue, clock, 0.2)
    assert queue.message_count == 0
    assert dead_letters == [(b"m%d" % n, "expired") for n in range(BACKLOG)]
    queue.journal.close()

    # They were journaled as dead-lettered: a restart does not bring them back.
    assert open_queue(tmp_path, clock, {"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"}).message_count == 0


def test_a_per_message_expiration_deep_in_the_backlog_leaves_from_the_middle(tmp_path):
    clock = Clock()
    queue = open_queue(tmp_path, clock, {})
    for n in range(BACKLOG):
        properties = {"expiration": "500"} if n % 10 == 5 else {}
        queue.publish(persistent(b"m%d" % n, clock, **properties))

    advance(queue, clock, 0.6)
    survivors = [b"m%d" % n for n in range(BACKLOG) if n % 10 != 5]
    assert queue.message_count == len(survivors)
    assert queue.ready.bytes == sum(len(body) for body in survivors)
    assert drain(queue) == survivors


def test_a_consumer_never_gets_a_paged_out_message_after_its_ttl(tmp_path):
    clock = Clock()
    queue = open_queue(tmp_path, clock, {"x-message-ttl": 1000})
    for n in range(KEEP_PER_QUEUE):
        queue.publish(persistent(b"early%d" % n, clock))
    clock.now += 0.5
    for n in range(200):
        queue.publish(persistent(b"late%d" % n, clock))  # paged out: the in-memory ones fill the queue's share
    advance(queue, clock, 0.6)  # the in-memory ones expired; the paged-out ones have 0.4 s left
    assert queue.message_count == 200
    clock.now += 1  # past their TTL, but no timer has run: only the head check can stop them
    sink = FakeSink()
    queue.add_consumer(Consumer("ctag", queue, sink, no_ack=True))
    assert sink.delivered == []
    assert queue.message_count == 0


def test_recovered_messages_expire_on_time_and_those_due_during_the_downtime_at_once(tmp_path):
    clock = Clock()
    queue = open_queue(tmp_path, clock, {})
    for n in range(BACKLOG):
        expiration = {0: "1000", 1: "60000"}.get(n % 3)
        queue.publish(persistent(b"m%d" % n, clock, **({"expiration": expiration} if expiration else {})))
    queue.journal.close()

    clock.now += 5  # down for 5 s: the 1 s ones are past their time
    dead_letters: list = []
    queue = open_queue(tmp_path, clock, {"x-dead-letter-exchange": "dlx"}, dead_letters)
    assert queue.message_count == BACKLOG
    advance(queue, clock, 0)
    assert sorted(dead_letters) == sorted((b"m%d" % n, "expired") for n in range(BACKLOG) if n % 3 == 0)
    assert queue.message_count == BACKLOG - len(dead_letters)

    advance(queue, clock, 56)
    assert drain(queue) == [b"m%d" % n for n in range(BACKLOG) if n % 3 == 2]


def test_recovered_messages_of_a_priority_queue_expire_from_every_level(tmp_path):
    clock = Clock()
    arguments = {"x-max-priority": 5, "x-message-ttl": 1000}
    queue = open_queue(tmp_path, clock, arguments)
    for n in range(BACKLOG):
        queue.publish(persistent(b"m%d" % n, clock, priority=n % 6))
    queue.journal.close()

    queue = open_queue(tmp_path, clock, arguments)
    assert queue.message_count == BACKLOG
    advance(queue, clock, 1.1)
    assert queue.message_count == 0


def test_purged_messages_leave_no_expiry_behind(tmp_path):
    clock = Clock()
    dead_letters: list = []
    queue = open_queue(tmp_path, clock, {"x-dead-letter-exchange": "dlx"}, dead_letters)
    for n in range(BACKLOG):
        queue.publish(persistent(b"old%d" % n, clock, expiration="1000"))
    assert queue.purge() == BACKLOG
    assert len(queue.paged_expiry) == 0, "nothing is left to wake up for"
    for n in range(BACKLOG):
        queue.publish(persistent(b"new%d" % n, clock))
    advance(queue, clock, 2)
    assert dead_letters == [] and queue.message_count == BACKLOG


@given(st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), st.integers(0, 2**63)), max_size=200))
def test_the_expiry_heap_pops_in_the_order_heapq_would(items):
    heap = ExpiryHeap()
    reference: list = []
    for expires_at, seq in items:
        heap.push(expires_at, seq)
        heapq.heappush(reference, (expires_at, seq))
    popped = []
    while heap:
        expires_at = heap.earliest()
        popped.append((expires_at, heap.pop()))
    assert popped == [heapq.heappop(reference) for _ in range(len(items))]


def test_the_expiry_heap_returns_each_seq_once():
    heap = ExpiryHeap()
    seqs = list(range(1000))
    random.Random(7).shuffle(seqs)
    for seq in seqs:
        heap.push(float(seq % 17), seq)
    out = [heap.pop() for _ in range(1000)]
    assert sorted(out) == list(range(1000)) and len(heap) == 0
