"""`messages_delayed` in the queue JSON: messages waiting for a delayed retry, which are neither
`messages_ready` nor `messages_unacknowledged` (RabbitMQ 3.10 has no such field)."""

from __future__ import annotations

import time

from pamqp import commands

from tests.frame_driver import methods, opened_client
from tests.test_management_client import api, broker  # noqa: F401  (fixtures)

RETRY = {"x-delayed-retry-type": "failed", "x-delayed-retry-min": 60_000}


def reject_two_of_three(broker) -> None:
    client = opened_client(broker)
    client.call(1, commands.Queue.Declare(queue="jobs", arguments=RETRY))
    client.call(1, commands.Queue.Declare(queue="plain"))
    for index in range(3):
        client.publish(1, b"job %d" % index, routing_key="jobs")
    for _ in range(2):
        got = methods(client.send(1, commands.Basic.Get(queue="jobs")))[0]
        client.send(1, commands.Basic.Reject(delivery_tag=got.delivery_tag, requeue=True))


def counts(queue: dict) -> tuple[int, int, int, int]:
    return queue["messages_ready"], queue["messages_unacknowledged"], queue["messages"], queue["messages_delayed"]


def test_waiting_messages_are_messages_delayed_and_come_back_as_ready(api, broker):
    reject_two_of_three(broker)
    listed = {queue["name"]: queue for queue in api.get("/api/queues/%2F")}
    assert counts(listed["jobs"]) == (1, 0, 1, 2)
    assert counts(listed["plain"]) == (0, 0, 0, 0)  # every queue has the field
    assert counts(api.get("/api/queues/%2F/jobs")) == (1, 0, 1, 2)

    broker.timers.run_due(time.time() + 61)  # the retry delay has passed
    assert counts(api.get("/api/queues/%2F/jobs")) == (3, 0, 3, 0)
