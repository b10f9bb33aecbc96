"""Shared definitions between two brokers on an in-memory coordination service (the same
interface etcd and ZooKeeper implement; interop_tests/test_cluster_definitions.py runs the real
ones): declare-ok waits for the commit, the other node applies the change, a lost declare race
turns the declare-ok into RabbitMQ's 406, an unreachable service refuses new declarations, and a
refused declaration whose write was committed after all is deleted again."""

from __future__ import annotations

import asyncio

from pamqp import commands

from amqp_server.broker.broker import Broker
from cluster.definitions.shared import SharedDefinitions
from amqp_server.config.settings import ClusterConfig, ServerConfig
from cluster.coordinator import CoordinationUnavailable
from tests.frame_driver import methods, opened_client
from tests.memory_coordinator import MemoryCoordinator, MemoryService


async def _node(service: MemoryService, name: str) -> tuple[Broker, SharedDefinitions]:
    broker = Broker(ServerConfig(cluster=ClusterConfig(url="etcd://127.0.0.1:2379/unit", node_name=name)))
    shared = SharedDefinitions(MemoryCoordinator(service), broker, name, lambda: ["a", "b"])
    broker.share_definitions(shared)
    await shared.start()
    return broker, shared


async def _settled(*shared: SharedDefinitions) -> None:
    """Every write committed and every node's watch caught up with the service."""
    for node in shared:
        await node.committed()
    for _ in range(20):
        await asyncio.sleep(0)


def _names(received) -> list[str]:
    return [type(method).__name__ for method in methods(received)]


def run(scenario) -> None:
    async def main() -> None:
        service = MemoryService()
        a, shared_a = await _node(service, "a")
        b, shared_b = await _node(service, "b")
        try:
            await scenario(service, (a, shared_a), (b, shared_b))
        finally:
            await shared_a.stop()
            await shared_b.stop()

    asyncio.run(main())


def test_declare_ok_waits_for_the_commit_and_the_other_node_holds_a_stand_in():
    async def scenario(service, node_a, node_b):
        (a, shared_a), (b, shared_b) = node_a, node_b
        client = opened_client(a)
        received = client.send(1, commands.Queue.Declare(queue="orders", durable=True,
                                                         arguments={"x-max-length": 5}))
        assert received == [], "declare-ok waits for the coordination service"
        await _settled(shared_a, shared_b)
        assert _names(client.take()) == ["DeclareOk"]
        stand_in = b.vhosts["/"].queues["orders"]
        assert stand_in.arguments == {"x-max-length": 5} and stand_in.durable
        owner = shared_b.owner_of("/", "orders")
        assert (owner.node, owner.live, owner.local) == ("a", True, False)
        assert b.queue_location("/", "orders") == ("a", True)

        other = opened_client(b)
        assert _names(other.send(1, commands.Queue.Bind(queue="orders", exchange="amq.direct",
                                                        routing_key="new"))) == []
        await _settled(shared_a, shared_b)
        assert _names(other.take()) == ["BindOk"]
        assert [key for _queue, key, _args in a.vhosts["/"].exchanges["amq.direct"].bindings()] == ["new"]

        other.send(1, commands.Queue.Delete(queue="orders"))
        await _settled(shared_a, shared_b)
        assert "orders" not in a.vhosts["/"].queues and shared_a.owner_of("/", "orders") is None

    run(scenario)


def test_a_lost_declare_race_gets_406_and_takes_the_winners_definition():
    async def scenario(service, node_a, node_b):
        (a, shared_a), (b, shared_b) = node_a, node_b
        first, second = opened_client(a), opened_client(b)
        # Both are applied locally before either write reaches the service: a real race.
        assert first.send(1, commands.Queue.Declare(queue="race", durable=True, arguments={"x-max-length": 1})) == []
        assert second.send(1, commands.Queue.Declare(queue="race", durable=True, arguments={"x-max-length": 2})) == []
        assert second.send(1, commands.Basic.Qos(prefetch_count=1)) == [], "held behind the declare"
        await _settled(shared_a, shared_b)
        assert _names(first.take()) == ["DeclareOk"]
        lost = methods(second.take())
        assert [type(method).__name__ for method in lost] == ["Close"], \
            "the refusal replaces declare-ok; the later qos-ok is dropped"
        assert (lost[0].reply_code, lost[0].reply_text) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'race' in vhost '/': "
                 "received '2' but current is '1'")
        assert (lost[0].class_id, lost[0].method_id) == (50, 10)
        assert b.vhosts["/"].queues["race"].arguments == {"x-max-length": 1}
        assert shared_b.owner_of("/", "race").node == "a"

    run(scenario)


