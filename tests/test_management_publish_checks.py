"""POST /api/exchanges/{vhost}/{name}/publish goes through the same content header check as
basic.publish: what AMQP clients could not decode is refused with 400, as RabbitMQ's API does."""

from __future__ import annotations

from tests.test_management_client import api, broker  # noqa: F401  (fixtures)


def publish(api, properties: dict):
    return api.request("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": "inbox", "payload": "x", "payload_encoding": "string", "properties": properties})


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_a_delivery_mode_rabbitmq_refuses_gives_its_400(api, broker):
    broker.vhosts["/"].declare_queue("inbox", connection=None)
    reply = publish(api, {"delivery_mode": 7})
    assert (reply.status, reply.json()["reason"]) == (
        400, "406 PRECONDITION_FAILED - invalid message: {delivery_mode_unknown,7}")
    assert broker.vhosts["/"].queues["inbox"].message_count == 0


def test_headers_nested_beyond_the_limit_give_400_and_at_the_limit_are_published(api, broker):
    broker.vhosts["/"].declare_queue("inbox", connection=None)
    for levels in (65, 900):
        reply = publish(api, {"headers": nested(levels)})
        assert (reply.status, reply.json()["reason"]) == (
            400, "406 PRECONDITION_FAILED - invalid message: tables and arrays nested deeper than 64"), levels
    assert broker.vhosts["/"].queues["inbox"].message_count == 0
    assert publish(api, {"headers": nested(64)}).json() == {"routed": True}


def test_a_routing_key_longer_than_a_short_string_is_refused(api, broker):
    # RabbitMQ 3.10 answers 200 and routes it (through amq.fanout, say); delivering it then closes
    # the consumer's connection with 541 and the message is lost. Refused here at the door.
    for exchange in ("amq.default", "amq.fanout"):
        reply = api.request("POST", f"/api/exchanges/%2F/{exchange}/publish", {
            "routing_key": "k" * 256, "payload": "x", "payload_encoding": "string", "properties": {}})
        assert reply.status == 400
        assert "routing key of 256 bytes: AMQP 0-9-1 allows 255" in reply.json()["reason"]
    reply = api.request("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": "k" * 255, "payload": "x", "payload_encoding": "string", "properties": {}})
    assert (reply.status, reply.json()) == (200, {"routed": False})
