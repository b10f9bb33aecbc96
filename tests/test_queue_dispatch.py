"""Fair dispatch on a queue, seen through fake delivery sinks (no channel, no network)."""

from __future__ import annotations

import struct

from pamqp import commands

from queues.consumer import Consumer
from queues.message import Message, QueueEntry, content_header
from queues.queue import Queue
from queues.timers import Timers


class FakeSink:
    """A channel stand-in: records deliveries and enforces an optional channel-wide prefetch."""

    def __init__(self, global_prefetch: int = 0) -> None:
        self.global_prefetch = global_prefetch
        self.delivered: list[tuple[str, QueueEntry]] = []
        self.redelivered: list[bool] = []  # the flag basic.deliver carried
        self.unacked: list[tuple[Consumer, QueueEntry]] = []
        self.cancelled: list[str] = []

    def can_deliver(self) -> bool:
        return not self.global_prefetch or len(self.unacked) < self.global_prefetch

    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        self.delivered.append((consumer.tag, entry))
        self.redelivered.append(entry.redelivered)
        if not consumer.no_ack:
            self.unacked.append((consumer, entry))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer.tag)

    # -- what a client does, through the channel -----------------------------------------

    def ack(self, body: bytes) -> None:
        consumer, entry = self._take(body)
        consumer.queue.ack(entry, consumer)
        consumer.queue.dispatch()  # the channel offers the freed room again

    def requeue(self, *bodies: bytes) -> None:
        taken = [self._take(body) for body in bodies]
        taken[0][0].queue.requeue([(entry, consumer) for consumer, entry in taken])

    def _take(self, body: bytes) -> tuple[Consumer, QueueEntry]:
        for index, (consumer, entry) in enumerate(self.unacked):
            if entry.message.body == body:
                return self.unacked.pop(index)
        raise AssertionError(f"{body!r} is not unacked")

    def bodies(self) -> list[bytes]:
        return [entry.message.body for _tag, entry in self.delivered]

    def tags(self) -> list[str]:
        return [tag for tag, _entry in self.delivered]


def message(body: bytes) -> Message:
    raw_header = struct.pack(">HHQH", 60, 0, len(body), 0)
    return Message("", "q", raw_header, body)


def publish(queue: Queue, *bodies: bytes) -> None:
    for body in bodies:
        queue.publish(message(body))


def consumer(queue: Queue, sink: FakeSink, tag: str, prefetch: int = 0, priority: int = 0, no_ack: bool = False) -> Consumer:
    added = Consumer(tag, queue, sink, no_ack=no_ack, priority=priority, prefetch_count=prefetch)
    queue.add_consumer(added)
    return added


def test_messages_go_round_robin_to_consumers():
    queue, sink = Queue("q", "/"), FakeSink()
    for tag in ("a", "b", "c"):
        consumer(queue, sink, tag)
    publish(queue, *[b"%d" % n for n in range(6)])
    assert sink.tags() == ["a", "b", "c", "a", "b", "c"]
    assert sink.bodies() == [b"0", b"1", b"2", b"3", b"4", b"5"]


def test_round_robin_skips_consumers_without_room():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a")
    consumer(queue, sink, "full", prefetch=1)
    consumer(queue, sink, "c")
    publish(queue, *[b"%d" % n for n in range(6)])
    assert sink.tags() == ["a", "full", "c", "a", "c", "a"]


def test_messages_published_before_consumers_are_shared_fairly():
    queue, sink = Queue("q", "/"), FakeSink()
    publish(queue, b"0", b"1", b"2", b"3")
    consumer(queue, sink, "a", prefetch=2)
    consumer(queue, sink, "b", prefetch=2)
    assert sink.tags() == ["a", "a", "b", "b"]


def test_prefetch_limit_blocks_delivery():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a", prefetch=2)
    publish(queue, b"0", b"1", b"2", b"3")
    assert sink.bodies() == [b"0", b"1"]
    assert queue.message_count == 2
    assert queue.unacked_count == 2


def test_ack_frees_room_for_the_next_message():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a", prefetch=2)
    publish(queue, b"0", b"1", b"2", b"3")
    sink.ack(b"0")
    assert sink.bodies() == [b"0", b"1", b"2"]
    assert queue.unacked_count == 2


def test_no_ack_consumer_has_no_prefetch_limit():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a", prefetch=1, no_ack=True)
    publish(queue, b"0", b"1", b"2")
    assert sink.bodies() == [b"0", b"1", b"2"]
    assert queue.unacked_count == 0