def test_a_quick_delete_and_redeclare_is_not_undone_by_its_own_echoes():
    async def scenario(service, node_a, node_b):
        (a, shared_a), (b, shared_b) = node_a, node_b
        client = opened_client(a)
        client.send(1, commands.Queue.Declare(queue="flip", durable=True, arguments={"x-max-length": 1}))
        client.send(1, commands.Queue.Delete(queue="flip"))
        client.send(1, commands.Queue.Declare(queue="flip", durable=True, arguments={"x-max-length": 3}))
        await _settled(shared_a, shared_b)
        assert _names(client.take()) == ["DeclareOk", "DeleteOk", "DeclareOk"]
        for broker in (a, b):
            assert broker.vhosts["/"].queues["flip"].arguments == {"x-max-length": 3}

    run(scenario)


def test_with_the_service_out_of_reach_a_declaration_is_refused_and_undone():
    async def scenario(service, node_a, node_b):
        (a, shared_a), (b, shared_b) = node_a, node_b
        client = opened_client(a)
        client.send(1, commands.Queue.Declare(queue="kept", durable=True))
        await _settled(shared_a, shared_b)
        client.take()
        service.reachable = False
        client.send(1, commands.Queue.Declare(queue="refused", durable=True))
        for _ in range(50):
            await asyncio.sleep(0)
        closed = methods(client.take())
        assert [type(method).__name__ for method in closed] == ["Close"] and closed[0].reply_code == 541
        assert "coordination service is out of reach" in closed[0].reply_text
        assert "refused" not in a.vhosts["/"].queues and "kept" in a.vhosts["/"].queues
        other = opened_client(a)
        assert _names(other.send(1, commands.Queue.Declare(queue="kept", passive=True))) == ["DeclareOk"]
        service.reachable = True

    run(scenario)


def test_a_watch_that_fell_behind_history_lists_again_and_catches_up():
    async def scenario(service, node_a, node_b):
        (a, shared_a), (b, shared_b) = node_a, node_b
        client = opened_client(a)
        client.send(1, commands.Queue.Declare(queue="old", durable=True))
        await _settled(shared_a, shared_b)
        assert "old" in b.vhosts["/"].queues
        service.watches_paused = True  # every watch falls behind...
        client.send(1, commands.Queue.Declare(queue="new", durable=True))
        client.send(1, commands.Queue.Bind(queue="new", exchange="amq.fanout"))
        client.send(1, commands.Queue.Delete(queue="old"))
        await _settled(shared_a, shared_b)
        assert "new" not in b.vhosts["/"].queues and "old" in b.vhosts["/"].queues
        service.compact()  # ...and the history it needed is gone
        await _settled(shared_a, shared_b)
        queues = b.vhosts["/"].queues
        assert "new" in queues and "old" not in queues
        assert [destination.name for destination, _key, _args in b.vhosts["/"].exchanges["amq.fanout"].bindings()] == ["new"]

    run(scenario)


class _AnswerLost(MemoryCoordinator):
    """Commits the creation of `key` and then fails as if the answer never came back."""

    def __init__(self, service: MemoryService, key: str) -> None:
        super().__init__(service)
        self.key = key

    async def compare_and_set(self, key, value, expected_version, *, ephemeral=False):
        version = await super().compare_and_set(key, value, expected_version, ephemeral=ephemeral)
        if key == self.key:
            raise CoordinationUnavailable("the answer was lost")
        return version


def test_a_refused_declaration_that_was_committed_after_all_is_deleted_again():
    async def main() -> None:
        service = MemoryService()
        a = Broker(ServerConfig(cluster=ClusterConfig(url="etcd://127.0.0.1:2379/unit", node_name="a")))
        shared_a = SharedDefinitions(_AnswerLost(service, "definitions/queues/%2F,ghost"), a, "a", lambda: ["a", "b"])
        a.share_definitions(shared_a)
        await shared_a.start()
        b, shared_b = await _node(service, "b")
        try:
            client = opened_client(a)
            client.send(1, commands.Queue.Declare(queue="ghost", durable=True))
            for _ in range(50):
                await asyncio.sleep(0)
            closed = methods(client.take())
            assert [(type(m).__name__, m.reply_code) for m in closed] == [("Close", 541)]
            for _ in range(200):  # the echo comes, the key is deleted again, both nodes hear it
                await asyncio.sleep(0)
            assert "definitions/queues/%2F,ghost" not in service.keys
            assert "ghost" not in a.vhosts["/"].queues and "ghost" not in b.vhosts["/"].queues
        finally:
            await shared_a.stop()
            await shared_b.stop()

    asyncio.run(main())
