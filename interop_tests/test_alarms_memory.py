"""The memory alarm over real TCP with pika: a publisher is blocked, consumers drain, it resumes.

The broker gets a memory high watermark a few tens of megabytes above its own resident memory
at rest (measured on a first broker started the same way), then a publisher fills a queue
until the broker says connection.blocked. A consumer on another connection drains the queue;
the broker's memory falls back under the watermark, it says connection.unblocked, and the
publishes that waited go through. Every confirmed message must reach the consumer.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from interop_tests.broker_process import TEST_CONFIG, BrokerProcess
from interop_tests.pika_helpers import connect

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("INTEROP_BROKER_URL")), reason="needs this project's broker with its own watermark"
)

HEADROOM = 32 * 1024 * 1024  # memory above the broker's resting size before the alarm
BODY_SIZE = 256 * 1024
MAX_MESSAGES = 1000  # 250 MB: far past the watermark; reaching it means no alarm came
PACE_S = 0.01
AFTER_UNBLOCK = 5  # publishes that wait out the block and must go through afterwards
WAIT_S = 30.0


def resident_bytes(broker: BrokerProcess) -> int:
    with open(f"/proc/{broker.process.pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def start(broker_factory, limits: str = "") -> BrokerProcess:
    ports = ("--management-port", "0", "--metrics-port", "0")
    config = TEST_CONFIG + (f"\n[limits]\n{limits}\n" if limits else "")
    return broker_factory(config_text=config, extra_args=ports)


def resting_size(broker_factory) -> int:
    """Resident memory of a broker like the one under test, with one client connected."""
    broker = start(broker_factory)
    connection = connect(broker)
    connection.channel().queue_declare("calibration")
    time.sleep(0.3)  # let the first monitor check and the management setup settle
    size = resident_bytes(broker)
    connection.close()
    broker.kill()
    return size


class Publisher(threading.Thread):
    """Publishes numbered messages with confirms until blocked, then a few more that must wait."""

    def __init__(self, broker: BrokerProcess, queue: str) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.queue = queue
        self.blocked = threading.Event()
        self.unblocked = threading.Event()
        self.blocked_reason: str | None = None
        self.confirmed: list[int] = []
        self.error: BaseException | None = None

    def on_blocked(self, _connection, frame) -> None:
        self.blocked_reason = frame.method.reason
        self.blocked.set()

    def run(self) -> None:
        try:
            connection = connect(self.broker)
            connection.add_on_connection_blocked_callback(self.on_blocked)
            connection.add_on_connection_unblocked_callback(lambda *_: self.unblocked.set())
            channel = connection.channel()
            channel.confirm_delivery()
            body = os.urandom(BODY_SIZE - 8)
            number = 0
            remaining_after_block = AFTER_UNBLOCK
            while number < MAX_MESSAGES and remaining_after_block:
                # basic_publish returns once the broker confirmed (pika raises on a nack).
                channel.basic_publish("", self.queue, number.to_bytes(8, "big") + body)
                self.confirmed.append(number)
                number += 1
                # About 25 MB/s: the broker checks memory once a second, and the test wants
                # the alarm near the watermark, not hundreds of megabytes past it.
                connection.sleep(PACE_S)
                if self.blocked.is_set():
                    remaining_after_block -= 1
            connection.sleep(0.1)  # hands over connection.blocked/unblocked if still pending
            connection.close()
        except BaseException as error:  # reported by the test
            self.error = error


def test_publisher_is_blocked_over_the_watermark_and_resumes_after_consumers_drain(broker_factory):
    watermark = resting_size(broker_factory) + HEADROOM
    broker = start(broker_factory, f"memory_high_watermark_bytes = {watermark}")
    setup = connect(broker)
    setup.channel().queue_declare("alarm-q")
    setup.close()

    publisher = Publisher(broker, "alarm-q")
    publisher.start()
    # pika's BlockingConnection hands connection.blocked to the callback only between its own
    # calls, and the publisher sits inside basic_publish until unblocked; so the broker's log
    # says when the alarm went off, and the callbacks are checked at the end.
    deadline = time.monotonic() + WAIT_S
    while "memory resource limit alarm set" not in broker.log_text():
        assert publisher.is_alive() and time.monotonic() < deadline, (
            f"no memory alarm after {len(publisher.confirmed)} messages: {publisher.error!r}\n{broker.log_text()}"
        )
        time.sleep(0.05)
    blocked_at = len(publisher.confirmed)
    assert blocked_at * BODY_SIZE >= HEADROOM / 2  # the broker really was filling up
    # Blocked means blocked: with nobody draining, the publisher makes no progress (at most
    # the publishes already on their way when the alarm went off complete).
    time.sleep(1.5)
    assert len(publisher.confirmed) <= blocked_at + 2
    blocked_at = len(publisher.confirmed)

    # A consumer on another connection is not blocked: it drains the queue.
    consumer = connect(broker)
    channel = consumer.channel()
    channel.basic_qos(prefetch_count=50)
    received: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        method, _properties, body = channel.basic_get("alarm-q")
        if method is None:
            if publisher.unblocked.is_set() and not publisher.is_alive():
                break
            consumer.process_data_events(0.05)
            continue
        assert len(body) == BODY_SIZE
        received.append(int.from_bytes(body[:8], "big"))
        channel.basic_ack(method.delivery_tag)
    consumer.close()
    publisher.join(WAIT_S)

    assert publisher.error is None, publisher.error
    assert publisher.blocked_reason == "low on memory"
    assert publisher.unblocked.is_set(), f"no connection.unblocked\n{broker.log_text()}"
    assert "memory resource limit alarm cleared" in broker.log_text()
    # The publishes that waited while blocked went through after the alarm cleared.
    assert len(publisher.confirmed) > blocked_at + 1
    # Nothing confirmed was lost, nothing arrived twice, order kept.
    assert received == publisher.confirmed
