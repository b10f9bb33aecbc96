"""Policies, operator policies and limits through the management API, the definition store and
definitions import/export."""

from __future__ import annotations

from pathlib import Path

from amqp_server.broker.broker import Broker
from amqp_server.config.settings import ServerConfig
from persistence.definitions import FileDefinitionStore, MemoryDefinitionStore
from tests.test_management_client import ManagementClient, api, broker, broker_with_users  # noqa: F401

TTL_POLICY = {"pattern": "^jobs", "definition": {"message-ttl": 60000, "max-length": 10}, "priority": 1,
              "apply-to": "queues"}


def test_a_policy_is_set_listed_shown_and_cleared(api, broker):
    assert api.request("PUT", "/api/policies/%2F/ttl", TTL_POLICY).status == 201
    assert api.request("PUT", "/api/policies/%2F/ttl", TTL_POLICY).status == 204
    expected = {"vhost": "/", "name": "ttl", **TTL_POLICY}
    assert api.get("/api/policies") == [expected]
    assert api.get("/api/policies/%2F") == [expected]
    assert api.get("/api/policies/%2F/ttl") == expected
    assert api.get("/api/policies/other") == []
    assert api.request("DELETE", "/api/policies/%2F/ttl").status == 204
    assert api.request("DELETE", "/api/policies/%2F/ttl").status == 404
    assert api.request("GET", "/api/policies/%2F/ttl").status == 404


def test_a_refused_policy_answers_validation_failed(api):
    reply = api.request("PUT", "/api/policies/%2F/bad", {"pattern": ".*", "definition": {"max-priority": 5}})
    assert reply.status == 400
    # RabbitMQ 3.10 escapes < and > in a refused policy's reason.
    assert reply.json() == {"error": "bad_request", "reason":
                            'Validation failed\n\n[{&lt;&lt;"max-priority"&gt;&gt;,5}] are not recognised policy settings\n'}
    missing = api.request("PUT", "/api/policies/%2F/bad", {"definition": {"max-length": 5}})
    assert missing.json() == {"error": "bad_request", "reason": "[{key_missing,pattern}]"}


def test_queues_and_exchanges_show_the_policies_in_force(api, broker):
    vhost = broker.vhosts["/"]
    vhost.declare_queue("jobs-1", connection=None, arguments={"x-max-length": 4})
    vhost.declare_exchange("events", "topic")
    api.request("PUT", "/api/policies/%2F/ttl", TTL_POLICY)
    api.request("PUT", "/api/operator-policies/%2F/cap", {"pattern": ".*", "definition": {"max-length": 5},
                                                          "apply-to": "queues"})
    api.request("PUT", "/api/policies/%2F/ae", {"pattern": "^events$", "definition": {"alternate-exchange": "ae"},
                                                "apply-to": "exchanges"})
    queue = api.get("/api/queues/%2F/jobs-1")
    assert (queue["policy"], queue["operator_policy"]) == ("ttl", "cap")
    assert queue["effective_policy_definition"] == {"message-ttl": 60000, "max-length": 5}
    assert broker.vhosts["/"].queues["jobs-1"].settings.max_length == 4  # its own argument is lower
    exchange = api.get("/api/exchanges/%2F/events")
    assert (exchange["policy"], exchange["effective_policy_definition"]) == ("ae", {"alternate-exchange": "ae"})


def test_operator_policies_need_an_administrator_and_take_only_limits(api):
    body = {"pattern": ".*", "definition": {"max-length": 5}}
    assert api.request("PUT", "/api/operator-policies/%2F/cap", body, user="mgmt", password="mgmt").status == 401
    refused = api.request("PUT", "/api/operator-policies/%2F/cap", {"pattern": ".*", "definition": {"overflow": "x"}})
    assert refused.status == 400
    assert api.request("PUT", "/api/operator-policies/%2F/cap", body).status == 201
    assert api.get("/api/operator-policies")[0]["definition"] == {"max-length": 5}


