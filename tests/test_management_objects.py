"""What the management API reports about a broker in use, in RabbitMQ's JSON shapes.

The key sets are RabbitMQ 3.10's (captured from its management plugin), minus the Erlang
internals (garbage_collection, reductions, backing_queue_status, memory) and byte counters
this broker does not keep.
"""

from __future__ import annotations

import time
import urllib.parse

import pytest
from pamqp import commands

from tests.frame_driver import marshal, methods, opened_client
from tests.test_management_client import api, broker  # noqa: F401  (fixtures)

QUEUE_KEYS = {
    "arguments", "auto_delete", "consumers", "durable", "effective_policy_definition", "exclusive",
    "exclusive_consumer_tag", "head_message_timestamp", "message_stats", "messages", "messages_details",
    "messages_ready", "messages_ready_details", "messages_unacknowledged", "messages_unacknowledged_details",
    "name", "node", "operator_policy", "policy", "single_active_consumer_tag", "state", "type", "vhost",
}
QUEUE_MESSAGE_STATS = {"ack", "deliver", "deliver_get", "deliver_no_ack", "get", "get_empty", "get_no_ack", "publish",
                       "redeliver"}
CONNECTION_KEYS = {
    "auth_mechanism", "channel_max", "channels", "client_properties", "frame_max", "host", "name", "node",
    "peer_host", "peer_port", "port", "protocol", "ssl", "state", "timeout", "type", "user", "user_provided_name",
    "vhost",
}
CHANNEL_KEYS = {
    "acks_uncommitted", "confirm", "connection_details", "consumer_count", "global_prefetch_count",
    "messages_unacknowledged", "messages_uncommitted", "messages_unconfirmed", "name", "node", "number",
    "prefetch_count", "state", "transactional", "user", "vhost",
}
CONSUMER_KEYS = {"arguments", "ack_required", "active", "activity_status", "channel_details", "consumer_tag",
                 "exclusive", "prefetch_count", "queue"}
OVERVIEW_KEYS = {"management_version", "rates_mode", "exchange_types", "product_version", "product_name",
                 "rabbitmq_version", "cluster_name", "erlang_version", "message_stats", "churn_rates", "queue_totals",
                 "object_totals", "node", "listeners"}


@pytest.fixture
def workload(broker):
    """q: 6 published, 1 got and acked, 3 delivered to consumer "c" (prefetch 3), unacked."""
    client = opened_client(broker, channels=(1, 2))
    client.call(1, commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 1000}))
    client.call(1, commands.Exchange.Declare(exchange="x", exchange_type="topic", durable=True))
    client.call(1, commands.Queue.Bind(queue="q", exchange="x", routing_key="a.#"))
    client.call(1, commands.Confirm.Select())
    for index in range(6):
        client.publish(1, b"hello %d" % index, exchange="x", routing_key="a.b")
    client.publish(1, b"lost", exchange="x", routing_key="zzz")
    got = methods(client.send(1, commands.Basic.Get(queue="q")))[0]
    client.send(1, commands.Basic.Ack(delivery_tag=got.delivery_tag))
    client.call(2, commands.Basic.Qos(prefetch_count=3))
    client.send(2, commands.Basic.Consume(queue="q", consumer_tag="c"))
    return client


def test_queue_listing_has_current_counts_and_message_stats(api, workload):
    [queue] = api.get("/api/queues/%2F")
    assert QUEUE_KEYS <= queue.keys()
    assert (queue["name"], queue["vhost"], queue["durable"], queue["type"]) == ("q", "/", True, "classic")
    assert queue["arguments"] == {"x-max-length": 1000}
    assert (queue["messages_ready"], queue["messages_unacknowledged"], queue["messages"]) == (2, 3, 5)
    assert queue["consumers"] == 1
    stats = queue["message_stats"]
    assert QUEUE_MESSAGE_STATS <= stats.keys()
    assert {k: stats[k] for k in ("publish", "get", "deliver", "deliver_get", "ack")} == {
        "publish": 6, "get": 1, "deliver": 3, "deliver_get": 4, "ack": 1}
    assert stats["publish_details"] == {"rate": 0.0}


