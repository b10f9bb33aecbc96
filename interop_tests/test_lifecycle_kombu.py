"""kombu: Celery's native delayed delivery topology (TTL queues chained by dead-lettering),
priorities, and delayed retry with a delivery limit."""

from __future__ import annotations

import time

import amqp.exceptions
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    calculate_routing_key,
    declare_native_delayed_delivery_exchanges_and_queues,
    level_name,
)

from interop_tests.kombu_helpers import WAIT_S, drain_until, kombu_url


def test_celery_native_delayed_delivery_holds_a_task_for_its_countdown(broker, unique):
    """The topology kombu.transport.native_delayed_delivery declares for Celery ETA tasks:
    28 topic exchanges and queues celery_delayed_<level> with x-message-ttl 2^level s, each
    dead-lettering into the next level, exchange-to-exchange bindings on the routing key's bits,
    and x-overflow reject-publish; a task published to level 27 with a countdown comes out of
    celery_delayed_delivery into the task queue after that countdown."""
    prefix = unique("ndd")
    with Connection(kombu_url(broker), connect_timeout=WAIT_S) as conn:
        declare_native_delayed_delivery_exchanges_and_queues(conn, "classic", prefix=prefix)
        tasks_exchange = Exchange(unique("tasks"), type="topic", auto_delete=True)
        tasks = Queue(unique("tasks-q"), exchange=tasks_exchange, routing_key="celery.tasks", auto_delete=True)
        with conn.channel() as channel:
            tasks.bind(channel).declare()
        bind_queue_to_native_delayed_delivery_exchange(conn, tasks, prefix=prefix)

        received: list[tuple[float, dict]] = []
        with conn.channel() as channel:
            producer = Producer(channel)
            routing_key = calculate_routing_key(3, "celery.tasks")
            sent_at = time.monotonic()
            producer.publish(
                {"task": "add", "args": [2, 3]},
                exchange=level_name(27, prefix),
                routing_key=routing_key,
                delivery_mode=2,
                serializer="json",
            )
            producer.publish({"task": "now"}, exchange=tasks_exchange, routing_key="celery.tasks", serializer="json")

            def on_message(body, message) -> None:
                received.append((time.monotonic() - sent_at, body, message.headers))
                message.ack()

            with Consumer(channel, [tasks], callbacks=[on_message]):
                drain_until(conn, lambda: len(received) == 2)
    (now_at, now_body, _), (later_at, later_body, headers) = received
    assert now_body == {"task": "now"} and now_at < 2.0  # well before the delayed one
    assert later_body == {"task": "add", "args": [2, 3]}
    assert 2.9 <= later_at < 3.0 + 2.0  # 3 s = levels 1 (2 s) and 0 (1 s)
    deaths = headers["x-death"]
    assert [(d["queue"], d["reason"]) for d in deaths] == [
        (level_name(0, prefix), "expired"), (level_name(1, prefix), "expired")
    ]


def test_the_native_delayed_delivery_levels_are_declared_as_celery_expects(broker, unique):
    prefix = unique("ndd-levels")
    with Connection(kombu_url(broker), connect_timeout=WAIT_S) as conn:
        declare_native_delayed_delivery_exchanges_and_queues(conn, "classic", prefix=prefix)
        with conn.channel() as channel:
            for level in (0, 5, 27):
                # Redeclaring with the same arguments is accepted (kombu does so on every start).
                Queue(level_name(level, prefix), queue_arguments={
                    "x-queue-type": "classic", "x-overflow": "reject-publish",
                    "x-message-ttl": pow(2, level) * 1000,
                    "x-dead-letter-exchange": level_name(level - 1, prefix) if level else f"{prefix}_celery_delayed_delivery",
                }).bind(channel).declare()
        for level in (0, 5, 27):
            # ...and the TTL really is 2^level s: any other TTL is an inequivalent redeclare.
            with conn.channel() as channel:
                with pytest.raises(amqp.exceptions.PreconditionFailed) as refused:
                    Queue(level_name(level, prefix), queue_arguments={
                        "x-queue-type": "classic", "x-overflow": "reject-publish",
                        "x-message-ttl": pow(2, level) * 1000 + 1,
                        "x-dead-letter-exchange": level_name(level - 1, prefix) if level else f"{prefix}_celery_delayed_delivery",
                    }).bind(channel).declare()
                assert refused.value.code == 406
                assert "x-message-ttl" in str(refused.value)


def test_kombu_priorities_deliver_urgent_tasks_first(broker, unique):
    queue = Queue(unique("kombu-prio"), max_priority=9, auto_delete=True)
    with Connection(kombu_url(broker), connect_timeout=WAIT_S) as conn:
        with conn.channel() as channel:
            queue.bind(channel).declare()
            producer = Producer(channel)
            for body, priority in (("routine", 1), ("urgent", 9), ("normal", 4)):
                producer.publish(body, routing_key=queue.name, priority=priority, serializer="json")
        simple = conn.SimpleQueue(queue)
        got = []
        for _ in range(3):
            message = simple.get(timeout=WAIT_S)
            got.append(message.payload)
            message.ack()
        simple.close()
    assert got == ["urgent", "normal", "routine"]


def test_kombu_requeue_waits_for_the_delayed_retry_and_the_limit_dead_letters(broker, unique):
    if broker.is_external:
        pytest.skip("delayed retry is this broker's extension")
    dead = Queue(unique("kombu-dead"), auto_delete=True)
    work = Queue(unique("kombu-work"), auto_delete=True, queue_arguments={
        "x-delayed-retry-type": "failed", "x-delayed-retry-min": 400, "x-delivery-limit": 1,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead.name,
    })
    seen: list[float] = []
    with Connection(kombu_url(broker), connect_timeout=WAIT_S) as conn:
        with conn.channel() as channel:
            dead.bind(channel).declare()
            work.bind(channel).declare()
            Producer(channel).publish("flaky", routing_key=work.name, serializer="json")

            def on_message(body, message) -> None:
                seen.append(time.monotonic())
                message.requeue()

            with Consumer(channel, [work], callbacks=[on_message]):
                drain_until(conn, lambda: len(seen) == 2)
        assert seen[1] - seen[0] >= 0.38
        simple = conn.SimpleQueue(dead)
        message = simple.get(timeout=WAIT_S)
        assert message.payload == "flaky"
        assert message.headers["x-death"][0]["reason"] == "delivery_limit"
        message.ack()
        simple.close()
