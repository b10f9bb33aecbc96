"""Changing the broker through the management API: RabbitMQ's verbs, status codes and errors."""

from __future__ import annotations

import urllib.parse

from pamqp import commands

from amqp_server.config.auth import verify_password
from tests.frame_driver import methods, opened_client
from tests.test_management_client import ManagementClient, api, broker, broker_with_users  # noqa: F401


def test_vhosts_are_created_once_and_deleted_with_their_permissions(api, broker):
    assert api.request("PUT", "/api/vhosts/v2").status == 201
    assert api.request("PUT", "/api/vhosts/v2").status == 204
    # RabbitMQ gives the creator full permissions on a vhost made through the API.
    assert api.get("/api/vhosts/v2/permissions") == [
        {"user": "guest", "vhost": "v2", "configure": ".*", "write": ".*", "read": ".*"}]
    assert "v2" in broker.definitions()["vhosts"][-1]["name"]
    assert api.request("DELETE", "/api/vhosts/v2").status == 204
    assert "v2" not in broker.vhosts
    assert all(p.vhost != "v2" for p in broker.access.permissions())
    assert api.request("DELETE", "/api/vhosts/v2").status == 404


def test_users_need_tags_and_get_hashed_passwords(api, broker):
    reply = api.request("PUT", "/api/users/alice", {"password": "secret"})
    assert (reply.status, reply.json()["reason"]) == (400, "tags_not_present")
    assert api.request("PUT", "/api/users/alice", {"password": "secret", "tags": "management,monitoring"}).status == 201
    alice = api.get("/api/users/alice")
    assert alice["tags"] == ["management", "monitoring"]
    assert verify_password(alice["password_hash"], "secret")
    # Changing only the tags keeps the password.
    assert api.request("PUT", "/api/users/alice", {"tags": ["administrator"]}).status == 204
    assert verify_password(broker.access.user("alice").password_hash, "secret")
    assert api.get("/api/whoami", user="alice", password="secret")["tags"] == ["administrator"]
    assert api.request("DELETE", "/api/users/alice").status == 204
    assert api.request("GET", "/api/users/alice").status == 404


def test_permissions_are_set_and_cleared(api, broker):
    body = {"configure": "^x", "write": ".*", "read": ".*"}
    assert api.request("PUT", "/api/permissions/other/mgmt", body).status == 201
    assert api.request("PUT", "/api/permissions/other/mgmt", body).status == 204
    assert api.get("/api/permissions/other/mgmt")["configure"] == "^x"
    assert api.get("/api/users/mgmt/permissions")[1]["vhost"] == "other"
    missing = api.request("PUT", "/api/permissions/nowhere/mgmt", body)
    assert (missing.status, missing.json()["reason"]) == (400, "vhost_or_user_not_found")
    assert api.request("PUT", "/api/permissions/other/mgmt", {"configure": "("} | {"write": "", "read": ""}).status == 400
    assert api.request("DELETE", "/api/permissions/other/mgmt").status == 204
    assert not broker.access.can_access_vhost(broker.access.user("mgmt"), "other")


def test_queues_are_declared_with_rabbitmqs_defaults_and_equivalence_checks(api, broker):
    assert api.request("PUT", "/api/queues/%2F/jobs", {"durable": "true", "arguments": {"x-max-length": 5}}).status == 201
    assert api.request("PUT", "/api/queues/%2F/jobs", {"durable": True, "arguments": {"x-max-length": 5}}).status == 204
    clash = api.request("PUT", "/api/queues/%2F/jobs", {"durable": False})
    assert clash.status == 400
    assert clash.json() == {"error": "bad_request", "reason": "inequivalent arg 'durable' for queue 'jobs' in vhost "
                                                              "'/': received 'false' but current is 'true'"}
    assert api.request("PUT", "/api/queues/%2F/amq.reserved", {}).status == 401
    assert api.request("PUT", "/api/queues/%2F/plain", {}).status == 201
    assert broker.vhosts["/"].queues["plain"].durable is False  # RabbitMQ's API default
    assert broker.stats.queues_created == 2


