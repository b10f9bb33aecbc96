"""The federation component: which links run as upstreams, sets, policies, exchanges, queues and
bindings change (the links themselves replaced by recorders: no network here), its parameter
components' checks through /api/parameters, and /api/federation-links."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

import pytest

from amqp_server.broker.broker import Broker
from amqp_server.broker.policies import parse_policy
from amqp_server.federation import federation as federation_module
from amqp_server.federation.federation import Federation, federation_of
from amqp_server.federation.status import EXCHANGE, QUEUE, LinkKey, LinkStatus
from amqp_server.federation.upstreams import Upstream
from tests.test_management_client import ManagementClient, broker_with_users


class RecordedLink:
    """Stands in for ExchangeLink and QueueLink: records what the component asks of it."""

    made: list["RecordedLink"] = []

    def __init__(self, host: Any, vhost: str, name: str, upstream: Upstream, policy: str | None) -> None:
        self.kind = EXCHANGE if self.__class__.__name__ == "Exchange" else QUEUE
        self.vhost, self.name, self.upstream, self.policy = vhost, name, upstream, policy
        upstream_name = upstream.exchange if self.kind == EXCHANGE else upstream.queue
        self.status = LinkStatus(LinkKey(vhost, self.kind, name, upstream.name, upstream_name), upstream.uris[0])
        self.started = False
        self.stopped: bool | None = None  # the cleanup it was stopped with
        self.bindings: list[tuple[bool, Hashable, str, dict[str, Any]]] = []
        self.unconfirmed_count = 0
        RecordedLink.made.append(self)

    def start(self) -> None:
        self.started = True

    async def stop(self, cleanup: bool) -> None:
        self.stopped = cleanup

    def binding_changed(self, added: bool, destination: Hashable, routing_key: str, arguments: dict[str, Any]) -> None:
        self.bindings.append((added, destination, routing_key, arguments))


class Exchange(RecordedLink):
    pass


class Queue(RecordedLink):
    pass


@pytest.fixture
def running(monkeypatch):
    monkeypatch.setattr(federation_module, "ExchangeLink", Exchange)
    monkeypatch.setattr(federation_module, "QueueLink", Queue)
    RecordedLink.made = []
    loop = asyncio.new_event_loop()
    broker = Broker()
    federation = Federation(broker, None, None)

    def settle() -> None:
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))

    async def start() -> None:
        federation.start()

    loop.run_until_complete(start())
    yield broker, federation, loop, settle
    loop.run_until_complete(federation.stop())
    loop.close()


def live(federation: Federation) -> list[tuple[str, str, str]]:
    return sorted((link.status.key.kind, link.status.key.name, link.status.key.upstream) for link in federation.links)


def in_loop(loop, call, *args, **options):
    """`call(*args, **options)` on the component's event loop (the links it starts need one)."""
    async def run() -> Any:
        return call(*args, **options)
    return loop.run_until_complete(run())


def test_a_policy_federates_what_it_matches_from_each_upstream_of_its_set(running):
    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a"})
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "b", {"uri": "amqp://b", "exchange": "up.x"})
    in_loop(loop, vhost.declare_exchange, "fed.x", "topic")
    in_loop(loop, vhost.declare_exchange, "other", "topic")
    assert live(federation) == [], "no federation policy yet"
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": "^fed", "definition": {
        "federation-upstream-set": "all"}}))
    assert live(federation) == [("exchange", "fed.x", "a"), ("exchange", "fed.x", "b")]
    assert all(link.started for link in RecordedLink.made)
    [to_b] = [link for link in RecordedLink.made if link.upstream.name == "b"]
    assert to_b.upstream.exchange == "up.x" and to_b.policy == "p"


def test_a_queue_declared_under_a_policy_gets_its_link_and_loses_it_when_deleted(running):
    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a"})
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": "^fed", "apply-to": "queues",
                                                            "definition": {"federation-upstream": "a"}}))

    async def declare() -> Any:
        return vhost.declare_queue("fed.q", connection=None)

    queue, _created = loop.run_until_complete(declare())
    assert live(federation) == [("queue", "fed.q", "a")]
    [link] = RecordedLink.made
    in_loop(loop, vhost.delete_queue, queue)
    settle()
    assert live(federation) == [] and link.stopped is True, "stopped for good: its upstream is cleaned up"


