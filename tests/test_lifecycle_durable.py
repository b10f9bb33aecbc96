"""Waiting messages, TTLs and delivered messages of durable queues across a restart (a real journal in tmp_path)."""

from __future__ import annotations

import time
from pathlib import Path

from pamqp import commands

from persistence.queue_store import QueueStore
from queues.consumer import Consumer
from queues.delays.delayed_retry import FAILED
from queues.journal import QueueJournal
from queues.message import Message, content_header
from queues.queue import Queue
from queues.timers import Timers


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def open_queue(directory: Path, clock: Clock, arguments: dict) -> Queue:
    store = QueueStore.for_queue(directory, "/", "q")
    queue = Queue("q", "/", durable=True, arguments=arguments, timers=Timers(clock), journal=QueueJournal(store, None))
    queue.recover()
    return queue


def persistent(body: bytes, clock: Clock, **properties) -> Message:
    raw = commands.Basic.Properties(delivery_mode=2, **properties).marshal()
    message = Message("", "q", content_header(len(body), raw), body)
    message.published_at = clock.now
    return message


def stop(queue: Queue) -> None:
    queue.journal.close()


def reject_once(queue: Queue) -> None:
    entry = queue.get(no_ack=False)
    queue.after_get(entry)
    queue.requeue([(entry, None)], FAILED)


RETRY = {"x-delayed-retry-type": "failed", "x-delayed-retry-min": 60_000}


def test_a_waiting_message_survives_a_restart_and_comes_back_at_its_due_time(tmp_path):
    clock = Clock()
    queue = open_queue(tmp_path, clock, RETRY)
    queue.publish(persistent(b"job", clock))
    reject_once(queue)
    assert queue.waiting_count == 1
    stop(queue)

    clock.now += 30
    queue = open_queue(tmp_path, clock, RETRY)
    assert (queue.message_count, queue.waiting_count) == (0, 1)
    clock.now += 29
    queue.timers.run_due(clock.now)
    assert queue.message_count == 0
    clock.now += 2
    queue.timers.run_due(clock.now)
    assert (queue.message_count, queue.waiting_count) == (1, 0)
    entry = queue.get(no_ack=True)
    assert (entry.message.body, entry.redelivered, entry.delivery_count) == (b"job", True, 1)


def test_a_message_due_during_the_downtime_is_ready_at_once(tmp_path):
    clock = Clock()
    queue = open_queue(tmp_path, clock, RETRY)
    queue.publish(persistent(b"first", clock))
    queue.publish(persistent(b"second", clock))
    reject_once(queue)
    assert (queue.message_count, queue.waiting_count) == (1, 1)  # "first" waits: the restart must bring it back
    stop(queue)

    clock.now += 3600
    queue = open_queue(tmp_path, clock, RETRY)
    assert (queue.message_count, queue.waiting_count) == (2, 0)
    assert queue.get(no_ack=True).message.body == b"first"  # back at its original position


def test_a_waiting_message_that_came_back_is_not_waiting_after_the_next_restart(tmp_path):
    clock = Clock()
    queue = open_queue(tmp_path, clock, RETRY)
    queue.publish(persistent(b"job", clock))
    reject_once(queue)
    assert (queue.message_count, queue.waiting_count) == (0, 1)
    clock.now += 61
    queue.timers.run_due(clock.now)
    assert queue.message_count == 1
    stop(queue)

    queue = open_queue(tmp_path, clock, RETRY)
    assert (queue.message_count, queue.waiting_count) == (1, 0)


def test_recovered_messages_of_a_ttl_queue_expire_on_time_without_a_consumer(tmp_path):
    clock = Clock()
    arguments = {"x-message-ttl": 5000}
    queue = open_queue(tmp_path, clock, arguments)
    for n in range(3):
        queue.publish(persistent(b"%d" % n, clock))
        clock.now += 1
    stop(queue)

    queue = open_queue(tmp_path, clock, arguments)
    assert queue.message_count == 3
    clock.now += 2.5  # 5.5 s after the first publish: only the first has expired
    queue.timers.run_due(clock.now)
    assert queue.message_count == 2
    clock.now += 2
    queue.timers.run_due(clock.now)
    assert queue.message_count == 0
    assert queue.stats.dead_lettered_expired == 3


def test_a_priority_queue_recovers_each_message_at_its_priority(tmp_path):
    clock = Clock()
    arguments = {"x-max-priority": 5}
    queue = open_queue(tmp_path, clock, arguments)
    for body, priority in ((b"low", 1), (b"high", 5), (b"mid", 3)):
        queue.publish(persistent(body, clock, priority=priority))
    stop(queue)

    queue = open_queue(tmp_path, clock, arguments)
    assert [queue.get(no_ack=True).message.body for _ in range(3)] == [b"high", b"mid", b"low"]


class _Taker:
    """A consumer's channel with room for everything: remembers the bodies it was sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, entry) -> None:
        self.bodies.append(entry.message.body)

    def consumer_cancelled(self, consumer: Consumer) -> None:
        pass


def _publish_to_waiting_consumer(tmp_path, clock, body: bytes, *, no_ack: bool, prefetch_count: int):
    """Open the durable queue, attach a consumer, then publish one persistent message: the
    message goes straight to the consumer (Queue.publish's direct hand-off)."""
    queue = open_queue(tmp_path, clock, {})
    taker = _Taker()
    queue.add_consumer(Consumer("c", queue, taker, no_ack=no_ack, prefetch_count=prefetch_count))
    queue.publish(persistent(body, clock))
    return queue, taker


def test_a_message_handed_straight_to_a_consumer_and_not_acked_comes_back_redelivered(tmp_path):
    # The consumer is there before the publish: the message goes to it without the ready list
    # (Queue.publish's direct hand-off), and must be journaled as delivered all the same.
    clock = Clock()
    queue, taker = _publish_to_waiting_consumer(tmp_path, clock, b"held", no_ack=False, prefetch_count=1)
    assert (taker.bodies, queue.message_count, queue.unacked_count) == ([b"held"], 0, 1)
    stop(queue)  # the broker stops while the consumer still holds it

    queue = open_queue(tmp_path, clock, {})
    entry = queue.get(no_ack=True)
    assert (entry.message.body, entry.redelivered, entry.delivery_count) == (b"held", True, 1)


def test_a_message_handed_straight_to_a_no_ack_consumer_does_not_come_back(tmp_path):
    clock = Clock()
    queue, taker = _publish_to_waiting_consumer(tmp_path, clock, b"taken", no_ack=True, prefetch_count=0)
    assert taker.bodies == [b"taken"]
    stop(queue)

    queue = open_queue(tmp_path, clock, {})
    assert queue.message_count == 0
