"""Delayed redelivery and delivery limits on a queue, driven by hand-moved time (no sleeps)."""

from __future__ import annotations

import struct
import time

import pytest

from queues.arguments import InvalidArgument, QueueArguments
from queues.consumer import Consumer
from queues.delays.delayed_retry import FAILED, RETURNED, retry_delay_ms
from queues.message import Message
from queues.queue import Queue
from queues.delays.retry_lanes import RetryLanes
from queues.timers import Timers
from tests.test_queue_dispatch import FakeSink, publish


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def retry_queue(clock: Clock, **arguments) -> Queue:
    args = {"x-delayed-retry-type": "all", "x-delayed-retry-min": 1000}
    args.update(arguments)
    return Queue("q", "/", arguments=args, timers=Timers(clock))


def take(sink: FakeSink, body: bytes):
    for index, (consumer, entry) in enumerate(sink.unacked):
        if entry.message.body == body:
            return sink.unacked.pop(index)
    raise AssertionError(f"{body!r} is not unacked")


def give_back(sink: FakeSink, body: bytes, cause: str = FAILED) -> None:
    consumer, entry = take(sink, body)
    consumer.queue.requeue([(entry, consumer)], cause)


def advance(queue: Queue, clock: Clock, seconds: float) -> None:
    clock.now += seconds
    queue.timers.run_due(clock.now)


# -- the delay ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "count", "expected"),
    [("linear", 1, 1000), ("linear", 3, 3000), ("linear", 9, 5000), ("exponential", 1, 1000),
     ("exponential", 3, 4000), ("exponential", 60, 5000)],
)
def test_backoff_is_min_times_count_or_doubling_capped_at_max(backoff, count, expected):
    settings = QueueArguments.parse({
        "x-delayed-retry-type": "all", "x-delayed-retry-min": 1000, "x-delayed-retry-max": 5000,
        "x-delayed-retry-backoff": backoff,
    })
    assert retry_delay_ms(settings, count, FAILED) == expected


@pytest.mark.parametrize(("kind", "failed", "returned"), [
    ("disabled", 0, 0), ("all", 500, 500), ("failed", 500, 0), ("returned", 0, 500),
])
def test_the_retry_type_picks_which_returns_wait(kind, failed, returned):
    settings = QueueArguments.parse({"x-delayed-retry-type": kind, "x-delayed-retry-min": 500})
    assert (retry_delay_ms(settings, 1, FAILED), retry_delay_ms(settings, 1, RETURNED)) == (failed, returned)
    assert retry_delay_ms(settings, 1, None) == 0  # a management requeue never waits


@pytest.mark.parametrize(("arguments", "key"), [
    ({"x-delayed-retry-type": "sometimes"}, "x-delayed-retry-type"),
    ({"x-delayed-retry-min": -1}, "x-delayed-retry-min"),
    ({"x-delayed-retry-min": 100, "x-delayed-retry-max": 50}, "x-delayed-retry-max"),
    ({"x-delayed-retry-backoff": "fibonacci"}, "x-delayed-retry-backoff"),
    ({"x-delivery-limit": -1}, "x-delivery-limit"),
    ({"x-delivery-limit": "5"}, "x-delivery-limit"),
])
def test_invalid_lifecycle_arguments_are_refused(arguments, key):
    with pytest.raises(InvalidArgument) as caught:
        QueueArguments.parse(arguments)
    assert caught.value.key == key


def test_lanes_release_in_due_order_across_delays():
    lanes = RetryLanes()
    lanes.add(3000, 13_000, 1, 1, None)
    lanes.add(1000, 11_000, 2, 1, None)
    lanes.add(3000, 14_000, 3, 2, None)
    lanes.add(1000, 12_000, 4, 1, None)
    assert lanes.next_due_ms() == 11_000
    assert [w.seq for w in lanes.take_due(13_000)] == [2, 4, 1]
    assert [w.seq for w in lanes.take_due(20_000)] == [3]
    assert len(lanes) == 0 and lanes.next_due_ms() is None


def test_a_clock_that_steps_back_keeps_a_lane_sorted():
    lanes = RetryLanes()
    lanes.add(1000, 5000, 1, 1, None)
    lanes.add(1000, 4000, 2, 1, None)  # clock went back 1 s: waits as long as the one before
    assert [w.seq for w in lanes.take_due(4500)] == []
    assert [(w.seq, w.due_ms) for w in lanes.take_due(5000)] == [(1, 5000), (2, 5000)]


def test_recovered_waiting_messages_are_sorted_once_and_mix_with_new_ones():
    lanes = RetryLanes()
    lanes.add_recovered([(7, 1, 9000), (5, 2, 3000), (6, 1, 6000)])
    lanes.add(1000, 4000, 8, 1, None)
    assert [w.seq for w in lanes.take_due(5000)] == [5, 8]
    assert [w.seq for w in lanes.take_due(10_000)] == [6, 7]
    assert len(lanes) == 0


def test_take_due_honours_a_batch_limit():
    lanes = RetryLanes()
    for seq in range(10):
        lanes.add(1000, 1000 + seq, seq, 1, None)
    assert len(lanes.take_due(5000, limit=4)) == 4
    assert len(lanes) == 6
    assert lanes.next_due_ms() == 1004


# -- a queue with delayed retry ------------------------------------------------------------


