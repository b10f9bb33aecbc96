"""Link leases on the in-memory coordination service: of the nodes that place a shovel exactly one
runs it; when that node's session ends the lease goes and another node takes it; a released
lease is free at once; a holder whose key is taken over stops."""

from __future__ import annotations

import asyncio

from cluster.link_leases import LinkLeases, lease_key
from tests.memory_coordinator import MemoryCoordinator, MemoryService


class Mortal(MemoryCoordinator):
    """A node's coordinator that can die: it answers nothing more, and its session's keys go."""

    dead = False

    async def _reach(self) -> MemoryService:
        if self.dead:
            await asyncio.Event().wait()
        return await super()._reach()

    async def watch(self, directory, after_revision, known_keys=None):
        async for event in super().watch(directory, after_revision, known_keys):
            if self.dead:
                await asyncio.Event().wait()
            yield event

    async def die(self) -> None:
        self.dead = True
        await self.close()  # the session expires: its ephemeral keys are deleted


async def _settled() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_exactly_one_node_runs_a_link_and_another_takes_it_when_that_node_goes() -> None:
    async def main() -> None:
        service = MemoryService()
        coordinators = {name: Mortal(service) for name in ("a", "b", "c")}
        leases = {name: LinkLeases(coordinator, name) for name, coordinator in coordinators.items()}
        running: list[str] = []
        stopped: list[str] = []
        for name, lease in leases.items():
            await lease.start()
            lease.place("shovel", "/", "s1", on_run=lambda name=name: running.append(name),
                        on_stop=lambda name=name: stopped.append(name))
        await _settled()
        assert len(running) == 1
        first = running[0]
        assert all(lease.holder("shovel", "/", "s1") == first for lease in leases.values())
        await coordinators[first].die()
        await _settled()
        assert len(running) == 2 and running[1] != first
        second = running[1]
        others = [name for name in leases if name not in (first, second)]
        assert leases[others[0]].holder("shovel", "/", "s1") == second
        leases[second].release("shovel", "/", "s1")
        await _settled()
        assert running[2:] == others  # released: the one left takes it at once
        for name, lease in leases.items():
            if name != first:
                await lease.stop()

    asyncio.run(main())


def test_a_holder_whose_lease_lapsed_and_was_taken_stops() -> None:
    async def main() -> None:
        service = MemoryService()
        a, b = MemoryCoordinator(service), MemoryCoordinator(service)
        lease_a, lease_b = LinkLeases(a, "a"), LinkLeases(b, "b")
        events: list[str] = []
        await lease_a.start()
        lease_a.place("shovel", "/", "s", on_run=lambda: events.append("a runs"), on_stop=lambda: events.append("a stops"))
        await _settled()
        await lease_b.start()
        lease_b.place("shovel", "/", "s", on_run=lambda: events.append("b runs"), on_stop=lambda: events.append("b stops"))
        await _settled()
        assert events == ["a runs"]
        # a's session expired while it could not see the service, and another node took the key
        # (as a watch that catches up shows it: the key is another's).
        service.commit(lease_key("shovel", "/", "s"), b'{"node": "c"}')
        await _settled()
        assert events == ["a runs", "a stops"]
        assert lease_a.holder("shovel", "/", "s") == lease_b.holder("shovel", "/", "s") == "c"
        service.commit(lease_key("shovel", "/", "s"), None)  # c dies in turn
        await _settled()
        assert sorted(events[2:]) in (["a runs"], ["b runs"])
        await lease_a.stop()
        await lease_b.stop()

    asyncio.run(main())
