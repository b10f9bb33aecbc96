"""Policies and limits as a kombu (Celery) application meets them: queues it declared change
under a policy set afterwards, and a limit refuses it with RabbitMQ's text.

Checked against RabbitMQ 3.10 with INTEROP_BROKER_URL and INTEROP_MANAGEMENT_URL.
"""

from __future__ import annotations

from collections.abc import Iterator

import amqp
import pytest
from kombu import Connection, Exchange, Producer, Queue

from interop_tests.kombu_helpers import kombu_url
from interop_tests.management_helpers import api, managed, quote  # noqa: F401 (fixtures)
from interop_tests.waiting import poll

LIVE_S = 1.0


@pytest.fixture
def conn(managed) -> Iterator[Connection]:
    connection = Connection(kombu_url(managed[0]), connect_timeout=10)
    connection.connect()
    try:
        yield connection
    finally:
        connection.release()


def ready(conn: Connection, name: str) -> int:
    return conn.default_channel.queue_declare(name, passive=True).message_count


def test_a_celery_style_queue_is_capped_and_dead_lettered_by_a_policy(api, conn, unique):
    name, dead = unique("kombu-pol"), unique("kombu-pol-dead")
    exchange = Exchange(unique("kombu-pol-x"), "direct", durable=False, auto_delete=True)
    queue = Queue(name, exchange, routing_key="task", durable=False, auto_delete=False)
    dead_queue = Queue(dead, Exchange("", "direct"), routing_key=dead, durable=False)
    channel = conn.default_channel
    queue(channel).declare()
    dead_queue(channel).declare()
    producer = Producer(channel, exchange)
    for number in range(4):
        producer.publish({"task": number}, routing_key="task", serializer="json")
    assert poll(lambda: ready(conn, name) == 4, LIVE_S)
    api.set_policy(name, f"^{name}$", {"max-length": 1, "dead-letter-exchange": "", "dead-letter-routing-key": dead},
                   apply_to="queues")
    assert poll(lambda: ready(conn, name) == 1, LIVE_S), "trimmed to the policy's max-length"
    assert poll(lambda: ready(conn, dead) == 3, LIVE_S), "what was dropped went to the dead-letter queue"
    message = queue(channel).get(no_ack=True)
    assert message.payload == {"task": 3}
    channel.queue_delete(name)
    channel.queue_delete(dead)


def test_priority_arguments_and_an_operator_policy_decide_a_kombu_queues_length(api, conn, unique):
    """The highest-priority policy applies; for a limit the lowest of policy, operator policy and
    the queue's own argument wins."""
    name = unique("kombu-prec")
    queue = Queue(name, Exchange("", "direct"), routing_key=name, durable=False, auto_delete=False,
                  queue_arguments={"x-max-length": 5})
    channel = conn.default_channel
    queue(channel).declare()
    api.set_policy(name + "-broad", f"^{name}", {"max-length": 1}, priority=0, apply_to="queues")
    api.set_policy(name + "-exact", f"^{name}$", {"max-length": 4}, priority=7, apply_to="queues")
    producer = Producer(channel)
    assert poll(lambda: api.get(f"/api/queues/%2F/{name}").get("policy") == name + "-exact", 10.0)
    for number in range(6):
        producer.publish({"n": number}, exchange="", routing_key=name, serializer="json")
    assert poll(lambda: ready(conn, name) == 4, LIVE_S), "the priority-7 policy's 4, below the argument's 5"
    api.set_policy(name + "-cap", f"^{name}$", {"max-length": 2}, apply_to="queues", operator=True)
    assert poll(lambda: ready(conn, name) == 2, LIVE_S), "the operator policy caps both"
    message = queue(channel).get(no_ack=True)
    assert message.payload == {"n": 4}
    channel.queue_delete(name)


def test_a_vhost_connection_limit_refuses_a_kombu_connection(api, managed, unique):
    vhost = unique("kombu-lim")
    api.add_vhost(vhost)
    api.put(f"/api/vhost-limits/{quote(vhost)}/max-connections", {"value": 0})
    refused = Connection(kombu_url(managed[0], vhost=vhost), connect_timeout=10)
    with pytest.raises(amqp.exceptions.NotAllowed) as raised:
        refused.connect()
    assert str(raised.value.reply_text) == (
        f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (0) is reached")
    refused.release()