def test_queue_delete_honours_if_empty_and_if_unused(api, broker):
    queue, _ = broker.vhosts["/"].declare_queue("busy", connection=None)
    client = opened_client(broker)
    client.publish(1, b"x", routing_key="busy")
    reply = api.request("DELETE", "/api/queues/%2F/busy?if-empty=true")
    assert (reply.status, reply.json()["reason"]) == (400, "queue 'busy' in vhost '/' not empty")
    assert api.request("DELETE", "/api/queues/%2F/busy").status == 204
    assert "busy" not in broker.vhosts["/"].queues and broker.stats.queues_deleted == 1
    assert api.request("DELETE", "/api/queues/%2F/busy").status == 404


def test_purge_empties_the_ready_messages(api, broker):
    broker.vhosts["/"].declare_queue("p", connection=None)
    client = opened_client(broker)
    for _ in range(3):
        client.publish(1, b"x", routing_key="p")
    assert api.request("DELETE", "/api/queues/%2F/p/contents").status == 204
    assert broker.vhosts["/"].queues["p"].message_count == 0


def test_exchanges_are_declared_and_deleted(api, broker):
    assert api.request("PUT", "/api/exchanges/%2F/events", {"type": "fanout", "durable": True}).status == 201
    assert api.request("PUT", "/api/exchanges/%2F/events", {"type": "fanout", "durable": True}).status == 204
    assert api.request("PUT", "/api/exchanges/%2F/events", {"type": "topic", "durable": True}).status == 400
    bad_type = api.request("PUT", "/api/exchanges/%2F/odd", {"type": "bogus"})
    assert bad_type.json() == {"error": "bad_request", "reason": "unknown exchange type 'bogus'"}
    assert api.request("PUT", "/api/exchanges/%2F/amq.mine", {"type": "direct"}).status == 401
    assert api.request("DELETE", "/api/exchanges/%2F/amq.direct").status == 401
    assert api.request("DELETE", "/api/exchanges/%2F/events").status == 204
    assert "events" not in broker.vhosts["/"].exchanges


def test_bindings_are_created_listed_and_deleted_by_properties_key(api, broker):
    broker.vhosts["/"].declare_queue("bq", connection=None)
    created = api.request("POST", "/api/bindings/%2F/e/amq.headers/q/bq",
                          {"routing_key": "", "arguments": {"x-match": "any", "kind": "a"}})
    assert created.status == 201
    props = created.headers["Location"].split("/")[-1]
    assert props.startswith("~")
    [binding] = api.get("/api/bindings/%2F/e/amq.headers/q/bq")
    assert binding["properties_key"] == props and binding["arguments"] == {"x-match": "any", "kind": "a"}
    assert api.get(f"/api/bindings/%2F/e/amq.headers/q/bq/{urllib.parse.quote(props)}") == binding
    assert api.request("POST", "/api/bindings/%2F/e/amq.topic/e/amq.fanout", {"routing_key": "k"}).status == 201
    assert api.get("/api/exchanges/%2F/amq.fanout/bindings/destination")[0]["source"] == "amq.topic"
    assert api.request("DELETE", f"/api/bindings/%2F/e/amq.headers/q/bq/{props}").status == 204
    assert api.get("/api/bindings/%2F/e/amq.headers/q/bq") == []
    assert api.request("POST", "/api/bindings/%2F/e/missing/q/bq", {}).status == 404


def test_closing_a_connection_sends_connection_forced(api, broker):
    client = opened_client(broker)
    [connection] = api.get("/api/connections")
    name = urllib.parse.quote(connection["name"], safe="")
    reply = api.request("DELETE", f"/api/connections/{name}", headers={"X-Reason": "maintenance"})
    assert reply.status == 204
    [close] = methods(client.take())
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (320, "CONNECTION_FORCED - maintenance")
    assert api.request("DELETE", "/api/connections/nobody").status == 404