def test_requeued_messages_return_ahead_of_later_ones_in_original_order():
    queue, sink = Queue("q", "/"), FakeSink()
    first = consumer(queue, sink, "a", prefetch=3)
    publish(queue, b"1", b"2", b"3", b"4", b"5")
    queue.remove_consumer(first)
    sink.requeue(b"3", b"1")  # out of order on purpose
    later = FakeSink()
    consumer(queue, later, "b")
    assert later.bodies() == [b"1", b"3", b"4", b"5"]
    assert later.redelivered == [True, True, False, False]


def test_a_requeued_message_goes_to_a_consumer_with_room_at_once():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a", prefetch=1)
    publish(queue, b"1", b"2")
    sink.requeue(b"1")
    assert sink.bodies() == [b"1", b"1"]
    assert sink.redelivered == [False, True]


def test_higher_priority_consumers_get_messages_while_they_have_room():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "low")
    consumer(queue, sink, "high", prefetch=2, priority=10)
    publish(queue, b"0", b"1", b"2", b"3")
    assert sink.tags() == ["high", "high", "low", "low"]
    sink.ack(b"0")
    publish(queue, b"4")
    assert sink.tags()[-1] == "high"


def test_consumers_of_equal_priority_share_round_robin():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "low", priority=-1)
    consumer(queue, sink, "x", priority=5)
    consumer(queue, sink, "y", priority=5)
    publish(queue, b"0", b"1", b"2", b"3")
    assert sink.tags() == ["x", "y", "x", "y"]


def test_global_prefetch_caps_all_consumers_of_a_channel_together():
    queue, sink = Queue("q", "/"), FakeSink(global_prefetch=3)
    consumer(queue, sink, "a", prefetch=2)
    consumer(queue, sink, "b", prefetch=2)
    publish(queue, *[b"%d" % n for n in range(10)])
    assert sink.tags() == ["a", "b", "a"]
    sink.ack(b"0")  # frees channel room; "a" still has 1 of 2, "b" 1 of 2
    assert len(sink.delivered) == 4
    assert sink.tags()[-1] == "b"


def test_per_consumer_prefetch_applies_below_the_global_limit():
    queue, sink = Queue("q", "/"), FakeSink(global_prefetch=10)
    consumer(queue, sink, "a", prefetch=1)
    consumer(queue, sink, "b", prefetch=1)
    publish(queue, *[b"%d" % n for n in range(10)])
    assert sink.tags() == ["a", "b"]


def test_another_channel_keeps_receiving_when_one_is_at_its_global_limit():
    queue, full, free = Queue("q", "/"), FakeSink(global_prefetch=1), FakeSink()
    consumer(queue, full, "a")
    consumer(queue, free, "b")
    publish(queue, b"0", b"1", b"2", b"3")
    assert full.bodies() == [b"0"]
    assert free.bodies() == [b"1", b"2", b"3"]


def test_deleting_a_queue_returns_its_consumers_for_cancellation():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a")
    consumer(queue, sink, "b")
    assert sorted(c.tag for c in queue.delete()) == ["a", "b"]
    assert queue.consumer_count == 0


def test_auto_delete_queue_reports_unused_after_its_last_consumer_goes():
    queue, sink = Queue("q", "/", auto_delete=True), FakeSink()
    unused: list[Queue] = []
    queue.on_unused = unused.append
    a = consumer(queue, sink, "a")
    b = consumer(queue, sink, "b")
    queue.remove_consumer(a)
    assert unused == []
    queue.remove_consumer(b)
    assert unused == [queue]


def test_a_message_handed_straight_to_a_consumer_leaves_the_memory_budget_as_it_was():
    queue, sink = Queue("q", "/"), FakeSink()
    consumer(queue, sink, "a", prefetch=1)
    held_before = queue.ready.budget.held
    publish(queue, b"0")
    assert sink.bodies() == [b"0"]
    assert queue.ready.budget.held == held_before
    assert (queue.message_count, queue.unacked_count) == (0, 1)
    publish(queue, b"1")  # no room: it waits in the ready list and counts against the budget
    assert sink.bodies() == [b"0"]
    assert queue.message_count == 1
    assert queue.ready.budget.held > held_before
    sink.ack(b"0")
    assert sink.bodies() == [b"0", b"1"]
    assert queue.ready.budget.held == held_before


def test_a_publish_while_messages_wait_goes_behind_them():
    queue, sink = Queue("q", "/"), FakeSink()
    publish(queue, b"0", b"1")
    taker = consumer(queue, sink, "a", prefetch=1)
    assert sink.bodies() == [b"0"]
    taker.set_prefetch(0)  # room for all: the next publish must not overtake b"1"
    publish(queue, b"2")
    assert sink.bodies() == [b"0", b"1", b"2"]