def test_one_queue_shows_its_consumers(api, workload):
    queue = api.get("/api/queues/%2F/q")
    [consumer] = queue["consumer_details"]
    assert consumer["consumer_tag"] == "c" and consumer["prefetch_count"] == 3
    assert api.request("GET", "/api/queues/%2F/missing").json() == {"error": "Object Not Found", "reason": "Not Found"}
    assert api.request("GET", "/api/queues/no-such-vhost").status == 404


def test_overview_totals_match_the_workload(api, workload):
    overview = api.get("/api/overview")
    assert OVERVIEW_KEYS <= overview.keys()
    assert overview["queue_totals"]["messages"] == 5
    assert overview["queue_totals"]["messages_ready"] == 2
    assert overview["object_totals"] == {"channels": 2, "connections": 1, "consumers": 1, "exchanges": 15, "queues": 1}
    stats = overview["message_stats"]
    assert (stats["publish"], stats["confirm"], stats["drop_unroutable"], stats["deliver_get"]) == (7, 7, 1, 4)
    assert overview["churn_rates"]["queue_declared"] == 1


def test_connections_channels_and_consumers_name_each_other(api, workload):
    [connection] = api.get("/api/connections")
    assert CONNECTION_KEYS <= connection.keys()
    assert (connection["user"], connection["vhost"], connection["channels"]) == ("guest", "/", 2)
    assert connection["client_properties"]["product"] == "frame-driver"
    channels = api.get("/api/channels")
    assert all(CHANNEL_KEYS <= channel.keys() for channel in channels)
    assert [c["name"] for c in channels] == [f"{connection['name']} (1)", f"{connection['name']} (2)"]
    assert channels[0]["confirm"] is True and channels[1]["messages_unacknowledged"] == 3
    assert channels[1]["connection_details"]["name"] == connection["name"]
    [consumer] = api.get("/api/consumers/%2F")
    assert CONSUMER_KEYS <= consumer.keys()
    assert consumer["channel_details"]["name"] == channels[1]["name"]
    assert consumer["queue"] == {"name": "q", "vhost": "/"}
    quoted = urllib.parse.quote(connection["name"], safe="")
    assert api.get(f"/api/connections/{quoted}")["name"] == connection["name"]
    assert len(api.get(f"/api/connections/{quoted}/channels")) == 2
    assert api.get(f"/api/channels/{urllib.parse.quote(channels[1]['name'], safe='')}")["number"] == 2


def test_exchanges_and_bindings_include_the_default_ones(api, workload):
    exchanges = {e["name"]: e for e in api.get("/api/exchanges/%2F")}
    assert {"", "amq.direct", "amq.topic", "x"} <= exchanges.keys()
    assert exchanges["x"]["type"] == "topic" and exchanges["x"]["durable"] is True
    assert api.get("/api/exchanges/%2F/amq.default")["name"] == ""
    bindings = api.get("/api/bindings/%2F")
    assert bindings == [
        {"source": "", "vhost": "/", "destination": "q", "destination_type": "queue", "routing_key": "q",
         "arguments": {}, "properties_key": "q"},
        {"source": "x", "vhost": "/", "destination": "q", "destination_type": "queue", "routing_key": "a.#",
         "arguments": {}, "properties_key": "a.%23"},
    ]
    assert [b["source"] for b in api.get("/api/queues/%2F/q/bindings")] == ["", "x"]
    assert [b["destination"] for b in api.get("/api/exchanges/%2F/x/bindings/source")] == ["q"]


def test_columns_sort_and_pagination_work_as_in_rabbitmq(api, broker):
    for name in ("b", "a", "c"):
        broker.vhosts["/"].declare_queue(name, connection=None)
    assert api.get("/api/queues?columns=name,messages") == [
        {"name": "a", "messages": 0}, {"name": "b", "messages": 0}, {"name": "c", "messages": 0}]
    assert [q["name"] for q in api.get("/api/queues?sort=name&sort_reverse=true")] == ["c", "b", "a"]
    assert api.get("/api/overview?columns=queue_totals.messages,object_totals.queues") == {
        "queue_totals": {"messages": 0}, "object_totals": {"queues": 3}}
    page = api.get("/api/queues?page=2&page_size=2&columns=name")
    assert page == {"filtered_count": 3, "item_count": 1, "items": [{"name": "c"}], "page": 2, "page_count": 2,
                    "page_size": 2, "total_count": 3}
    assert api.get("/api/queues?page=1&name=b")["items"][0]["name"] == "b"


