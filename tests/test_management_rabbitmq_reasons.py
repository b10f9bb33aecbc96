"""Error bodies that name what is missing, as RabbitMQ 3.10's management API words them.

Tools written for RabbitMQ match on these reasons (e.g. `vhost_not_found`), so a generic
"Object Not Found" is not enough.
"""

from __future__ import annotations

from tests.test_management_client import api, broker  # noqa: F401

GET_BODY = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}


def _error(reply) -> tuple[int, dict]:
    return reply.status, reply.json()


def test_binding_to_a_missing_end_names_it(api, broker):
    api.request("PUT", "/api/exchanges/%2F/orders", {"type": "topic"})
    api.request("PUT", "/api/queues/%2F/log", {})
    assert _error(api.request("POST", "/api/bindings/%2F/e/orders/q/nope", {"routing_key": "x"})) == (
        404, {"error": "not_found", "reason": "no queue 'nope' in vhost '/'"})
    # The source is checked first.
    assert _error(api.request("POST", "/api/bindings/%2F/e/gone/q/nope", {"routing_key": "x"})) == (
        404, {"error": "not_found", "reason": "no exchange 'gone' in vhost '/'"})
    assert _error(api.request("POST", "/api/bindings/%2F/e/orders/e/gone", {"routing_key": "x"})) == (
        404, {"error": "not_found", "reason": "no exchange 'gone' in vhost '/'"})
    assert _error(api.request("POST", "/api/bindings/novh/e/orders/q/log", {"routing_key": "x"})) == (
        404, {"error": "not_found", "reason": "vhost_not_found"})


def test_listing_bindings_between_missing_ends_is_empty(api, broker):
    api.request("PUT", "/api/exchanges/%2F/orders", {"type": "topic"})
    assert api.get("/api/bindings/%2F/e/orders/q/nope") == []
    assert api.get("/api/bindings/novh/e/orders/q/log") == []


def test_declaring_in_a_missing_vhost_is_vhost_not_found(api, broker):
    expected = (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert _error(api.request("PUT", "/api/queues/novh/q", {})) == expected
    assert _error(api.request("PUT", "/api/exchanges/novh/e", {"type": "direct"})) == expected
    assert _error(api.request("POST", "/api/definitions/novh", {})) == expected
    assert _error(api.request("GET", "/api/definitions/novh")) == (
        400, {"error": "bad_request", "reason": "vhost_not_found"})


def test_getting_from_a_missing_queue_quotes_the_amqp_error(api, broker):
    assert _error(api.request("POST", "/api/queues/%2F/nope/get", GET_BODY)) == (
        404, {"error": "not_found", "reason": "NOT_FOUND - no queue 'nope' in vhost '/'"})
    assert _error(api.request("POST", "/api/queues/novh/nope/get", GET_BODY)) == (
        401, {"error": "not_authorised", "reason": "Access refused."})


def test_publish_needs_all_four_keys_and_lists_the_missing_ones(api, broker):
    api.request("PUT", "/api/queues/%2F/q1", {})
    path = "/api/exchanges/%2F/amq.default/publish"
    assert _error(api.request("POST", path, {"routing_key": "q1", "payload": "x"})) == (
        400, {"error": "bad_request", "reason": "[{key_missing,properties},{key_missing,payload_encoding}]"})
    # Erlang's ~p breaks a list of 80 columns or more after each element (RabbitMQ 3.10's exact texts).
    assert api.request("POST", path, {"payload_encoding": "string"}).json()["reason"] == (
        "[{key_missing,routing_key},{key_missing,properties},{key_missing,payload}]")
    assert api.request("POST", path, {}).json()["reason"] == (
        "[{key_missing,routing_key},\n {key_missing,properties},\n {key_missing,payload},\n"
        " {key_missing,payload_encoding}]")
    # The keys are checked before the exchange is looked up.
    assert api.request("POST", "/api/exchanges/%2F/nope/publish", {"routing_key": "q1"}).json()["reason"] == (
        "[{key_missing,properties},\n {key_missing,payload},\n {key_missing,payload_encoding}]")
    assert broker.vhosts["/"].queues["q1"].message_count == 0
