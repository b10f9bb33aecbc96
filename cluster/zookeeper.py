"""The ZooKeeper backend, through kazoo, its calls bridged to asyncio.

The session is kazoo's ZooKeeper session (timeout `session_ttl`); ephemeral keys are ephemeral
znodes. A key's version is the znode's data version, its revision the zxid of its last change.
ZooKeeper keeps no history, so a watch is "list, then re-list what a ZooKeeper watch says
changed, and diff": puts are reported with their own zxid, deletions with the directory's
child-change zxid. Resuming from an old revision works only when no key was added to or removed
from the directory since, or when the caller says which keys it had (`known_keys`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError, ConnectionClosedError, ConnectionLoss, NodeExistsError, NoNodeError, OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from cluster.address import ClusterAddress
from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, KeyValue, VersionConflict, WatchEvent,
)

CONNECT_TIMEOUT_S = 10.0
# kazoo's ways of saying "ZooKeeper is out of reach now"; it reconnects (with a new session if
# the old one expired) on its own, and callers see CoordinationUnavailable meanwhile.
_UNREACHABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
                KazooTimeoutError)


class ZooKeeperCoordinator(Coordinator):
    def __init__(self, address: ClusterAddress, client: KazooClient) -> None:
        self._root = "/" + address.prefix
        self._client = client
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, address: ClusterAddress, session_ttl: float) -> "ZooKeeperCoordinator":
        hosts = ",".join(f"{host}:{port}" for host, port in address.endpoints)
        client = KazooClient(hosts=hosts, timeout=session_ttl)
        try:
            await asyncio.to_thread(client.start, CONNECT_TIMEOUT_S)
        except KazooTimeoutError:
            client.close()
            raise CoordinationUnavailable(f"ZooKeeper at {hosts} did not answer") from None
        return cls(address, client)

    def _await(self, async_result: Any) -> asyncio.Future:
        """An asyncio future for a kazoo IAsyncResult (settled from kazoo's thread)."""
        future = self._loop.create_future()

        def settle(result: Any) -> None:
            def on_loop() -> None:
                if future.cancelled():
                    return
                try:
                    future.set_result(result.get_nowait())
                except _UNREACHABLE as error:
                    future.set_exception(CoordinationUnavailable(f"ZooKeeper out of reach: {error!r}"))
                except Exception as error:  # kazoo's own exception types, passed on as they are
                    future.set_exception(error)
            self._loop.call_soon_threadsafe(on_loop)

        async_result.rawlink(settle)
        return future

    def _path(self, key: str) -> str:
        return f"{self._root}/{key.strip('/')}"

    def _kv(self, key: str, data: bytes, stat: Any) -> KeyValue:
        return KeyValue(key, data, stat.version, stat.mzxid)

    async def _ensure_path(self, path: str) -> None:
        try:
            await asyncio.to_thread(self._client.ensure_path, path)
        except _UNREACHABLE as error:
            raise CoordinationUnavailable(f"ZooKeeper out of reach: {error!r}") from None

    async def _ensure_parent(self, key: str) -> None:
        await self._ensure_path(self._path(key).rsplit("/", 1)[0])

    async def get(self, key: str) -> KeyValue | None:
        try:
            data, stat = await self._await(self._client.get_async(self._path(key)))
        except NoNodeError:
            return None
        return self._kv(key, data, stat)

    async def put(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        while True:
            current = await self.get(key)
            try:
                return await self.compare_and_set(key, value, current.version if current else None,
                                                  ephemeral=ephemeral)
            except VersionConflict:
                continue  # someone wrote between our read and write; an unconditional put wins anyway

    async def compare_and_set(self, key: str, value: bytes, expected_version: int | None, *,
                              ephemeral: bool = False) -> int:
        path = self._path(key)
        try:
            if expected_version is None:
                await self._ensure_parent(key)
                await self._await(self._client.create_async(path, value, ephemeral=ephemeral))
                return 0
            stat = await self._await(self._client.set_async(path, value, version=expected_version))
            return stat.version
        except (NodeExistsError, BadVersionError, NoNodeError):
            raise VersionConflict(key, await self.get(key)) from None

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        try:
            await self._await(self._client.delete_async(self._path(key),
                                                        -1 if expected_version is None else expected_version))
            return True
        except NoNodeError:
            if expected_version is not None:
                raise VersionConflict(key, None) from None
            return False
        except BadVersionError:
            raise VersionConflict(key, await self.get(key)) from None

    async def _read_directory(self, directory: str, watch: Any = None) -> tuple[dict[str, KeyValue], int]:
        """Every key in `directory` and the directory's child-change zxid (pzxid)."""
        path = self._path(directory)
        await self._ensure_path(path)
        names, parent = await self._await(self._client.get_children_async(path, watch=watch, include_data=True))
        items: dict[str, KeyValue] = {}
        for name in names:
            key = f"{directory.strip('/')}/{name}"
            try:
                data, stat = await self._await(self._client.get_async(f"{path}/{name}", watch=watch))
            except NoNodeError:
                continue  # went between listing and reading; the watch reports it
            items[key] = self._kv(key, data, stat)
        return items, parent.pzxid

    async def list(self, directory: str) -> tuple[list[KeyValue], int]:
        items, pzxid = await self._read_directory(directory)
        return sorted(items.values(), key=lambda kv: kv.key), max([pzxid, *(kv.revision for kv in items.values())])

    async def watch(self, directory: str, after_revision: int,
                    known_keys: Collection[str] | None = None) -> AsyncIterator[WatchEvent]:
        changed = asyncio.Event()

        def on_change(_event: Any) -> None:  # kazoo's thread: a one-shot watch fired
            try:
                self._loop.call_soon_threadsafe(changed.set)
            except RuntimeError:
                pass  # the event loop is gone; nobody is watching any more

        known, pzxid = await self._read_directory(directory, on_change)
        fresh = sorted((kv for kv in known.values() if kv.revision > after_revision), key=lambda kv: kv.revision)
        if known_keys is None:
            if pzxid > after_revision:
                # Keys came or went since after_revision; which ones went, ZooKeeper cannot say.
                raise HistoryLost(f"ZooKeeper keeps no history: keys came or went in {directory} since "
                                  f"revision {after_revision}; pass the keys you had, or list it again")
            gone: list[str] = []
        else:
            gone = sorted(key for key in known_keys if key not in known)
        for kv in fresh:
            yield WatchEvent(EventKind.PUT, kv.key, kv.value, kv.revision)
        for key in gone:
            yield WatchEvent(EventKind.DELETE, key, b"", pzxid)
        while True:
            await changed.wait()
            changed.clear()
            # Watches fire once: reading again re-arms them; a change between firing and
            # re-reading is in what we read.
            now, pzxid = await self._read_directory(directory, on_change)
            events = [WatchEvent(EventKind.PUT, kv.key, kv.value, kv.revision) for key, kv in now.items()
                      if key not in known or known[key].revision != kv.revision]
            events += [WatchEvent(EventKind.DELETE, key, b"", pzxid) for key in known if key not in now]
            known = now
            for event in sorted(events, key=lambda e: e.revision):
                yield event

    async def close(self) -> None:
        await asyncio.to_thread(self._client.stop)
        await asyncio.to_thread(self._client.close)
