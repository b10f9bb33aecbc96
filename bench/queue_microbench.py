"""CPU per message of a queue's part of the hot path: publish -> dispatch -> deliver (-> ack), no network.

Run: PYTHONPATH=CHECKOUT python bench/queue_microbench.py   (about 10 s)

Measured in process CPU time, best of ROUNDS, so a machine loaded by other work moves it far
less than the end-to-end benchmarks: use it to compare two checkouts of queues/ (run each a few
times, alternating). Three cases, 100-byte transient messages: a consumer with auto-ack, a
consumer with manual ack and prefetch 100 (each message acked right after its delivery), and a
backlog published with no consumer then taken with basic.get.
"""

from __future__ import annotations

import time

from pamqp import commands

from queues.consumer import Consumer
from queues.message import Message, QueueEntry, content_header
from queues.queue import Queue
from queues.timers import Timers

MESSAGES = 200_000
ROUNDS = 5
_HEADER = content_header(100, commands.Basic.Properties().marshal())
_BODY = b"x" * 100


class LastDelivery:
    """A channel stand-in that keeps only the last delivery (to ack it)."""

    def __init__(self) -> None:
        self.entry: QueueEntry | None = None

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer: Consumer, entry: QueueEntry) -> None:
        self.entry = entry

    def consumer_cancelled(self, consumer: Consumer) -> None:
        pass


def _messages() -> list[Message]:
    return [Message("", "q", _HEADER, _BODY) for _ in range(MESSAGES)]


def consumed(manual_ack: bool) -> float:
    """Nanoseconds of CPU per message published to a queue whose consumer takes it at once."""
    queue = Queue("q", "/", timers=Timers())
    sink = LastDelivery()
    consumer = Consumer("c", queue, sink, no_ack=not manual_ack, prefetch_count=100 if manual_ack else 0)
    queue.add_consumer(consumer)
    messages = _messages()
    started = time.process_time()
    for message in messages:
        queue.publish(message)
        if manual_ack:
            queue.ack(sink.entry, consumer)
    return (time.process_time() - started) / MESSAGES * 1e9


def backlog_then_get() -> float:
    """Nanoseconds of CPU per message published with no consumer, then fetched with basic.get."""
    queue = Queue("q", "/", timers=Timers())
    messages = _messages()
    started = time.process_time()
    for message in messages:
        queue.publish(message)
    while queue.get(no_ack=True) is not None:
        pass
    return (time.process_time() - started) / MESSAGES * 1e9


def main() -> None:
    cases = {
        "consumer, auto-ack": lambda: consumed(manual_ack=False),
        "consumer, manual ack": lambda: consumed(manual_ack=True),
        "backlog, then basic.get": backlog_then_get,
    }
    for label, case in cases.items():
        print(f"{label:<26} {min(case() for _ in range(ROUNDS)):>7,.0f} ns CPU per message (best of {ROUNDS})")


if __name__ == "__main__":
    main()