def test_publishing_through_the_api_routes_like_basic_publish(api, broker):
    broker.vhosts["/"].declare_queue("inbox", connection=None)
    reply = api.request("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": "inbox", "payload": "aGk=", "payload_encoding": "base64",
        "properties": {"content_type": "text/plain", "headers": {"n": 1}, "delivery_mode": 2}})
    assert reply.json() == {"routed": True}
    assert api.request("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": "nowhere", "payload": "x", "payload_encoding": "string", "properties": {}}).json() == {
        "routed": False}
    [entry] = broker.vhosts["/"].queues["inbox"].ready.peek(1)
    assert entry.message.body == b"hi"
    assert entry.message.properties.content_type == "text/plain"
    assert entry.message.properties.headers == {"n": 1}
    assert (broker.stats.received, broker.stats.routed, broker.stats.dropped) == (2, 1, 1)
    missing = api.request("POST", "/api/exchanges/%2F/nope/publish", {
        "routing_key": "x", "payload": "", "payload_encoding": "string", "properties": {}})
    assert (missing.status, missing.json()["reason"]) == (400, "404 NOT_FOUND - no exchange 'nope' in vhost '/'")


def test_definitions_exported_from_one_broker_import_into_another(api, broker):
    client = opened_client(broker)
    client.call(1, commands.Exchange.Declare(exchange="orders", exchange_type="topic", durable=True))
    client.call(1, commands.Queue.Declare(queue="order-log", durable=True, arguments={"x-message-ttl": 60000}))
    client.call(1, commands.Queue.Bind(queue="order-log", exchange="orders", routing_key="order.#"))
    api.request("PUT", "/api/users/carol", {"password": "pw", "tags": "management"})
    exported = api.get("/api/definitions")
    assert {"rabbit_version", "users", "vhosts", "permissions", "queues", "exchanges", "bindings", "policies"} <= \
        exported.keys()

    target = ManagementClient(broker_with_users())
    try:
        assert target.request("POST", "/api/definitions", exported).status == 204
        assert target.get("/api/queues/%2F/order-log")["arguments"] == {"x-message-ttl": 60000}
        assert [b["routing_key"] for b in target.get("/api/exchanges/%2F/orders/bindings/source")] == ["order.#"]
        assert target.get("/api/whoami", user="carol", password="pw")["name"] == "carol"
        assert target.get("/api/definitions/%2F")["queues"] == [
            {"name": "order-log", "durable": True, "auto_delete": False, "arguments": {"x-message-ttl": 60000}}]
    finally:
        target.close()


def test_importing_into_one_vhost_ignores_vhost_fields(api, broker):
    document = {"queues": [{"name": "imported", "durable": True, "auto_delete": False, "arguments": {}}],
                "exchanges": [], "bindings": []}
    assert api.request("POST", "/api/definitions/other", document).status == 204
    assert "imported" in broker.vhosts["other"].queues
    bad = api.request("POST", "/api/definitions", {"queues": [{"name": "q", "vhost": "missing"}]})
    assert bad.status == 400


def test_importing_a_queue_with_a_reserved_name_creates_nothing_as_rabbitmq(api, broker):
    document = {"queues": [{"name": "amq.gen-imported", "vhost": "/", "durable": True, "arguments": {}},
                           {"name": "ordinary", "vhost": "/", "durable": True, "arguments": {}}]}
    assert api.request("POST", "/api/definitions", document).status == 204
    assert "amq.gen-imported" not in broker.vhosts["/"].queues and "ordinary" in broker.vhosts["/"].queues


def test_malformed_bodies_are_400(api):
    assert api.request("PUT", "/api/queues/%2F/q", raw=b"{not json").status == 400
    assert api.request("PUT", "/api/queues/%2F/q", {"durable": "maybe"}).status == 400


def test_put_vhost_switches_tracing(api, broker):
    assert api.request("PUT", "/api/vhosts/%2F", {"tracing": True}).status == 204
    assert broker.vhosts["/"].firehose is not None
    assert api.get("/api/vhosts/%2F")["tracing"] is True
    assert api.request("PUT", "/api/vhosts/%2F", {"tracing": "false"}).status == 204
    assert broker.vhosts["/"].firehose is None
    assert api.get("/api/vhosts/%2F")["tracing"] is False
