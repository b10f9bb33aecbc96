"""Runtime parameters: the store and its components, the management API, the definition store,
definitions import and export, and AMQP URIs as links read them. RabbitMQ 3.10.8 with the shovel
plugin gave the texts asserted here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqp_server.broker.broker import Broker
from amqp_server.broker.runtime_parameters import ParameterError, RuntimeParameter, RuntimeParameters
from amqp_server.config.settings import ServerConfig
from amqp_server.management.definitions_import import import_definitions
from amqp_server.management.definitions_transfer import export_definitions
from amqp_server.peer_link.uri import InvalidUri, parse_uri, parse_uris
from persistence.definitions import FileDefinitionStore
from tests.test_management_client import ManagementClient, api, broker, broker_with_users  # noqa: F401


class Recorder:
    """A component that takes values with a "size" number and records what it hears."""

    component = "recorder"

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def validate(self, vhost: str, name: str, value: Any, user: str | None) -> list[str]:
        if not isinstance(value, dict) or not isinstance(value.get("size"), int):
            return [f"Key \"size\" not found in {name}"]
        return []

    def parameter_set(self, parameter: RuntimeParameter) -> None:
        self.heard.append(("set", (parameter.vhost, parameter.name, parameter.value)))

    def parameter_cleared(self, vhost: str, name: str) -> None:
        self.heard.append(("cleared", (vhost, name)))


def test_a_component_hears_its_parameters_set_changed_and_cleared() -> None:
    changes: list[tuple[str, dict[str, Any], bool]] = []
    parameters = RuntimeParameters(on_change=lambda kind, entry, present: changes.append((kind, entry, present)))
    parameters.set("/", "recorder", "early", {"size": 1}, validate=False)  # restored before it registers
    recorder = Recorder()
    parameters.register(recorder)
    assert recorder.heard == [("set", ("/", "early", {"size": 1}))]
    assert parameters.set("/", "recorder", "a", {"size": 2}) is True
    assert parameters.set("/", "recorder", "a", {"size": 2}) is False  # the same again: nobody told
    assert parameters.set("/", "recorder", "a", {"size": 3}) is False
    assert parameters.unset("/", "recorder", "a") is True and parameters.unset("/", "recorder", "a") is False
    assert recorder.heard[1:] == [("set", ("/", "a", {"size": 2})), ("set", ("/", "a", {"size": 3})),
                                  ("cleared", ("/", "a"))]
    assert [(entry["name"], present) for kind, entry, present in changes] == [
        ("early", True), ("a", True), ("a", True), ("a", False)]
    with pytest.raises(ParameterError) as refused:
        parameters.set("/", "recorder", "b", {"size": "big"})
    assert refused.value.problems == ['Key "size" not found in b']
    with pytest.raises(ParameterError) as unknown:
        parameters.set("/", "nocomp", "b", {})
    assert unknown.value.problems == ["component nocomp not found"]


@pytest.fixture
def recording(broker):  # noqa: F811
    recorder = Recorder()
    broker.parameters.register(recorder)
    return recorder


def test_the_api_sets_lists_shows_and_clears_parameters_as_rabbitmq(api, broker, recording):  # noqa: F811
    assert api.request("PUT", "/api/parameters/recorder/%2F/p1", {"value": {"size": 5}}).status == 201
    assert api.request("PUT", "/api/parameters/recorder/%2F/p1", {"value": {"size": 6}}).status == 204
    expected = {"value": {"size": 6}, "vhost": "/", "component": "recorder", "name": "p1"}
    assert api.get("/api/parameters") == [expected]
    assert api.get("/api/parameters/recorder") == [expected]
    assert api.get("/api/parameters/recorder/%2F") == [expected]
    assert api.get("/api/parameters/recorder/%2F/p1") == expected
    assert api.get("/api/parameters/nocomp") == [] and api.get("/api/parameters/nocomp/%2F") == []
    assert api.request("GET", "/api/parameters/recorder/%2F/nope").json() == {
        "error": "Object Not Found", "reason": "Not Found"}
    assert api.request("GET", "/api/parameters/recorder/novhost").status == 404
    assert api.request("DELETE", "/api/parameters/recorder/%2F/p1").status == 204
    assert api.request("DELETE", "/api/parameters/recorder/%2F/p1").status == 404
    assert recording.heard[-1] == ("cleared", ("/", "p1"))


def test_refusals_answer_with_rabbitmqs_codes_and_texts(api, broker, recording):  # noqa: F811
    cases = [
        ("/api/parameters/nocomp/%2F/x", {"value": {}}, 400,
         {"error": "bad_request", "reason": "Validation failed\n\ncomponent nocomp not found\n"}),
        ("/api/parameters/recorder/novhost/x", {"value": {}}, 404, {"error": "not_found", "reason": "vhost_not_found"}),
        ("/api/parameters/recorder/%2F/x", {"size": 1}, 400, {"error": "bad_request", "reason": "[{key_missing,value}]"}),
        ("/api/parameters/recorder/%2F/x", {"value": {"size": "<big>"}}, 400,
         {"error": "bad_request", "reason": 'Validation failed\n\nKey "size" not found in x\n'}),
    ]
    for path, body, status, reply in cases:
        answer = api.request("PUT", path, body)
        assert (answer.status, answer.json()) == (status, reply), path
    # A management user without policymaker or administrator may not.
    assert api.request("PUT", "/api/parameters/recorder/%2F/x", {"value": {"size": 1}}, user="mgmt",
                       password="mgmt").status == 401


def test_vhost_limits_and_operator_policies_are_listed_among_parameters(api, broker):  # noqa: F811
    assert api.request("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 100}).status == 204
    assert api.request("PUT", "/api/operator-policies/%2F/op", {
        "pattern": "^x", "definition": {"max-length": 5}, "apply-to": "queues"}).status == 201
    assert api.get("/api/parameters") == [
        {"value": {"pattern": "^x", "apply-to": "queues", "definition": {"max-length": 5}, "priority": 0},
         "vhost": "/", "component": "operator_policy", "name": "op"},
        {"value": {"max-queues": 100}, "vhost": "/", "component": "vhost-limits", "name": "limits"},
    ]
    assert api.request("PUT", "/api/parameters/vhost-limits/%2F/limits", {"value": {"max-connections": 5}}).status == 204
    assert api.get("/api/vhost-limits") == [{"vhost": "/", "value": {"max-connections": 5}}]
    assert api.request("DELETE", "/api/parameters/operator_policy/%2F/op").status == 204
    assert api.get("/api/operator-policies") == []


def test_parameters_are_durable_and_go_with_their_vhost(tmp_path: Path) -> None:
    broker = Broker(store=FileDefinitionStore(tmp_path))
    broker.add_vhost("other")
    broker.parameters.set("other", "recorder", "p", {"size": 1, "text": "é"}, validate=False)
    broker.parameters.set("/", "recorder", "q", [{"upstream": "a"}], validate=False)  # any JSON value
    broker.store.close()
    again = Broker(store=FileDefinitionStore(tmp_path))
    recorder = Recorder()
    again.parameters.register(recorder)
    assert sorted(recorder.heard) == [("set", ("/", "q", [{"upstream": "a"}])),
                                      ("set", ("other", "p", {"size": 1, "text": "é"}))]
    again.delete_vhost("other")
    assert recorder.heard[-1] == ("cleared", ("other", "p"))
    again.store.close()
    third = Broker(store=FileDefinitionStore(tmp_path))
    assert [p.name for p in third.parameters.matching()] == ["q"]
    third.store.close()


def test_definitions_export_and_import_carry_the_parameters_of_known_components(broker, recording):  # noqa: F811
    broker.parameters.set("/", "recorder", "p", {"size": 1})
    exported = export_definitions(broker)
    assert {"value": {"size": 1}, "vhost": "/", "component": "recorder", "name": "p"} in exported["parameters"]
    fresh = Broker(ServerConfig())
    fresh.parameters.register(Recorder())
    document = {"parameters": [
        *exported["parameters"],
        {"value": {"uri": "amqp://x"}, "vhost": "/", "component": "federation-upstream", "name": "up"},
    ]}
    not_applied = import_definitions(fresh, document)
    assert fresh.parameters.get("/", "recorder", "p") == RuntimeParameter("/", "recorder", "p", {"size": 1})
    assert not_applied == ["parameter 'up' of component 'federation-upstream' in vhost '/': "
                           "this broker has no such component"]
    bad = {"parameters": [{"value": {"size": "x"}, "vhost": "/", "component": "recorder", "name": "bad"}]}
    assert import_definitions(fresh, bad) == [
        "parameter 'bad' of component 'recorder' in vhost '/': Key \"size\" not found in bad"]
    assert fresh.parameters.get("/", "recorder", "bad") is None


@pytest.mark.parametrize("uri, host, port, vhost, user, password, tls", [
    ("amqp://", "", 5672, "/", "guest", "guest", False),
    ("amqp:///other", "", 5672, "other", "guest", "guest", False),
    ("amqp://u:p%40ss@h", "h", 5672, "/", "u", "p@ss", False),
    ("amqp://h:5673/", "h", 5673, "", "guest", "guest", False),
    ("amqps://h/%2F", "h", 5671, "/", "guest", "guest", True),
    ("amqp://[::1]:5680/v", "::1", 5680, "v", "guest", "guest", False),
])
def test_uris_are_read_as_rabbitmq_reads_them(uri, host, port, vhost, user, password, tls) -> None:
    address = parse_uri(uri)
    assert (address.host, address.port, address.vhost, address.username, address.password, address.tls) == (
        host, port, vhost, user, password, tls)


def test_uri_options_and_refusals() -> None:
    address = parse_uri("amqps://u:secret@h:1/v?heartbeat=5&connection_timeout=2000&verify=verify_none"
                        "&server_name_indication=disable&unknown=1")
    assert (address.heartbeat, address.connection_timeout_ms, address.verify) == (5, 2000, "verify_none")
    assert address.tls_server_name() is None
    assert address.redacted == "amqps://h:1/v" and "secret" not in address.redacted
    assert parse_uri("amqp://").redacted == "amqp://"
    with pytest.raises(InvalidUri) as scheme:
        parse_uri("foo://x")
    assert str(scheme.value) == '"foo://x" not a valid URI: {{unexpected_uri_scheme,"foo"},"foo://x"}'
    for bad in ("amqp://h:70000", "amqp://h/a/b", "amqp://:5672", "amqp://h:notaport", "amqp://h?heartbeat=x",
                "nothing"):
        with pytest.raises(InvalidUri):
            parse_uri(bad)
    assert [a.host for a in parse_uris(["amqp://a", "amqp://b"])] == ["a", "b"]
    with pytest.raises(TypeError):
        parse_uris([])


def test_a_parameter_set_on_one_node_of_a_cluster_is_set_and_cleared_on_the_other() -> None:
    import asyncio

    from tests.test_cluster_definitions import _node, _settled
    from tests.memory_coordinator import MemoryService

    async def main() -> None:
        service = MemoryService()
        a, shared_a = await _node(service, "a")
        b, shared_b = await _node(service, "b")
        recorder = Recorder()
        b.parameters.register(recorder)
        try:
            a.parameters.set("/", "recorder", "p", {"size": 1}, validate=False)
            await _settled(shared_a, shared_b)
            assert b.parameters.get("/", "recorder", "p") == RuntimeParameter("/", "recorder", "p", {"size": 1})
            a.parameters.unset("/", "recorder", "p")
            await _settled(shared_a, shared_b)
            assert b.parameters.get("/", "recorder", "p") is None
            assert recorder.heard == [("set", ("/", "p", {"size": 1})), ("cleared", ("/", "p"))]
        finally:
            await shared_a.stop()
            await shared_b.stop()

    asyncio.run(main())
