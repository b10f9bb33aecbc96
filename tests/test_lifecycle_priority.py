"""x-max-priority queues: higher priority first, FIFO within a priority, requeue and paging kept."""

from __future__ import annotations

import pytest
from pamqp import commands

from queues.arguments import InvalidArgument, QueueArguments
from queues.consumer import Consumer
from queues.message import Message, QueueEntry, content_header
from queues.queue import Queue
from queues.ready_messages import PriorityReadyMessages, ReadyMessages, message_priority
from tests.test_queue_dispatch import FakeSink


def prioritised(body: bytes, priority: int | None) -> Message:
    properties = commands.Basic.Properties(priority=priority) if priority is not None else commands.Basic.Properties()
    return Message("", "q", content_header(len(body), properties.marshal()), body)


def test_higher_priority_first_and_fifo_within_a_priority():
    queue = Queue("q", "/", arguments={"x-max-priority": 10})
    for body, priority in ((b"a0", 0), (b"b5", 5), (b"c", None), (b"d5", 5), (b"e9", 9)):
        queue.publish(prioritised(body, priority))
    assert [queue.get(no_ack=True).message.body for _ in range(5)] == [b"e9", b"b5", b"d5", b"a0", b"c"]


def test_a_priority_above_the_maximum_counts_as_the_maximum():
    queue = Queue("q", "/", arguments={"x-max-priority": 3})
    queue.publish(prioritised(b"three", 3))
    queue.publish(prioritised(b"two-hundred", 200))
    assert [queue.get(no_ack=True).message.body for _ in range(2)] == [b"three", b"two-hundred"]
    assert message_priority(prioritised(b"x", 200), 3) == 3


def test_a_requeued_message_goes_back_to_its_position_within_its_priority():
    queue, sink = Queue("q", "/", arguments={"x-max-priority": 5}), FakeSink()
    for body, priority in ((b"h1", 5), (b"h2", 5), (b"l1", 1)):
        queue.publish(prioritised(body, priority))
    consumer = Consumer("c", queue, sink, no_ack=False, prefetch_count=2)
    queue.add_consumer(consumer)
    assert sink.bodies() == [b"h1", b"h2"]
    sink.requeue(b"h1")
    assert sink.bodies()[-1] == b"h1"  # before l1, although l1 has been waiting longer
    sink.ack(b"h2")
    sink.ack(b"h1")
    assert sink.bodies()[-1] == b"l1"


def test_consumers_see_the_highest_priority_ready_when_they_get_room():
    queue, sink = Queue("q", "/", arguments={"x-max-priority": 5}), FakeSink()
    consumer = Consumer("c", queue, sink, no_ack=False, prefetch_count=1)
    queue.add_consumer(consumer)
    queue.publish(prioritised(b"first", 0))
    queue.publish(prioritised(b"low", 1))
    queue.publish(prioritised(b"high", 4))
    sink.ack(b"first")
    assert sink.bodies() == [b"first", b"high"]


def test_expired_messages_leave_their_level():
    queue = Queue("q", "/", arguments={"x-max-priority": 5, "x-message-ttl": 0})
    queue.publish(prioritised(b"gone", 5))
    assert queue.expire_due(now=queue.timers.clock() + 1) == 1
    assert queue.message_count == 0
    assert queue.ready.bytes == 0


def test_paged_out_messages_are_read_back_in_priority_order():
    loaded = {}

    def loader(seq: int, count: int) -> QueueEntry:
        entry = loaded[seq]
        entry.delivery_count = count
        return entry

    ready = PriorityReadyMessages(5, loader)
    for seq, (body, priority) in enumerate(((b"low", 1), (b"high", 5), (b"mid", 3)), start=1):
        entry = QueueEntry(prioritised(body, priority), seq)
        loaded[seq] = entry
        ready.page(entry)
    assert (len(ready), ready.in_memory) == (3, 0)
    assert [ready.pop().message.body for _ in range(3)] == [b"high", b"mid", b"low"]
    with pytest.raises(IndexError):
        ready.pop()


def test_peek_and_clear_span_every_level():
    ready = PriorityReadyMessages(9)
    for seq, priority in enumerate((1, 9, 4), start=1):
        ready.append(QueueEntry(prioritised(b"%d" % priority, priority), seq))
    assert [e.message.body for e in ready.peek(2)] == [b"9", b"4"]
    assert ready.clear() == 3
    assert not ready


def test_only_priority_queues_pay_for_priorities():
    assert isinstance(Queue("plain", "/").ready, ReadyMessages)
    assert isinstance(Queue("zero", "/", arguments={"x-max-priority": 0}).ready, ReadyMessages)
    assert isinstance(Queue("p", "/", arguments={"x-max-priority": 2}).ready, PriorityReadyMessages)


def test_max_priority_above_255_is_refused_as_rabbitmq_does():
    with pytest.raises(InvalidArgument) as caught:
        QueueArguments.parse({"x-max-priority": 256})
    assert caught.value.reason == "{max_value_exceeded,256}"
