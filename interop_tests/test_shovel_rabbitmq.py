"""RabbitMQ 3.10 as a shovel's peer (issue 25, point 3), each started by the test on free ports:

- the migration: a shovel on this broker empties a RabbitMQ queue into this broker, every
  message once, in order, with its properties, and deletes itself (src-delete-after queue-length);
- a shovel on this broker moves a queue of this broker into RabbitMQ;
- RabbitMQ's own shovel plugin pulls from this broker (this broker as RabbitMQ's peer);
- a refused login at RabbitMQ terminates the shovel with RabbitMQ's 403 text.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pika
import pytest
import requests

from interop_tests.broker_process import BrokerProcess, free_port, launch
from interop_tests.rabbitmq_nodes import SHOVEL, RabbitNode, start_rabbitmq
from interop_tests.waiting import poll

pytestmark = pytest.mark.skipif(bool(os.environ.get("INTEROP_BROKER_URL")), reason="starts its own brokers")


@pytest.fixture(scope="module")
def rabbit() -> Iterator[RabbitNode]:
    node = start_rabbitmq(SHOVEL)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    broker = launch(tmp_path_factory.mktemp("shovel-peer"), extra_args=("--management-port", str(port)))
    try:
        yield broker, f"http://127.0.0.1:{port}"
    finally:
        broker.stop()


def publish(url: str, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for i in range(count):
        channel.basic_publish("", queue, b"message %d" % i, pika.BasicProperties(
            delivery_mode=2, message_id=str(i), headers={"n": i}, content_type="text/plain"))
    connection.close()


def drain(url: str, queue: str) -> list[tuple[bytes, pika.BasicProperties]]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((body, properties))
    connection.close()
    return got


def depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def put_shovel(api: str, name: str, value: dict) -> None:
    reply = requests.put(f"{api}/api/parameters/shovel/%2F/{name}", json={"value": value}, auth=("guest", "guest"),
                         timeout=10)
    assert reply.status_code == 201, reply.text


def test_a_rabbitmq_queue_is_migrated_into_this_broker(rabbit, ours):
    broker, api = ours
    publish(rabbit.amqp_url(), "legacy", 2000)
    put_shovel(api, "migrate-legacy", {"src-uri": rabbit.amqp_url(), "src-queue": "legacy", "dest-uri": "amqp://",
                                       "dest-queue": "legacy", "src-delete-after": "queue-length"})
    gone = lambda: requests.get(f"{api}/api/parameters/shovel", auth=("guest", "guest"), timeout=10).json() == []
    assert poll(gone, 60, every=0.2), "the shovel did not finish"
    assert rabbit.queue_depth("legacy") == 0
    messages = drain(broker.url(), "legacy")
    assert [body for body, _properties in messages] == [b"message %d" % i for i in range(2000)]
    assert all(properties.message_id == str(i) and properties.headers == {"n": i} and properties.delivery_mode == 2
               and properties.content_type == "text/plain" for i, (_body, properties) in enumerate(messages))


def test_this_broker_shovels_a_queue_into_rabbitmq(rabbit, ours):
    broker, api = ours
    publish(broker.url(), "outbound", 1000)
    put_shovel(api, "to-rabbit", {"src-uri": "amqp://", "src-queue": "outbound", "dest-uri": rabbit.amqp_url(),
                                  "dest-queue": "inbound", "dest-add-forward-headers": True})
    assert poll(lambda: rabbit.queue_depth("inbound") == 1000, 60, every=0.2)
    assert depth(broker.url(), "outbound") == 0
    status = requests.get(f"{api}/api/shovels", auth=("guest", "guest"), timeout=10).json()
    mine = [item for item in status if item["name"] == "to-rabbit"][0]
    assert mine["state"] == "running" and mine["dest_uri"] == f"amqp://127.0.0.1:{rabbit.amqp_port}/%2F"
    messages = drain(rabbit.amqp_url(), "inbound")
    assert [body for body, _p in messages] == [b"message %d" % i for i in range(1000)]
    assert messages[0][1].headers["x-shovelled"][0]["shovel-name"] == "to-rabbit"


def test_rabbitmqs_own_shovel_pulls_from_this_broker(rabbit, ours):
    broker, _api = ours
    publish(broker.url(), "for-rabbit", 500)
    status, _body = rabbit.api("PUT", "/api/parameters/shovel/%2F/from-ours", {"value": {
        "src-uri": broker.url(), "src-queue": "for-rabbit", "dest-uri": "amqp://", "dest-queue": "from-ours"}})
    assert status == 201
    assert poll(lambda: rabbit.queue_depth("from-ours") == 500, 60, every=0.2)
    assert depth(broker.url(), "for-rabbit") == 0
    assert [body for body, _p in drain(rabbit.amqp_url(), "from-ours")] == [b"message %d" % i for i in range(500)]
    rabbit.api("DELETE", "/api/parameters/shovel/%2F/from-ours")


def test_a_login_rabbitmq_refuses_terminates_the_shovel_with_its_text(rabbit, ours):
    _broker, api = ours
    put_shovel(api, "refused", {"src-uri": rabbit.amqp_url(password="wrong"), "src-queue": "x",
                                "dest-uri": "amqp://", "dest-queue": "x"})

    def terminated() -> dict | None:
        status = requests.get(f"{api}/api/shovels/%2F", auth=("guest", "guest"), timeout=10).json()
        found = [item for item in status if item["name"] == "refused" and item["state"] == "terminated"]
        return found[0] if found else None

    assert poll(lambda: terminated() is not None, 30, every=0.2)
    assert "403 ACCESS_REFUSED" in terminated()["reason"]