def test_a_rejected_message_waits_neither_ready_nor_unacked_while_others_flow():
    clock = Clock()
    queue, sink = retry_queue(clock), FakeSink()
    consumer = Consumer("c", queue, sink, no_ack=False)
    queue.add_consumer(consumer)
    publish(queue, b"poison")
    give_back(sink, b"poison")
    assert (queue.message_count, queue.unacked_count, queue.waiting_count) == (0, 0, 1)
    publish(queue, b"fine-1", b"fine-2")  # no head-of-line blocking
    assert sink.bodies() == [b"poison", b"fine-1", b"fine-2"]
    advance(queue, clock, 0.999)
    assert queue.waiting_count == 1
    advance(queue, clock, 0.002)
    assert sink.bodies()[-1] == b"poison"
    assert sink.redelivered[-1] is True
    assert queue.waiting_count == 0


def test_the_second_retry_waits_longer():
    clock = Clock()
    queue, sink = retry_queue(clock), FakeSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False))
    publish(queue, b"m")
    give_back(sink, b"m")
    assert queue.waiting_count == 1
    advance(queue, clock, 1.0)
    give_back(sink, b"m")
    assert queue.waiting_count == 1
    advance(queue, clock, 1.5)
    assert len(sink.delivered) == 2
    advance(queue, clock, 0.5)  # linear: 2 s the second time
    assert len(sink.delivered) == 3


def test_failed_type_delays_rejects_but_not_a_closed_channel():
    clock = Clock()
    queue, sink = retry_queue(clock, **{"x-delayed-retry-type": "failed"}), FakeSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False))
    publish(queue, b"a", b"b")
    give_back(sink, b"a", RETURNED)
    give_back(sink, b"b", FAILED)
    assert queue.waiting_count == 1
    assert sink.bodies()[-1] == b"a"  # came straight back


def test_returned_type_delays_a_closed_channel_but_not_a_reject():
    clock = Clock()
    queue, sink = retry_queue(clock, **{"x-delayed-retry-type": "returned"}), FakeSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False))
    publish(queue, b"a", b"b")
    give_back(sink, b"a", RETURNED)
    give_back(sink, b"b", FAILED)
    assert queue.waiting_count == 1
    assert sink.bodies()[-1] == b"b"


def test_a_waiting_message_goes_back_to_its_original_position():
    clock = Clock()
    queue = retry_queue(clock)
    publish(queue, b"first", b"second", b"third")
    entry = queue.get(no_ack=False)
    queue.after_get(entry)
    queue.requeue([(entry, None)], FAILED)
    assert (queue.message_count, queue.waiting_count) == (2, 1)  # it waits out of the ready list
    advance(queue, clock, 1.0)
    assert [e.message.body for e in queue.ready.peek(3)] == [b"first", b"second", b"third"]


def test_purge_drops_waiting_messages_too():
    clock = Clock()
    queue, sink = retry_queue(clock), FakeSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False))
    publish(queue, b"a")
    give_back(sink, b"a")
    queue.remove_consumer(queue.consumers()[0])
    publish(queue, b"b")
    assert (queue.message_count, queue.waiting_count) == (1, 1)
    assert queue.purge() == 2
    advance(queue, clock, 5)
    assert (queue.message_count, queue.waiting_count) == (0, 0)


def test_a_message_whose_ttl_passes_while_waiting_expires_instead_of_coming_back():
    clock = Clock()
    queue, sink = retry_queue(clock, **{"x-message-ttl": 500}), FakeSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False))
    publish(queue, b"a")
    give_back(sink, b"a")
    assert (queue.message_count, queue.waiting_count) == (0, 1)
    advance(queue, clock, 1.0)
    assert len(sink.delivered) == 1
    assert (queue.message_count, queue.waiting_count) == (0, 0)
    assert queue.stats.dead_lettered_expired == 1


def test_messages_past_the_delivery_limit_are_dropped_without_a_dead_letter_exchange():
    clock = Clock()
    queue = Queue("q", "/", arguments={"x-delivery-limit": 1}, timers=Timers(clock))
    sink = FakeSink()
    queue.add_consumer(Consumer("c", queue, sink, no_ack=False))
    publish(queue, b"m")
    give_back(sink, b"m")  # delivered once: back
    give_back(sink, b"m")  # delivered twice (> 1): gone
    assert len(sink.delivered) == 2
    assert (queue.message_count, queue.stats.dead_lettered_delivery_limit) == (0, 1)


def test_a_management_requeue_does_not_count_towards_the_limit_or_wait():
    clock = Clock()
    queue = retry_queue(clock, **{"x-delivery-limit": 0})
    publish(queue, b"m")
    entry = queue.get(no_ack=False)
    queue.after_get(entry)
    queue.requeue([(entry, None)])
    assert queue.message_count == 1


def test_ttl_of_a_waiting_message_still_counts_from_publish():
    clock = Clock()
    queue = retry_queue(clock, **{"x-message-ttl": 10_000})
    m = Message("", "q", struct.pack(">HHQH", 60, 0, 1, 0), b"x")
    m.published_at = clock.now
    queue.publish(m)
    entry = queue.get(no_ack=False)
    queue.after_get(entry)
    queue.requeue([(entry, None)], FAILED)
    assert (queue.message_count, queue.waiting_count) == (0, 1)
    advance(queue, clock, 1.0)
    assert (queue.message_count, queue.waiting_count) == (1, 0)
    advance(queue, clock, 9.5)
    assert queue.message_count == 0 and queue.stats.dead_lettered_expired == 1
