"""The ZooKeeper backend while ZooKeeper is out of reach: a write is refused within the request
deadline, and a refused write is never applied later. kazoo would queue it and send it on
reconnecting, so a declaration its client was told failed (541) would appear after all."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from cluster import connect, parse_cluster_address
from cluster.coordinator import CoordinationUnavailable
from cluster.zookeeper import REQUEST_DEADLINE_S
from interop_tests.coordination_services import start_zookeeper


async def _kill_zookeeper_and_wait_disconnected(service, coordinator) -> None:
    """kill -9 every ZooKeeper server and wait until kazoo noticed the closed socket."""
    service.kill9_all()
    deadline = time.monotonic() + 10
    while coordinator._client.connected:
        assert time.monotonic() < deadline, "kazoo still says connected 10 s after ZooKeeper died"
        await asyncio.sleep(0.05)


@pytest.mark.slow  # 11 s: kills ZooKeeper, waits out its request deadline, starts it again
def test_a_write_while_disconnected_is_refused_at_once_and_never_applied_later(tmp_path):
    service = start_zookeeper(tmp_path / "zk")
    try:
        async def scenario() -> None:
            coordinator = await connect(parse_cluster_address(service.url(f"z-{uuid.uuid4().hex[:6]}")), 2)
            try:
                await coordinator.put("definitions/queues/before", b"kept")
                await _kill_zookeeper_and_wait_disconnected(service, coordinator)
                started = time.monotonic()
                refusals = await asyncio.gather(
                    coordinator.compare_and_set("definitions/queues/refused", b"never", None),
                    coordinator.delete("definitions/queues/before"), return_exceptions=True)
                took = time.monotonic() - started
                assert [type(refusal) for refusal in refusals] == [CoordinationUnavailable] * 2, refusals
                assert took < REQUEST_DEADLINE_S + 5, f"the refusals took {took:.1f} s"

                service.start_again()
                # kazoo sends queued requests in order: a read made after reconnecting comes after
                # anything it kept queued, so it would see a refused write applied.
                deadline = time.monotonic() + 15
                while True:
                    try:
                        refused = await coordinator.get("definitions/queues/refused")
                        kept = await coordinator.get("definitions/queues/before")
                        break
                    except CoordinationUnavailable:
                        assert time.monotonic() < deadline, "ZooKeeper did not answer again"
                assert refused is None
                assert kept is not None and kept.value == b"kept"
            finally:
                await coordinator.close()

        asyncio.run(scenario())
    finally:
        service.stop()


def test_a_watch_sees_a_change_of_a_key_it_knew_after_zookeeper_came_back(tmp_path):
    """kazoo fires every watch with a pathless session event when the connection drops, and
    forgets them: the watch must read its known keys again (re-arming their data watches), or
    a later change of such a key (a replica group's new term or member) is never reported."""
    service = start_zookeeper(tmp_path / "zk")
    try:
        async def scenario() -> None:
            coordinator = await connect(parse_cluster_address(service.url(f"z-{uuid.uuid4().hex[:6]}")), 10)
            try:
                await coordinator.put("groups/q", b"term 1")
                items, revision = await coordinator.list("groups")
                events = coordinator.watch("groups", revision, [item.key for item in items])
                await coordinator.put("groups/q", b"term 2")
                first = await asyncio.wait_for(events.__anext__(), 20)
                assert (first.key, first.value) == ("groups/q", b"term 2")

                await _kill_zookeeper_and_wait_disconnected(service, coordinator)
                service.start_again()
                deadline = time.monotonic() + 30
                while True:
                    try:
                        await coordinator.put("groups/q", b"term 3")
                        break
                    except CoordinationUnavailable:
                        assert time.monotonic() < deadline, "ZooKeeper did not answer again"
                seen = []
                deadline = time.monotonic() + 30
                while b"term 3" not in seen:
                    remaining = deadline - time.monotonic()
                    assert remaining > 0, f"the watch never reported the change after the reconnect: {seen}"
                    try:
                        event = await asyncio.wait_for(events.__anext__(), remaining)
                    except asyncio.TimeoutError:
                        raise AssertionError(f"the watch never reported the change after the reconnect: {seen}")
                    seen.append(event.value)
                await events.aclose()
            finally:
                await coordinator.close()

        asyncio.run(scenario())
    finally:
        service.stop()