def test_changing_an_upstream_restarts_its_links_and_removing_it_stops_them(running):
    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a"})
    in_loop(loop, vhost.declare_exchange, "fed.x", "direct")
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": "^fed", "definition": {
        "federation-upstream": "a"}}))
    [first] = RecordedLink.made
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a", "prefetch-count": 5})
    settle()
    assert first.stopped is False, "a restart keeps what it made upstream"
    [second] = [link for link in RecordedLink.made if link is not first]
    assert second.started and second.upstream.prefetch_count == 5
    in_loop(loop, broker.parameters.unset, "/", "federation-upstream", "a")
    settle()
    assert live(federation) == [] and second.stopped is True


def test_bindings_of_a_federated_exchange_reach_its_links(running):
    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a"})
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": "^fed", "definition": {
        "federation-upstream": "a"}}))
    exchange = in_loop(loop, vhost.declare_exchange, "fed.x", "direct")
    plain = in_loop(loop, vhost.declare_exchange, "plain", "direct")

    async def declare() -> Any:
        return vhost.declare_queue("q", connection=None)[0]

    queue = loop.run_until_complete(declare())
    in_loop(loop, vhost.bind, exchange, queue, "k", {})
    in_loop(loop, vhost.bind, plain, queue, "k", {})
    in_loop(loop, vhost.delete_queue, queue)  # its bindings go with it
    [link] = RecordedLink.made
    assert link.bindings == [(True, queue, "k", {}), (False, queue, "k", {})]


def test_federations_own_resources_and_the_default_exchange_are_never_federated(running):
    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a"})
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": ".*", "definition": {
        "federation-upstream": "a"}}))
    before = live(federation)
    in_loop(loop, vhost.declare_exchange, "federation: x -> here B", "x-federation-upstream",
            arguments={"x-max-hops": 1, "x-internal-purpose": "federation"})

    async def declare() -> Any:
        return vhost.declare_queue("federation: x -> here", connection=None, durable=True,
                                   arguments={"x-internal-purpose": "federation"})

    loop.run_until_complete(declare())
    assert live(federation) == before
    assert ("exchange", "", "a") not in before and ("exchange", "amq.topic", "a") in before


def test_the_links_are_listed_with_their_status(running):
    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://user:secret@host/v"})
    in_loop(loop, vhost.declare_exchange, "fed.x", "direct")
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": "^fed", "definition": {
        "federation-upstream": "a"}}))
    assert federation_of(broker) is federation
    [item] = federation.link_list()
    assert (item["exchange"], item["upstream"], item["status"], item["node"]) == ("fed.x", "a", "starting",
                                                                                 broker.node_name)
    assert federation.link_list("other") == []


def test_the_api_checks_federation_parameters_with_rabbitmqs_texts():
    broker = broker_with_users()
    federation = Federation(broker, None, None)
    federation.register_components()
    api = ManagementClient(broker)
    try:
        reply = api.request("PUT", "/api/parameters/federation-upstream/%2F/u1", {"value": {"uri": "amqp://x",
                                                                                            "bogus": 1}})
        assert (reply.status, reply.json()["reason"]) == (
            400, 'Validation failed\n\nUnrecognised terms [{&lt;&lt;"bogus"&gt;&gt;,1}] in u1\n')
        reply = api.request("PUT", "/api/parameters/federation-upstream-set/%2F/s1", {"value": [{"max-hops": 1}]})
        assert (reply.status, reply.json()["reason"]) == (400, 'Validation failed\n\nKey "upstream" not found in s1\n')
        assert api.request("PUT", "/api/parameters/federation-upstream/%2F/u1", {"value": {"uri": "amqp://x"}}).status \
            == 201
        assert api.get("/api/parameters/federation-upstream") == [
            {"value": {"uri": "amqp://x"}, "vhost": "/", "component": "federation-upstream", "name": "u1"}]
        assert api.get("/api/federation-links") == []
        denied = api.request("GET", "/api/federation-links", user="mgmt", password="mgmt")
        assert (denied.status, denied.json()["reason"]) == (401, "Not monitor user")
        assert api.request("GET", "/api/federation-links/novhost").status == 404
    finally:
        api.close()