def test_vhost_and_user_limits_are_set_listed_and_lifted(api, broker):
    assert api.request("PUT", "/api/vhost-limits/%2F/max-connections", {"value": 2}).status == 204
    assert api.request("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 10}).status == 204
    assert api.get("/api/vhost-limits") == [{"vhost": "/", "value": {"max-connections": 2, "max-queues": 10}}]
    assert api.request("DELETE", "/api/vhost-limits/%2F/max-queues").status == 204
    assert api.get("/api/vhost-limits/%2F") == [{"vhost": "/", "value": {"max-connections": 2}}]
    bad = api.request("PUT", "/api/vhost-limits/%2F/max-widgets", {"value": 1})
    assert bad.status == 400 and "Unrecognised terms" in bad.json()["reason"]
    assert api.request("PUT", "/api/user-limits/mgmt/max-channels", {"value": 3}).status == 204
    assert api.get("/api/user-limits") == [{"user": "mgmt", "value": {"max-channels": 3}}]
    assert api.get("/api/user-limits/mgmt") == [{"user": "mgmt", "value": {"max-channels": 3}}]
    assert api.request("PUT", "/api/user-limits/nobody/max-channels", {"value": 3}).status == 404
    assert api.request("DELETE", "/api/user-limits/mgmt/max-channels").status == 204
    assert api.get("/api/user-limits") == []


def test_policies_and_limits_survive_a_restart_from_the_store(tmp_path: Path):
    store = FileDefinitionStore(tmp_path)
    broker = Broker(ServerConfig(), store=store)
    client = ManagementClient(broker)
    try:
        client.request("PUT", "/api/policies/%2F/ttl", TTL_POLICY)
        client.request("PUT", "/api/operator-policies/%2F/cap", {"pattern": ".*", "definition": {"expires": 9000},
                                                                "priority": 2.5})
        client.request("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 3})
        client.request("PUT", "/api/user-limits/guest/max-connections", {"value": 4})
    finally:
        client.close()
    store.close()
    again = Broker(ServerConfig(), store=FileDefinitionStore(tmp_path))
    vhost = again.vhosts["/"]
    assert vhost.policies.get("ttl").definition == TTL_POLICY["definition"]
    assert (vhost.operator_policies.get("cap").definition, vhost.operator_policies.get("cap").priority) == (
        {"expires": 9000}, 2.5)
    assert vhost.limits.as_value() == {"max-queues": 3}
    assert again.user_limits() == {"guest": {"max-connections": 4}}
    queue, _ = vhost.declare_queue("jobs-x", connection=None)
    assert (queue.settings.max_length, queue.settings.expires_ms) == (10, 9000)


def test_deleting_a_vhost_removes_its_policies_from_the_store():
    store = MemoryDefinitionStore()
    broker = Broker(ServerConfig(), store=store)
    vhost = broker.add_vhost("tenant")
    from amqp_server.broker.policies import parse_policy

    vhost.set_policy(parse_policy("tenant", "p", {"pattern": ".*", "definition": {"max-length": 1}}))
    vhost.set_limits({"max-queues": 1})
    assert [p["name"] for p in store.load()["policies"]] == ["p"]
    broker.delete_vhost("tenant")
    assert store.load()["policies"] == [] and store.load()["vhost_limits"] == []


RABBITMQ_EXPORT = {
    "rabbit_version": "3.10.8",
    "users": [{"name": "app", "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
               "tags": [], "limits": {"max-connections": 5}}],
    "vhosts": [{"name": "tenant", "limits": [], "metadata": {"description": "", "tags": []}}],
    "permissions": [{"user": "app", "vhost": "tenant", "configure": ".*", "write": ".*", "read": ".*"}],
    "topic_permissions": [{"user": "app", "vhost": "tenant", "exchange": "amq.topic", "write": ".*", "read": ".*"}],
    "parameters": [
        {"value": {"max-queues": 20}, "vhost": "tenant", "component": "vhost-limits", "name": "limits"},
        {"value": {"pattern": ".*", "definition": {"max-length": 100}, "priority": 0, "apply-to": "queues"},
         "vhost": "tenant", "component": "operator_policy", "name": "cap"},
        {"value": {"uri": "amqp://elsewhere"}, "vhost": "tenant", "component": "federation-upstream", "name": "up"},
    ],
    "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}],
    "policies": [
        {"vhost": "tenant", "name": "ttl", "pattern": "^work", "apply-to": "queues",
         "definition": {"message-ttl": 5000}, "priority": 0},
        {"vhost": "tenant", "name": "ha", "pattern": ".*", "apply-to": "all", "definition": {"ha-mode": "all"},
         "priority": 0},
    ],
    "queues": [
        {"name": "work", "vhost": "tenant", "durable": True, "auto_delete": False, "arguments": {}},
        {"name": "log", "vhost": "tenant", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-type": "stream"}},
    ],
    "exchanges": [
        {"name": "hash", "vhost": "tenant", "type": "x-consistent-hash", "durable": True, "auto_delete": False,
         "internal": False, "arguments": {}},
        {"name": "in", "vhost": "tenant", "type": "direct", "durable": True, "auto_delete": False,
         "internal": False, "arguments": {}},
    ],
    "bindings": [
        {"source": "in", "vhost": "tenant", "destination": "work", "destination_type": "queue", "routing_key": "w",
         "arguments": {}},
        {"source": "in", "vhost": "tenant", "destination": "log", "destination_type": "queue", "routing_key": "l",
         "arguments": {}},
        {"source": "hash", "vhost": "tenant", "destination": "work", "destination_type": "queue",
         "routing_key": "1", "arguments": {}},
    ],
}


def test_an_import_applies_what_it_can_and_names_the_rest(api, broker):
    reply = api.request("POST", "/api/definitions", RABBITMQ_EXPORT)
    assert reply.status == 200, reply
    assert reply.json()["not_applied"] == [
        "topic permissions of user 'app' in vhost 'tenant': topic permissions are not supported",
        "policy 'ha' in vhost 'tenant': [{<<\"ha-mode\">>,<<\"all\">>}] are not recognised policy settings",
        "parameter 'up' of component 'federation-upstream' in vhost 'tenant': this broker has no such component",
        "exchange 'hash' in vhost 'tenant': exchange type 'x-consistent-hash' is not supported",
        "queue 'log' in vhost 'tenant': stream queues are not supported",
        "binding of queue 'log' to exchange 'in' in vhost 'tenant': queue 'log' is not applied",
        "binding of queue 'work' to exchange 'hash' in vhost 'tenant': exchange 'hash' is not applied",
    ]
    tenant = broker.vhosts["tenant"]
    assert tenant.queues["work"].settings.message_ttl_ms == 5000
    assert tenant.queues["work"].settings.max_length == 100
    assert tenant.limits.as_value() == {"max-queues": 20}
    assert broker.user_limits() == {"app": {"max-connections": 5}}
    assert "log" not in tenant.queues and "hash" not in tenant.exchanges
    before = broker.definitions()
    assert api.request("POST", "/api/definitions", RABBITMQ_EXPORT).status == 200
    assert broker.definitions() == before, "importing the same file twice changes nothing"


def test_a_refused_import_changes_nothing(api, broker):
    document = {**RABBITMQ_EXPORT, "queues": [*RABBITMQ_EXPORT["queues"],
                {"name": "bad", "vhost": "tenant", "durable": True, "arguments": {"x-max-length": -1}}]}
    reply = api.request("POST", "/api/definitions", document)
    assert reply.status == 400
    assert reply.json()["reason"] == "invalid arg 'x-max-length' for queue 'bad' in vhost 'tenant': {value_negative,-1}"
    assert "tenant" not in broker.vhosts and broker.access.user("app") is None


def test_the_export_carries_policies_operator_policies_and_limits(api, broker):
    api.request("POST", "/api/definitions", RABBITMQ_EXPORT)
    exported = api.get("/api/definitions")
    assert [p["name"] for p in exported["policies"]] == ["ttl"]
    assert sorted(p["component"] for p in exported["parameters"]) == ["operator_policy", "vhost-limits"]
    [app] = [user for user in exported["users"] if user["name"] == "app"]
    assert app["limits"] == {"max-connections": 5}
    fresh = broker_with_users()
    client = ManagementClient(fresh)
    try:
        assert client.request("POST", "/api/definitions", exported).status == 204
    finally:
        client.close()
    assert fresh.definitions()["policies"] == broker.definitions()["policies"]
    assert fresh.vhosts["tenant"].operator_policies.get("cap").definition == {"max-length": 100}


def test_a_vhost_import_brings_its_policies_operator_policies_and_limits(api, broker):
    document = {
        "policies": [{"name": "ttl", "pattern": "^w", "apply-to": "queues", "definition": {"message-ttl": 10},
                      "priority": 0}],
        "parameters": [{"value": {"max-queues": 5}, "component": "vhost-limits", "name": "limits"},
                       {"value": {"pattern": ".*", "definition": [["max-length", 7]], "priority": 0,
                                  "apply-to": "all"}, "component": "operator_policy", "name": "cap"}],
        "queues": [{"name": "work", "durable": True, "auto_delete": False, "arguments": {}}],
    }
    assert api.request("POST", "/api/definitions/other", document).status == 204
    other = broker.vhosts["other"]
    assert (other.queues["work"].settings.message_ttl_ms, other.queues["work"].settings.max_length) == (10, 7)
    assert other.limits.as_value() == {"max-queues": 5}
    exported = api.get("/api/definitions/other")
    assert [p["name"] for p in exported["policies"]] == ["ttl"] and "vhost" not in exported["policies"][0]
