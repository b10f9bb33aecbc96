"""An in-memory coordination service for unit tests of what is built on the Coordinator
interface: several `MemoryCoordinator`s (one per simulated node) share one `MemoryService`, with
etcd's semantics (revisions, history and its compaction, compare-and-set, ephemeral keys per
session). Every call
yields to the event loop first, so calls of two nodes interleave as over a network."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection

from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, KeyValue, VersionConflict, WatchEvent,
)


class MemoryService:
    def __init__(self) -> None:
        self.revision = 0
        self.keys: dict[str, tuple[bytes, int, object | None]] = {}  # key -> (value, revision, session)
        self.history: list[WatchEvent] = []
        self.changed = asyncio.Event()
        self.reachable = True
        self.watches_paused = False  # watchers fall behind: they deliver nothing
        self.compacted_through = 0  # history up to here is gone, as after etcd's compaction

    def compact(self) -> None:
        """Forget the history so far: every watch that had not delivered it gets HistoryLost."""
        self.compacted_through = self.revision
        self.watches_paused = False
        self.changed.set()
        self.changed = asyncio.Event()

    def commit(self, key: str, value: bytes | None, session: object | None = None) -> int:
        self.revision += 1
        if value is None:
            del self.keys[key]
            self.history.append(WatchEvent(EventKind.DELETE, key, b"", self.revision))
        else:
            self.keys[key] = (value, self.revision, session)
            self.history.append(WatchEvent(EventKind.PUT, key, value, self.revision))
        self.changed.set()
        self.changed = asyncio.Event()
        return self.revision


def _directly_in(directory: str, key: str) -> bool:
    prefix = directory.strip("/") + "/"
    return key.startswith(prefix) and "/" not in key[len(prefix):]


class MemoryCoordinator(Coordinator):
    def __init__(self, service: MemoryService) -> None:
        self.service = service

    async def _reach(self) -> MemoryService:
        await asyncio.sleep(0)
        if not self.service.reachable:
            raise CoordinationUnavailable("the memory service is switched off")
        return self.service

    async def get(self, key: str) -> KeyValue | None:
        service = await self._reach()
        if key not in service.keys:
            return None
        value, revision, _session = service.keys[key]
        return KeyValue(key, value, revision, revision)

    async def put(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        service = await self._reach()
        return service.commit(key, value, self if ephemeral else None)

    async def compare_and_set(self, key: str, value: bytes, expected_version: int | None, *,
                              ephemeral: bool = False) -> int:
        service = await self._reach()
        current = service.keys.get(key)
        if (current[1] if current else None) != expected_version:
            raise VersionConflict(key, KeyValue(key, current[0], current[1], current[1]) if current else None)
        return service.commit(key, value, self if ephemeral else None)

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        service = await self._reach()
        current = service.keys.get(key)
        if expected_version is not None and (current is None or current[1] != expected_version):
            raise VersionConflict(key, None)
        if current is None:
            return False
        service.commit(key, None)
        return True

    async def list(self, directory: str) -> tuple[list[KeyValue], int]:
        service = await self._reach()
        items = [KeyValue(key, value, revision, revision) for key, (value, revision, _s) in sorted(service.keys.items())
                 if _directly_in(directory, key)]
        return items, service.revision

    async def watch(self, directory: str, after_revision: int,
                    known_keys: Collection[str] | None = None) -> AsyncIterator[WatchEvent]:
        service = self.service
        position = after_revision
        while True:
            changed = service.changed
            if position < service.compacted_through:
                raise HistoryLost(f"compacted through revision {service.compacted_through}")
            if service.watches_paused:
                await changed.wait()
                continue
            for event in service.history[position:]:
                position = event.revision
                if _directly_in(directory, event.key):
                    yield event
            if position == service.revision:
                await changed.wait()

    async def close(self) -> None:
        for key, (_value, _revision, session) in list(self.service.keys.items()):
            if session is self:
                self.service.commit(key, None)