def test_prometheus_counts_links_by_state_and_shows_each_links_figures(running):
    from amqp_server.metrics.federation_figures import federation_families

    broker, federation, loop, settle = running
    vhost = broker.vhosts["/"]
    in_loop(loop, broker.parameters.set, "/", "federation-upstream", "a", {"uri": "amqp://a"})
    in_loop(loop, vhost.declare_exchange, "fed.x", "direct")
    in_loop(loop, vhost.set_policy, parse_policy("/", "p", {"pattern": "^fed", "definition": {
        "federation-upstream": "a"}}))
    [link] = federation.links
    link.status.connected("c")
    link.status.count_received(redelivered=True)
    families = {family.name: family for family in federation_families(broker, per_object=True)}
    by_state = {sample.labels["state"]: sample.value for sample in families["amqp_server_federation_links"].samples}
    assert by_state == {"starting": 0, "running": 1, "error": 0}
    [received] = families["amqp_server_federation_messages_received"].samples
    assert received.labels == {"vhost": "/", "type": "exchange", "name": "fed.x", "upstream": "a"}
    assert received.value == 1
    [redelivered] = families["amqp_server_federation_messages_redelivered"].samples
    assert redelivered.value == 1
    assert [s.value for s in families["amqp_server_federation_state"].samples] == [1]
    assert list(federation_families(broker, per_object=False)) == [], "the aggregated endpoint: RabbitMQ's names only"


def test_upstreams_sets_and_federation_policies_go_through_a_definitions_export_and_import():
    """(A refused upstream is not applied and named, as definitions_import.py does with any
    parameter its component refuses.)"""
    broker = broker_with_users()
    Federation(broker, None, None).register_components()
    api = ManagementClient(broker)
    document = {
        "vhosts": [{"name": "/"}],
        "parameters": [
            {"value": {"uri": "amqp://site-a", "max-hops": 2}, "vhost": "/", "component": "federation-upstream",
             "name": "site-a"},
            {"value": [{"upstream": "site-a"}], "vhost": "/", "component": "federation-upstream-set", "name": "sites"},
        ],
        "policies": [{"vhost": "/", "name": "fed", "pattern": "^orders$", "apply-to": "exchanges",
                      "definition": {"federation-upstream-set": "sites"}, "priority": 0}],
    }
    try:
        reply = api.request("POST", "/api/definitions", document)
        assert reply.status in (200, 204), reply
        assert "not_applied" not in (reply.json() if reply.text else {})
        exported = api.get("/api/definitions")
        federation_parameters = sorted((p["component"], p["name"]) for p in exported["parameters"]
                                       if p["component"].startswith("federation"))
        assert federation_parameters == [("federation-upstream", "site-a"), ("federation-upstream-set", "sites")]
        assert [p["definition"] for p in exported["policies"] if p["name"] == "fed"] == [
            {"federation-upstream-set": "sites"}]
        refused = api.request("POST", "/api/definitions", {"parameters": [
            {"value": {"uri": "nope://x"}, "vhost": "/", "component": "federation-upstream", "name": "bad"}]})
        assert refused.json()["not_applied"] == [
            "parameter 'bad' of component 'federation-upstream' in vhost '/': "
            '"nope://x" not a valid URI: {{unexpected_uri_scheme,"nope"},"nope://x"}']
        assert broker.parameters.get("/", "federation-upstream", "bad") is None
    finally:
        api.close()


def test_an_upstream_on_this_broker_needs_access_to_its_vhost():
    """A URI without a host is this broker itself (in-process, as a user that may enter every
    vhost): only a user allowed into that vhost may name it."""
    broker = broker_with_users()
    broker.add_vhost("secret")
    Federation(broker, None, None).register_components()
    api = ManagementClient(broker)
    try:
        reply = api.request("PUT", "/api/parameters/federation-upstream/%2F/local", {"value": {"uri": "amqp:///secret"}})
        assert (reply.status, reply.json()["reason"]) == (
            400, 'Validation failed\n\nuser "guest" may not connect to vhost "secret"\n')
        broker.access.set_permissions("guest", "secret", ".*", ".*", ".*")
        assert api.request("PUT", "/api/parameters/federation-upstream/%2F/local",
                           {"value": {"uri": "amqp:///secret"}}).status == 201
    finally:
        api.close()
