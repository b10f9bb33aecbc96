"""Shovels between brokers served in the test's event loop: a queue moved into another (in-process
with "amqp://", and over TCP between two brokers), ack modes, src-delete-after, the forward and
timestamp headers and dest-publish-properties, a source exchange, refusals and reconnects
reported in the status, and the management API's /api/shovels and /api/parameters/shovel."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pamqp import commands
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from amqp_server.broker.broker import Broker
from amqp_server.config.auth import hash_password
from amqp_server.config.settings import ServerConfig, UserConfig
from amqp_server.peer_link import methods
from amqp_server.peer_link.client import LinkError, PeerConnection
from amqp_server.peer_link.uri import parse_uri
from amqp_server.runtime.local_links import LocalLinks
from amqp_server.runtime.server import AMQPServer
from amqp_server.shovel.definition import validate_shovel
from amqp_server.shovel.shovels import Shovels
from amqp_server.shovel.worker import ShovelState
from interop_tests.waiting import wait_until_async


class Node:
    def __init__(self, broker: Broker, server: AMQPServer, shovels: Shovels) -> None:
        self.broker = broker
        self.server = server
        self.shovels = shovels

    @property
    def uri(self) -> str:
        return f"amqp://app:secret@127.0.0.1:{self.server.port}"

    def depth(self, queue: str, vhost: str = "/") -> int:
        found = self.broker.vhosts[vhost].queues.get(queue)
        return -1 if found is None else found.message_count + found.unacked_count

    async def close(self) -> None:
        await self.shovels.close()
        await self.server.stop()


async def start_node() -> Node:
    config = ServerConfig()
    config.users = [*config.users, UserConfig("app", hash_password("secret"), ["administrator"])]
    broker = Broker(config)
    broker.access.set_permissions("app", "/", ".*", ".*", ".*")
    server = AMQPServer(broker, "127.0.0.1", 0)
    await server.start()
    links = LocalLinks(broker)
    links.serve_with(server.local_protocol)
    shovels = Shovels(broker, links.open, links.credentials)
    broker.parameters.register(shovels)
    shovels.start()
    return Node(broker, server, shovels)


class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, Any, bytes]] = []
        self.confirms = 0
        self.event = asyncio.Event()

    def delivered(self, channel, delivery_tag, redelivered, exchange, routing_key, raw_header, body) -> None:
        header = ContentHeader()
        header.unmarshal(raw_header)
        self.messages.append((routing_key, header.properties, body))
        self.event.set()

    def confirmed(self, channel, delivery_tag, multiple, ack) -> None:
        self.confirms = delivery_tag
        self.event.set()

    def cancelled(self, channel, consumer_tag) -> None:
        pass

    def write_paused(self, paused) -> None:
        pass

    def link_failed(self, error) -> None:
        pass


async def client(node: Node) -> tuple[PeerConnection, int, Collector]:
    collector = Collector()
    link = PeerConnection(parse_uri(node.uri), collector)
    await link.open()
    channel = await link.open_channel()
    await link.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
    return link, channel, collector


async def publish(node: Node, queue: str, count: int, headers: dict[str, Any] | None = None, exchange: str = "",
                  declare: bool = True) -> None:
    link, channel, collector = await client(node)
    if declare:  # (a name pamqp's grammar check refuses too: RabbitMQ takes any)
        await link.call(channel, methods.queue_declare(queue=queue, durable=True), commands.Queue.DeclareOk)
    for i in range(count):
        body = b"message %d" % i
        raw = ContentHeader(0, len(body), Basic.Properties(delivery_mode=2, headers=headers)).marshal()
        link.publish(channel, exchange, queue, raw, body)
    await wait_until_async(lambda: collector.confirms == count, "every publish confirmed")
    link.close()


def run(scenario: Callable[..., Awaitable[None]], nodes: int = 1) -> None:
    async def main() -> None:
        started = [await start_node() for _ in range(nodes)]
        try:
            await scenario(*started)
        finally:
            for node in started:
                await node.close()

    asyncio.run(main())


def set_shovel(node: Node, name: str, value: dict[str, Any], user: str | None = "app") -> None:
    node.broker.parameters.set("/", "shovel", name, value, user=user)


def test_a_queue_is_moved_into_another_of_the_same_broker_in_process() -> None:
    async def scenario(node: Node) -> None:
        await publish(node, "a", 500)
        set_shovel(node, "move", {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"})
        await wait_until_async(lambda: node.depth("b") == 500 and node.depth("a") == 0, "the queue moved")
        worker = node.shovels.worker("/", "move")
        assert worker is not None and worker.state is ShovelState.RUNNING
        await wait_until_async(lambda: worker.counters.acked == 500, "every message acked on the source")
        status = node.shovels.statuses()[0]
        assert {key: status[key] for key in ("name", "vhost", "type", "state", "src_uri", "dest_uri", "src_queue",
                                             "dest_queue", "src_protocol", "dest_protocol")} == {
            "name": "move", "vhost": "/", "type": "dynamic", "state": "running", "src_uri": "amqp://",
            "dest_uri": "amqp://", "src_queue": "a", "dest_queue": "b", "src_protocol": "amqp091",
            "dest_protocol": "amqp091"}
        assert status["reconnects"] == 0 and status["messages_forwarded"] == 500
        # The in-process connections are ordinary ones of the broker, named after the shovel.
        names = {connection.client_properties.get("connection_name") for connection in node.broker.connections}
        assert names == {"Shovel move"}
        node.broker.parameters.unset("/", "shovel", "move")
        await wait_until_async(lambda: not node.broker.connections, "the shovel's connections closed")
        assert node.shovels.statuses() == []

    run(scenario)


@pytest.mark.parametrize("ack_mode", ["on-confirm", "on-publish", "no-ack"])
def test_a_shovel_moves_messages_between_two_brokers_in_each_ack_mode(ack_mode: str) -> None:
    async def scenario(source: Node, destination: Node) -> None:
        await publish(source, "jobs", 300)
        set_shovel(destination, "pull", {"src-uri": source.uri, "src-queue": "jobs", "dest-uri": "amqp://",
                                         "dest-queue": "jobs-copy", "ack-mode": ack_mode, "src-prefetch-count": 50})
        await wait_until_async(lambda: destination.depth("jobs-copy") == 300 and source.depth("jobs") == 0,
                               "the queue moved")

    run(scenario, nodes=2)


def test_src_delete_after_queue_length_moves_what_was_there_and_deletes_the_shovel() -> None:
    async def scenario(node: Node) -> None:
        await publish(node, "old", 120)
        set_shovel(node, "once", {"src-uri": "amqp://", "src-queue": "old", "dest-uri": "amqp://",
                                  "dest-queue": "new", "src-delete-after": "queue-length", "src-prefetch-count": 7})
        await wait_until_async(lambda: node.broker.parameters.get("/", "shovel", "once") is None,
                               "node.broker.parameters.get('/', 'shovel', 'once') is None")
        assert node.depth("new") == 120 and node.depth("old") == 0
        assert node.shovels.statuses() == []

    run(scenario)


def test_src_delete_after_a_count_leaves_the_rest() -> None:
    async def scenario(node: Node) -> None:
        await publish(node, "many", 50)
        set_shovel(node, "some", {"src-uri": "amqp://", "src-queue": "many", "dest-uri": "amqp://",
                                  "dest-queue": "few", "src-delete-after": 20, "src-prefetch-count": 100})
        await wait_until_async(lambda: node.broker.parameters.get("/", "shovel", "some") is None,
                               "node.broker.parameters.get('/', 'shovel', 'some') is None")
        await wait_until_async(lambda: node.depth("many") == 30, "the rest back in the source")
        assert node.depth("few") == 20

    run(scenario)


def test_forward_and_timestamp_headers_and_publish_properties() -> None:
    async def scenario(node: Node) -> None:
        await publish(node, "in", 1, headers={"h": 1})
        set_shovel(node, "tag", {"src-uri": "amqp://", "src-queue": "in", "dest-uri": "amqp://", "dest-queue": "out",
                                 "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
                                 "dest-publish-properties": {"app_id": "shv", "priority": 3}})
        await wait_until_async(lambda: node.depth("out") == 1, "the message moved")
        link, channel, collector = await client(node)
        await link.call(channel, commands.Basic.Consume(queue="out", no_ack=True), commands.Basic.ConsumeOk)
        await wait_until_async(lambda: collector.messages, "the message delivered")
        _key, properties, body = collector.messages[0]
        assert body == b"message 0" and properties.app_id == "shv" and properties.priority == 3
        headers = properties.headers
        assert headers["h"] == 1 and isinstance(headers["x-shovelled-timestamp"], int)
        assert headers["x-shovelled"] == [{
            "shovelled-by": node.broker.cluster_name, "shovel-type": "dynamic", "shovel-name": "tag",
            "shovel-vhost": "/", "src-uri": "amqp://", "dest-uri": "amqp://", "src-queue": "in", "dest-queue": "out"}]
        link.close()

    run(scenario)


def test_a_source_exchange_gets_a_private_queue_bound_with_the_key() -> None:
    async def scenario(node: Node) -> None:
        set_shovel(node, "fan", {"src-uri": "amqp://", "src-exchange": "amq.topic", "src-exchange-key": "logs.#",
                                 "dest-uri": "amqp://", "dest-exchange": "amq.direct", "dest-exchange-key": "all"})
        link, channel, _collector = await client(node)
        await link.call(channel, commands.Queue.Declare(queue="all-logs"), commands.Queue.DeclareOk)
        await link.call(channel, commands.Queue.Bind(queue="all-logs", exchange="amq.direct", routing_key="all"),
                        commands.Queue.BindOk)
        link.close()
        await wait_until_async(lambda: (worker := node.shovels.worker("/", "fan")) is not None
                               and worker.state is ShovelState.RUNNING, "the shovel running")
        await publish(node, "logs.error", 3, exchange="amq.topic", declare=False)
        await publish(node, "metrics.cpu", 2, exchange="amq.topic", declare=False)
        await wait_until_async(lambda: node.depth("all-logs") == 3, "the matching messages moved")

    run(scenario)


def test_a_refused_login_terminates_with_the_error_and_an_unreachable_broker_reports_reconnects() -> None:
    async def scenario(node: Node) -> None:
        set_shovel(node, "badlogin", {"src-uri": f"amqp://app:wrong@127.0.0.1:{node.server.port}", "src-queue": "a",
                                      "dest-uri": "amqp://", "dest-queue": "b"})
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            dead = probe.getsockname()[1]
        set_shovel(node, "away", {"src-uri": f"amqp://app:secret@127.0.0.1:{dead}", "src-queue": "a",
                                  "dest-uri": "amqp://", "dest-queue": "b", "reconnect-delay": 0.05})
        bad = node.shovels.worker("/", "badlogin")
        away = node.shovels.worker("/", "away")
        await wait_until_async(lambda: bad.state is ShovelState.TERMINATED and away.reconnects.count >= 3,
                               "one terminated, the other reconnecting")
        status = {item["name"]: item for item in node.shovels.statuses()}
        assert status["badlogin"]["state"] == "terminated"
        assert "403 ACCESS_REFUSED" in status["badlogin"]["reason"]
        assert status["away"]["state"] == "starting" and status["away"]["reconnects"] >= 3
        assert f"127.0.0.1:{dead}" in status["away"]["last_error"]
        # A restart tries again (and fails again, the same way).
        await node.shovels.restart("/", "badlogin")
        assert bad.state is ShovelState.STARTING
        await wait_until_async(lambda: bad.state is ShovelState.TERMINATED, "terminated again")

    run(scenario)


def test_a_missing_source_exchange_terminates_with_the_404() -> None:
    async def scenario(node: Node) -> None:
        set_shovel(node, "noex", {"src-uri": "amqp://", "src-exchange": "nowhere", "dest-uri": "amqp://",
                                  "dest-queue": "b"})
        worker = node.shovels.worker("/", "noex")
        await wait_until_async(lambda: worker.state is ShovelState.TERMINATED, "the shovel terminated")
        assert "404 NOT_FOUND - no exchange 'nowhere' in vhost '/'" in worker.reason

    run(scenario)


def test_the_destination_refusing_a_message_puts_it_back_on_the_source() -> None:
    """A destination queue full with reject-publish nacks: the shovel nacks (requeues) those on
    the source, so nothing is lost, and counts them."""
    async def scenario(node: Node) -> None:
        link, channel, _c = await client(node)
        await link.call(channel, commands.Queue.Declare(queue="small", durable=True, arguments={
            "x-max-length": 5, "x-overflow": "reject-publish"}), commands.Queue.DeclareOk)
        link.close()
        await publish(node, "big", 8)
        set_shovel(node, "squeeze", {"src-uri": "amqp://", "src-queue": "big", "dest-uri": "amqp://",
                                     "dest-queue": "small", "reconnect-delay": 5})
        worker = node.shovels.worker("/", "squeeze")
        await wait_until_async(lambda: node.depth("small") == 5 and worker.counters.nacked >= 3,
                               "the destination full and refusals nacked")
        await wait_until_async(lambda: node.depth("big") == 3, "the refused messages back in the source")
        assert worker.counters.acked == 5

    run(scenario)


def test_validation_names_the_key_in_rabbitmqs_words() -> None:
    base = {"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://"}
    cases = [
        ({}, ["Must specify 'src-exchange' or 'src-queue'", 'Key "src-uri" not found in x',
              'Key "dest-uri" not found in x']),
        ({**base, "bogus": 1}, ['Unrecognised terms [{<<"bogus">>,1}] in x']),
        ({**base, "src-uri": "foo://x"}, ['"foo://x" not a valid URI: {{unexpected_uri_scheme,"foo"},"foo://x"}']),
        ({**base, "src-exchange": "x"}, ["Cannot specify 'src-exchange' and 'src-queue'"]),
        ({**base, "src-prefetch-count": "x"}, ['src-prefetch-count should be a number, actually was <<"x">>']),
        ({**base, "ack-mode": "bad"}, ['ack-mode should be one of [<<"no-ack">>,<<"on-publish">>,<<"on-confirm">>], '
                                       'actually was <<"bad">>']),
        ({**base, "src-uri": 5}, ["src-uri should be list, actually was 5"]),
        ({**base, "src-queue": 5}, ["src-queue should be binary, actually was 5"]),
        ({**base, "src-delete-after": "y"}, ['src-delete-after should be a number greater than or equal to 0, "never" '
                                             'or "queue-length", actually was <<"y">>']),
        ({**base, "dest-add-forward-headers": "z"}, ['dest-add-forward-headers should be boolean, actually was <<"z">>']),
        ({**base, "dest-publish-properties": {"bogus": 1}},
         ['Unrecognised terms [{<<"bogus">>,1}] in dest-publish-properties']),
        ({**base, "ack-mode": "no-ack", "src-delete-after": 5}, ["Cannot specify 'no-ack' and numerical 'delete-after'"]),
        ({**base, "prefetch-count": 5, "delete-after": 3, "add-forward-headers": True}, []),  # the names before 3.8
    ]
    for value, problems in cases:
        assert validate_shovel("/", "x", value) == problems, value


def test_the_management_api_sets_shows_restarts_and_deletes_shovels() -> None:
    async def scenario(node: Node) -> None:
        from aiohttp import test_utils

        from amqp_server.management.app import build_management_app

        app = build_management_app(node.broker, sample_rates=False)
        http = test_utils.TestClient(test_utils.TestServer(app))
        await http.start_server()
        auth = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=", "Content-Type": "application/json"}  # guest:guest

        async def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            async with http.request(method, path, data=json.dumps(body) if body is not None else None,
                                    headers=auth) as response:
                text = await response.text()
                return response.status, (json.loads(text) if text else None)

        value = {"src-uri": "amqp://", "src-queue": "q1", "dest-uri": "amqp://", "dest-queue": "q2"}
        assert (await call("PUT", "/api/parameters/shovel/%2F/s1", {"value": value}))[0] == 201
        status, body = await call("PUT", "/api/parameters/shovel/%2F/bad", {"value": {**value, "bogus": 1}})
        assert (status, body) == (400, {"error": "bad_request", "reason":
                                        'Validation failed\n\nUnrecognised terms [{&lt;&lt;"bogus"&gt;&gt;,1}] in bad\n'})
        status, body = await call("PUT", "/api/parameters/shovel/%2F/local", {"value": {**value, "src-uri": "amqp:///nosuch"}})
        assert body["reason"] == 'Validation failed\n\nuser "guest" may not connect to vhost "nosuch"\n'
        await wait_until_async(lambda: node.shovels.worker("/", "s1").state is ShovelState.RUNNING,
                               "node.shovels.worker('/', 's1').state is ShovelState.RUNNING")
        status, listed = await call("GET", "/api/shovels")
        assert status == 200 and [(s["name"], s["state"]) for s in listed] == [("s1", "running")]
        assert (await call("GET", "/api/shovels/%2F"))[1] == listed
        assert (await call("GET", "/api/shovels/nosuch"))[0] == 404
        assert [s["name"] for s in (await call("GET", "/api/shovels/vhost/%2F/s1"))[1]] == ["s1"]
        assert (await call("DELETE", "/api/shovels/vhost/%2F/s1/restart"))[0] == 204
        assert (await call("DELETE", "/api/shovels/vhost/%2F/nope/restart"))[0] == 404
        assert (await call("DELETE", "/api/shovels/vhost/%2F/s1"))[0] == 204
        assert (await call("GET", "/api/parameters/shovel"))[1] == []
        await http.close()

    run(scenario)


def test_prometheus_shows_each_shovels_figures_on_the_per_object_endpoint() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from amqp_server.metrics.core_collector import AGGREGATED, PER_OBJECT, CoreCollector
    from tests.test_metrics_values import FIXED_PROCESS

    async def scenario(node: Node) -> None:
        await publish(node, "m-in", 40)
        set_shovel(node, "metered", {"src-uri": "amqp://", "src-queue": "m-in", "dest-uri": "amqp://",
                                     "dest-queue": "m-out"})
        worker = node.shovels.worker("/", "metered")
        await wait_until_async(lambda: worker.counters.acked == 40, "every message acked on the source")

        def scrape(endpoint: str) -> str:
            registry = CollectorRegistry()
            registry.register(CoreCollector(node.broker, endpoint, lambda: FIXED_PROCESS))
            return generate_latest(registry).decode()

        per_object = scrape(PER_OBJECT)
        key = 'shovel="metered",type="dynamic",vhost="/"'
        assert f"amqp_server_shovel_messages_forwarded_total{{{key}}} 40.0" in per_object
        assert f"amqp_server_shovel_messages_acked_total{{{key}}} 40.0" in per_object
        assert f"amqp_server_shovel_state{{{key}}} 1.0" in per_object
        assert f"amqp_server_shovel_messages_unconfirmed{{{key}}} 0.0" in per_object
        assert 'amqp_server_shovels{state="running"} 1.0' in per_object
        assert "amqp_server_shovel" not in scrape(AGGREGATED)  # RabbitMQ's names alone there

    run(scenario)


def test_queue_names_outside_the_0_9_1_grammar_are_shovelled_as_rabbitmq_takes_them() -> None:
    # RabbitMQ takes any UTF-8 queue name; pamqp's own name check refuses a space or ">".
    async def scenario(node: Node) -> None:
        await publish(node, "orders in", 20)
        set_shovel(node, "spaced", {"src-uri": "amqp://", "src-queue": "orders in", "dest-uri": "amqp://",
                                    "dest-queue": "orders -> out", "dest-queue-args": {"x-max-length": 1000}})
        await wait_until_async(lambda: node.depth("orders -> out") == 20 and node.depth("orders in") == 0,
                               "the queue moved")
        worker = node.shovels.worker("/", "spaced")
        assert worker is not None and worker.state is ShovelState.RUNNING
        assert node.broker.vhosts["/"].queues["orders -> out"].arguments == {"x-max-length": 1000}

    run(scenario)
