"""A stream after kill -9: every message whose publish was confirmed is back, at the offset it
had, and none twice (queues/stream_queue.py: confirmed only once its record is fsynced)."""

from __future__ import annotations

import threading

import pika

from interop_tests.pika_helpers import connect
from interop_tests.waiting import wait_until

STREAM = {"x-queue-type": "stream"}


def test_every_confirmed_message_is_back_at_its_offset_after_kill_9(broker_factory) -> None:
    broker = broker_factory()
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare("events", durable=True, arguments=STREAM)
    connection.close()

    confirmed: list[int] = []  # publish numbers, in order, whose confirm arrived
    stop = threading.Event()

    def publish() -> None:
        publisher = connect(broker)
        publishing = publisher.channel()
        publishing.confirm_delivery()
        n = 0
        try:
            while not stop.is_set() and n < 100_000:
                publishing.basic_publish("", "events", b"m%d" % n)  # waits for its confirm
                confirmed.append(n)
                n += 1
        except (pika.exceptions.AMQPError, OSError):
            pass  # the broker died under it

    publisher = threading.Thread(target=publish)
    publisher.start()
    wait_until(lambda: len(confirmed) >= 300, "300 confirms before the kill", within=30)
    broker.kill()
    stop.set()
    publisher.join(30)
    assert not publisher.is_alive()
    last_confirmed = confirmed[-1]

    broker.start()
    reading = connect(broker)
    channel = reading.channel()
    channel.basic_qos(prefetch_count=500)
    got: list[tuple[int, bytes]] = []
    # Read from first past the last confirmed message; what the log holds beyond it (a publish
    # written but not confirmed when the broker died) ends where a second goes by with nothing.
    idle = 0
    for method, properties, body in channel.consume("events", arguments={"x-stream-offset": "first"},
                                                    inactivity_timeout=1.0):
        if method is None:
            idle += 1
            if (got and got[-1][0] >= last_confirmed) or idle >= 10:  # (10 s: confirmed ones are missing)
                break
            continue
        got.append((properties.headers["x-stream-offset"], body))
        channel.basic_ack(method.delivery_tag)
    channel.cancel()
    reading.close()
    stored = len(got)
    assert stored >= last_confirmed + 1
    bodies = [body for _offset, body in got]
    assert len(bodies) == len(set(bodies)), "a message is in the stream twice"
    # One publisher, one confirm at a time: message n went to offset n.
    assert [offset for offset, _body in got] == list(range(stored))
    assert all(body == b"m%d" % offset for offset, body in got)
    assert {b"m%d" % n for n in confirmed} <= set(bodies)