def test_a_message_with_a_ttl_that_no_consumer_has_room_for_still_expires_on_time():
    # The direct hand-off is for messages without an expiry: one with a TTL that finds no room
    # must be timed in the ready list like any other.
    clock = [1000.0]
    queue, sink = Queue("q", "/", timers=Timers(lambda: clock[0])), FakeSink()
    consumer(queue, sink, "a", prefetch=1)
    publish(queue, b"held")
    raw = commands.Basic.Properties(expiration="1000").marshal()
    timed = Message("", "q", content_header(5, raw), b"timed")
    timed.published_at = clock[0]
    queue.publish(timed)
    assert (sink.bodies(), queue.message_count) == ([b"held"], 1)
    clock[0] += 2
    queue.timers.run_due(clock[0])
    assert queue.message_count == 0, "its TTL passed while it waited: it expires"
    sink.ack(b"held")
    assert sink.bodies() == [b"held"]


class RepublishingSink(FakeSink):
    """A consumer whose first delivery publishes another message to the same queue, while the
    queue is still dispatching."""

    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        super().deliver(consumer, entry)
        if entry.message.body == b"first":
            consumer.queue.publish(message(b"follow-up"))


def test_a_publish_made_while_the_queue_dispatches_is_delivered_too():
    queue, sink = Queue("q", "/"), RepublishingSink()
    consumer(queue, sink, "a")
    publish(queue, b"first")
    assert sink.bodies() == [b"first", b"follow-up"]
    assert queue.message_count == 0


def _timed_message(clock: list[float], body: bytes, ttl_ms: str = "1000") -> Message:
    timed = Message("", "q", content_header(len(body), commands.Basic.Properties(expiration=ttl_ms).marshal()), body)
    timed.published_at = clock[0]
    return timed


def test_a_message_taken_from_the_ready_list_is_no_longer_timed_by_its_ttl():
    # Delivered (or fetched) means out of the ready list: its TTL passing later must neither
    # expire it nor count it out of the ready messages a second time.
    clock = [1000.0]
    queue, sink = Queue("q", "/", timers=Timers(lambda: clock[0])), FakeSink()
    dead: list[bytes] = []
    queue.dead_letterer = lambda _queue, entries, _reason: dead.extend(e.message.body for e in entries)
    consumer(queue, sink, "a", prefetch=1)
    publish(queue, b"held")
    queue.publish(_timed_message(clock, b"timed"))
    queue.publish(_timed_message(clock, b"fetched"))
    sink.ack(b"held")  # room: "timed" comes out of the ready list to the consumer
    assert sink.bodies() == [b"held", b"timed"]
    fetched = queue.get(no_ack=False)
    assert fetched is not None and fetched.message.body == b"fetched"
    queue.after_get(fetched)
    clock[0] += 2
    queue.timers.run_due(clock[0])
    assert (queue.message_count, queue.unacked_count, dead) == (0, 2, [])
    sink.ack(b"timed")
    queue.ack(fetched, None)
    assert (queue.message_count, queue.unacked_count, dead) == (0, 0, [])


def test_a_no_ack_delivery_from_the_ready_list_is_its_last():
    clock = [1000.0]
    queue, sink = Queue("q", "/", timers=Timers(lambda: clock[0])), FakeSink()
    dead: list[bytes] = []
    queue.dead_letterer = lambda _queue, entries, _reason: dead.extend(e.message.body for e in entries)
    queue.publish(_timed_message(clock, b"timed"))
    consumer(queue, sink, "a", no_ack=True)
    assert sink.bodies() == [b"timed"]
    clock[0] += 2
    queue.timers.run_due(clock[0])
    assert (queue.message_count, queue.unacked_count, dead) == (0, 0, [])


def test_consumers_that_left_get_nothing_and_the_one_left_alone_gets_everything():
    queue, sink = Queue("q", "/"), FakeSink()
    queue.remove_consumer(consumer(queue, sink, "gone"))
    publish(queue, b"0")
    assert (sink.tags(), queue.message_count) == ([], 1), "no consumer left: it waits"
    b = consumer(queue, sink, "b")
    assert sink.tags() == ["b"]
    consumer(queue, sink, "c")
    queue.remove_consumer(b)
    publish(queue, b"1", b"2")
    assert sink.tags() == ["b", "c", "c"]
    consumer(queue, sink, "d")
    publish(queue, b"3", b"4", b"5", b"6")
    assert sorted(sink.tags()[3:]) == ["c", "c", "d", "d"]
