"""The store of an x-delayed-message exchange: order, restart, x-delay parsing (time by hand)."""

from __future__ import annotations

import time

import pytest
from pamqp import commands

from persistence.queue_store import QueueStore
from queues.delays.delayed_exchange import DelayedMessages, delay_of, store_name
from queues.journal import QueueJournal
from queues.message import Message, content_header
from queues.timers import Timers


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def delayed(body: bytes, delay, clock: Clock, persistent: bool = True) -> Message:
    properties = commands.Basic.Properties(headers={"x-delay": delay}, delivery_mode=2 if persistent else 1)
    message = Message("d", "k", content_header(len(body), properties.marshal()), body)
    message.published_at = clock.now
    return message


def open_store(directory, clock: Clock, released: list) -> DelayedMessages:
    journal = QueueJournal(QueueStore.for_queue(directory, "/", store_name("d")), None)

    def release(message: Message) -> bool:
        released.append(message)
        return True

    pending = DelayedMessages("d", Timers(clock), release, journal)
    pending.recover()
    return pending


@pytest.mark.parametrize(("value", "expected"), [
    (1500, 1500), ("2500", 2500), (12.9, 12), (0, 0), (-5, 0), ("soon", 0), (True, 0), (None, 0),
])
def test_x_delay_is_read_as_the_plugin_reads_it(value, expected):
    assert delay_of({"x-delay": value}) == expected


def test_messages_are_released_in_due_order_whatever_the_publish_order(tmp_path):
    clock, released = Clock(), []
    pending = open_store(tmp_path, clock, released)
    for body, delay in ((b"c", 3000), (b"a", 1000), (b"b", 2000)):
        pending.publish(delayed(body, delay, clock))
    clock.now += 3.5
    pending.timers.run_due(clock.now)
    assert [m.body for m in released] == [b"a", b"b", b"c"]
    assert [m.headers["x-delay"] for m in released] == [-1000, -2000, -3000]
    assert all(m.published_at == pytest.approx(clock.now, abs=0.01) for m in released)


def test_pending_persistent_messages_survive_a_restart(tmp_path):
    clock, released = Clock(), []
    pending = open_store(tmp_path, clock, released)
    pending.publish(delayed(b"durable", 10_000, clock))
    pending.publish(delayed(b"overdue", 1_000, clock))
    pending.publish(delayed(b"transient", 10_000, clock, persistent=False))
    pending.close()

    clock.now += 5  # "overdue" fell due while the broker was down
    pending = open_store(tmp_path, clock, released)
    assert len(pending) == 2
    pending.timers.run_due(clock.now)
    assert [m.body for m in released] == [b"overdue"]
    clock.now += 6
    pending.timers.run_due(clock.now)
    assert [m.body for m in released] == [b"overdue", b"durable"]
    pending.close()

    pending = open_store(tmp_path, clock, released)  # released messages do not come back
    assert len(pending) == 0


def test_a_huge_backlog_is_released_in_batches(tmp_path):
    clock, released = Clock(), []
    pending = DelayedMessages("d", Timers(clock), lambda m: released.append(m) or True)
    for n in range(25_000):
        pending.publish(delayed(b"%d" % n, 1000, clock, persistent=False))
    clock.now += 2
    pending.timers.run_due(clock.now)
    assert len(released) == 10_000  # then it yields to the event loop
    clock.now += 0.01
    pending.timers.run_due(clock.now)
    clock.now += 0.01
    pending.timers.run_due(clock.now)
    assert len(released) == 25_000