def test_pagination_errors_answer_as_rabbitmq_does(api, broker):
    for name in ("a", "b", "c"):
        broker.vhosts["/"].declare_queue(name, connection=None)
    beyond = api.request("GET", "/api/queues?page=3&page_size=2")
    assert (beyond.status, beyond.json()) == (400, {
        "error": "page_out_of_range", "reason": "Page out of range, page: 3 page size: 2, len: 3"})
    zero = api.request("GET", "/api/queues?page=0")
    assert (zero.status, zero.json()) == (400, {
        "error": "invalid_pagination_parameters",
        "reason": "Invalid pagination parameters: page number 0, page size undefined"})


def test_nodes_report_the_process(api):
    [node] = api.get("/api/nodes")
    assert (node["fd_used"], node["fd_total"], node["sockets_total"]) == (7, 1024, 921)
    # Limits are the resource alarms' own (tests/test_management_alarms.py has the rest).
    alarms = api.broker.alarms
    assert (node["mem_limit"], node["disk_free_limit"]) == (alarms.memory_limit, 50_000_000)
    assert node["running"] is True and node["name"] == api.broker.node_name
    assert api.get(f"/api/nodes/{node['name']}")["name"] == node["name"]


def test_health_checks_and_empty_lists(api):
    assert api.get("/api/health/checks/alarms") == {"status": "ok"}
    assert api.get("/api/health/checks/port-listener/5672")["status"] == "ok"
    missing = api.request("GET", "/api/health/checks/port-listener/1")
    assert (missing.status, missing.json()) == (503, {"status": "failed", "reason": "No active listener",
                                                     "missing": 1, "ports": [5672]})
    assert api.get("/api/aliveness-test/%2F") == {"status": "ok"}
    assert api.get("/api/policies") == [] and api.get("/api/parameters") == []


def test_the_other_health_checks_answer_in_rabbitmqs_shapes(api):
    assert api.get("/api/healthchecks/node") == {"status": "ok"}
    for name in ("amqp091", "amqp", "amqp0-9-1"):
        assert api.get(f"/api/health/checks/protocol-listener/{name}") == {"status": "ok", "protocol": "amqp"}
    mqtt = api.request("GET", "/api/health/checks/protocol-listener/mqtt")
    assert (mqtt.status, mqtt.json()) == (503, {"status": "failed", "reason": "No active listener",
                                                "missing": "mqtt", "protocols": ["amqp"]})
    assert api.get("/api/health/checks/node-is-quorum-critical") == {"status": "ok", "reason": "single node cluster"}
    assert api.get("/api/health/checks/certificate-expiration/1/months") == {"status": "ok"}
    invalid = api.request("GET", "/api/health/checks/certificate-expiration/x/months")
    assert (invalid.status, invalid.json()["reason"]) == (400, "Invalid expiration value.")


def test_unknown_paths_and_methods_answer_in_json(api):
    reply = api.request("GET", "/api/nothing-here")
    assert reply.status == 404 and reply.json()["error"] == "Object Not Found"
    assert api.request("PATCH", "/api/queues").status == 405


def test_connections_report_their_traffic_in_bytes_and_reads(api, broker):
    client = opened_client(broker)
    [before] = api.get("/api/connections")
    publish = client.publish_bytes(1, b"x" * 1000, routing_key="nowhere") + marshal(1, commands.Basic.Qos(prefetch_count=5))
    client.connection.receive_data(publish)
    sent = client.connection.take_output()  # the qos-ok
    assert sent
    [after] = api.get("/api/connections")
    assert after["recv_oct"] - before["recv_oct"] == len(publish)
    assert after["recv_cnt"] - before["recv_cnt"] == 1
    assert after["send_oct"] - before["send_oct"] == len(sent)
    assert after["recv_oct_details"] == {"rate": 0.0}  # no sampling round has run yet
    assert after["connected_at"] <= int(time.time() * 1000)
