"""Waiting and delayed messages across broker restarts (SIGTERM and SIGKILL), with pika.

Each test starts its own broker (broker_factory), so it always runs this project's broker.
"""

from __future__ import annotations

import time

import pika
import pytest

from interop_tests.broker_process import TEST_CONFIG
from interop_tests.pika_helpers import connect, wait_ready

PERSISTENT = pika.BasicProperties(delivery_mode=2)
WAIT_S = 10.0


def open_confirming(broker) -> tuple[pika.BlockingConnection, object]:
    """A connection to `broker` and a channel on it in confirm mode."""
    connection = connect(broker)
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


def reject_for_retry(broker, queue: str, delay_ms: int) -> float:
    """Declare a durable retry queue, publish a persistent message and reject it; returns when."""
    connection, channel = open_confirming(broker)
    channel.queue_declare(queue, durable=True, arguments={
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": delay_ms,
    })
    channel.basic_publish("", queue, b"job", PERSISTENT)
    method, _properties, _body = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=True)
    rejected_at = time.monotonic()
    # A confirmed publish to the same queue: its fsync covers the waiting_retry record too.
    channel.basic_publish("", queue, b"barrier", PERSISTENT)
    assert channel.queue_declare(queue, passive=True).method.message_count == 1
    channel.basic_get(queue, auto_ack=True)
    connection.close()
    return rejected_at


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_waiting_message_comes_back_at_its_due_time_after_a_restart(broker_factory, stop):
    broker = broker_factory()
    rejected_at = reject_for_retry(broker, "retry-restart", 3000)
    broker.stop() if stop == "sigterm" else broker.kill()
    broker.start()
    connection, channel = open_confirming(broker)
    assert channel.queue_declare("retry-restart", passive=True).method.message_count == 0
    assert wait_ready(channel, "retry-restart", 1, WAIT_S) == 1
    back_at = time.monotonic()
    assert 2.9 <= back_at - rejected_at < 3.0 + 2.5
    method, properties, body = channel.basic_get("retry-restart", auto_ack=True)
    assert (body, method.redelivered, properties.headers) == (b"job", True, {"x-delivery-count": 1})
    connection.close()


def test_a_message_due_while_the_broker_was_down_is_ready_at_start(broker_factory):
    broker = broker_factory()
    reject_for_retry(broker, "retry-downtime", 1000)
    broker.stop()
    time.sleep(1.2)
    broker.start()
    connection, channel = open_confirming(broker)
    assert channel.queue_declare("retry-downtime", passive=True).method.message_count == 1
    connection.close()


def delayed_topology(channel, exchange: str = "later", queue: str = "later-q") -> None:
    channel.exchange_declare(exchange, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "k")


def delayed(delay_ms: int, persistent: bool = True) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2 if persistent else 1, headers={"x-delay": delay_ms})


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_pending_delayed_messages_survive_a_restart_even_beyond_49_days(broker_factory, stop):
    broker = broker_factory()
    connection, channel = open_confirming(broker)
    delayed_topology(channel)
    sixty_days_ms = 60 * 24 * 3600 * 1000
    channel.basic_publish("later", "k", b"soon", delayed(2500))  # confirmed: on disk
    published_at = time.monotonic()
    channel.basic_publish("later", "k", b"in-sixty-days", delayed(sixty_days_ms))
    connection.close()
    broker.stop() if stop == "sigterm" else broker.kill()
    broker.start()
    assert "recovered 2 delayed messages of exchange 'later'" in broker.log_text()
    connection, channel = open_confirming(broker)
    ready_at = time.monotonic()
    waiting = channel.queue_declare("later-q", passive=True).method.message_count
    if ready_at - published_at < 2.4:  # a loaded machine can take longer than the delay to restart
        assert waiting == 0, "released before its delay"
    assert wait_ready(channel, "later-q", 1, WAIT_S) == 1
    arrived_at = time.monotonic()
    assert arrived_at - published_at >= 2.4
    assert arrived_at - max(published_at + 2.5, ready_at) < 3.0, "not released once due"
    _method, properties, body = channel.basic_get("later-q", auto_ack=True)
    assert (body, properties.headers) == (b"soon", {"x-delay": -2500})
    connection.close()
    broker.stop()
    broker.start()
    assert "recovered 1 delayed messages of exchange 'later'" in broker.log_text()


def test_a_delayed_message_due_during_the_downtime_is_routed_at_start(broker_factory):
    broker = broker_factory()
    connection, channel = open_confirming(broker)
    delayed_topology(channel)
    channel.basic_publish("later", "k", b"due", delayed(500))
    connection.close()
    broker.stop()
    time.sleep(0.7)
    broker.start()
    connection, channel = open_confirming(broker)
    assert wait_ready(channel, "later-q", 1, 2.0) == 1
    connection.close()


def test_queue_defaults_from_the_config_give_queues_delayed_retry(broker_factory):
    broker = broker_factory(TEST_CONFIG + """
[[queue_defaults]]
vhost = "/"
pattern = "^jobs\\\\."
delayed_retry_type = "failed"
delayed_retry_min = 700
delivery_limit = 3
""")
    connection, channel = open_confirming(broker)
    channel.queue_declare("jobs.email")
    channel.queue_declare("events")
    for queue in ("jobs.email", "events"):
        channel.basic_publish("", queue, b"m")
        method, _properties, _body = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=True)
    assert channel.queue_declare("events", passive=True).method.message_count == 1  # not covered
    assert channel.queue_declare("jobs.email", passive=True).method.message_count == 0
    assert wait_ready(channel, "jobs.email", 1, 2.0) == 1
    connection.close()


def test_recovered_messages_with_an_expiration_are_dead_lettered_on_time_without_a_consumer(broker_factory):
    broker = broker_factory()
    connection, channel = open_confirming(broker)
    channel.exchange_declare("expired-dlx", "fanout", durable=True)
    channel.queue_declare("expired-dead", durable=True)
    channel.queue_bind("expired-dead", "expired-dlx")
    channel.queue_declare("expiring-work", durable=True, arguments={"x-dead-letter-exchange": "expired-dlx"})
    for n in range(6):
        # Every other message expires: deep in the queue, behind messages that never do.
        expiring = pika.BasicProperties(delivery_mode=2, expiration="4000") if n % 2 else PERSISTENT
        channel.basic_publish("", "expiring-work", b"m%d" % n, expiring)
    connection.close()
    broker.kill()
    broker.start()

    connection, channel = open_confirming(broker)
    assert channel.queue_declare("expiring-work", passive=True).method.message_count == 6
    assert wait_ready(channel, "expired-dead", 3, WAIT_S) == 3
    assert channel.queue_declare("expiring-work", passive=True).method.message_count == 3
    dead = [channel.basic_get("expired-dead", auto_ack=True) for _ in range(3)]
    assert [body for _m, _p, body in dead] == [b"m1", b"m3", b"m5"]
    assert {properties.headers["x-death"][0]["reason"] for _m, properties, _b in dead} == {"expired"}
    left = [channel.basic_get("expiring-work", auto_ack=True)[2] for _ in range(3)]
    assert left == [b"m0", b"m2", b"m4"]
    connection.close()
