"""The ZooKeeper backend, through kazoo, its calls bridged to asyncio.

The session is kazoo's ZooKeeper session (timeout `session_ttl`); ephemeral keys are ephemeral
znodes. A key's version is the znode's data version, its revision the zxid of its last change.
ZooKeeper keeps no history, so a watch is "list, then re-read what a ZooKeeper watch says
changed, and diff": a child watch on the directory and a data watch on each key; when one fires,
the directory's names are listed again and only new keys and keys whose data watch fired are
read. Puts are reported with their own zxid, deletions with the directory's child-change zxid. Resuming from an old revision works only when no key was added to or removed
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

from amqp_server.config.cluster_address import ClusterAddress
from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, KeyValue, VersionConflict, WatchEvent,
)

CONNECT_TIMEOUT_S = 10.0
REQUEST_DEADLINE_S = 10.0  # as etcd's: how long a call may wait for ZooKeeper to come back
# kazoo's ways of saying "ZooKeeper is out of reach now"; it reconnects (with a new session if
# the old one expired) on its own, and callers see CoordinationUnavailable meanwhile.
_UNREACHABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, OperationTimeoutError,
                KazooTimeoutError)


class ZooKeeperCoordinator(Coordinator):
    def __init__(self, address: ClusterAddress, client: KazooClient) -> None:
        self._root = "/" + address.prefix
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._ensured: set[str] = set()  # directories known to exist
        self._give_up_at: float | None = None  # loop time after which calls fail at once (`hurry`)

    @classmethod
    async def open(cls, address: ClusterAddress, session_ttl: float) -> "ZooKeeperCoordinator":
        hosts = ",".join(f"{host}:{port}" for host, port in address.endpoints)
        # kazoo's default reconnect backoff doubles up to a minute: after an outage of ten
        # seconds it would try again only seconds after ZooKeeper is back. Try every second at most.
        client = KazooClient(hosts=hosts, timeout=session_ttl,
                             connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0})
        try:
            await asyncio.to_thread(client.start, CONNECT_TIMEOUT_S)
        except KazooTimeoutError:
            client.close()
            raise CoordinationUnavailable(f"ZooKeeper at {hosts} did not answer") from None
        return cls(address, client)

    async def _await(self, async_result: Any) -> Any:
        """The result of a kazoo IAsyncResult (settled from kazoo's thread). kazoo keeps a request
        queued while it reconnects: after REQUEST_DEADLINE_S it is CoordinationUnavailable."""
        deadline_s = self._deadline()
        try:
            return await asyncio.wait_for(self._future(async_result), deadline_s)
        except asyncio.TimeoutError:
            raise CoordinationUnavailable(f"ZooKeeper did not answer within {deadline_s:.1f} s") from None

    def hurry(self, within_s: float) -> None:
        self._give_up_at = self._loop.time() + within_s

    def _deadline(self) -> float:
        """How long a call may wait now: REQUEST_DEADLINE_S, or what is left until `hurry`'s."""
        if self._give_up_at is None:
            return REQUEST_DEADLINE_S
        return max(0.0, min(REQUEST_DEADLINE_S, self._give_up_at - self._loop.time()))

    def _future(self, async_result: Any) -> asyncio.Future[Any]:  # kazoo is untyped
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

    async def _writable(self) -> None:
        """Return once kazoo is connected (within REQUEST_DEADLINE_S, else CoordinationUnavailable):
        a write is handed to kazoo only then. kazoo keeps a request made while it reconnects
        queued and sends it once it is back, which for a write could be long after the caller
        gave up on it and told its client the change was refused: a refused declaration would
        then appear after all. Waiting here rides out a short reconnection as kazoo would."""
        deadline = self._loop.time() + self._deadline()
        while not self._client.connected:
            if self._loop.time() >= deadline:
                raise CoordinationUnavailable(f"ZooKeeper out of reach for {REQUEST_DEADLINE_S:.0f} s")
            await asyncio.sleep(0.05)

    def _path(self, key: str) -> str:
        return f"{self._root}/{key.strip('/')}"

    def _kv(self, key: str, data: bytes, stat: Any) -> KeyValue:
        return KeyValue(key, data, stat.version, stat.mzxid)

    async def _ensure_path(self, path: str) -> None:
        if path in self._ensured:  # directories are never removed: once made, made
            return
        try:
            await asyncio.to_thread(self._client.ensure_path, path)
        except _UNREACHABLE as error:
            raise CoordinationUnavailable(f"ZooKeeper out of reach: {error!r}") from None
        self._ensured.add(path)

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
        await self._writable()
        try:
            if expected_version is None:
                await self._ensure_parent(key)
                await self._writable()  # again: ensuring the parent took a while
                await self._await(self._client.create_async(path, value, ephemeral=ephemeral))
                return 0
            stat = await self._await(self._client.set_async(path, value, version=expected_version))
            version: int = stat.version  # (kazoo is untyped)
            return version
        except (NodeExistsError, BadVersionError, NoNodeError):
            raise VersionConflict(key, await self.get(key)) from None

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        await self._writable()
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

        async def read(name: str) -> KeyValue | None:
            key = f"{directory.strip('/')}/{name}"
            try:
                data, stat = await self._await(self._client.get_async(f"{path}/{name}", watch=watch))
            except NoNodeError:
                return None  # went between listing and reading; the watch reports it
            return self._kv(key, data, stat)

        items = {item.key: item for item in await _gathered(read, names) if item is not None}
        return items, parent.pzxid

    async def list(self, directory: str) -> tuple[list[KeyValue], int]:
        items, pzxid = await self._read_directory(directory)
        return sorted(items.values(), key=lambda kv: kv.key), max([pzxid, *(kv.revision for kv in items.values())])

    async def watch(self, directory: str, after_revision: int,
                    known_keys: Collection[str] | None = None) -> AsyncIterator[WatchEvent]:
        path = self._path(directory)
        prefix = directory.strip("/") + "/"
        children_changed = asyncio.Event()
        data_changed: set[str] = set()  # children whose data watch fired

        def on_children(_event: Any) -> None:  # kazoo's thread: the one-shot child watch fired
            self._call_on_loop(children_changed.set)

        def on_data(event: Any) -> None:  # kazoo's thread: one child's data watch fired
            # No path: the connection dropped, and kazoo fired and forgot every watch. Each
            # child is read again, which re-arms its data watch (else a later change of a key
            # already known would never be reported).
            name = event.path.rsplit("/", 1)[1] if event.path else _EVERY_CHILD

            def mark() -> None:
                data_changed.add(name)
                children_changed.set()  # wakes the loop; the children are listed again too
            self._call_on_loop(mark)

        async def read(name: str) -> KeyValue | None:
            try:
                data, stat = await self._await(self._client.get_async(f"{path}/{name}", watch=on_data))
            except NoNodeError:
                return None  # went meanwhile; the child watch reports it
            return self._kv(prefix + name, data, stat)

        await self._ensure_path(path)
        names, parent = await self._await(self._client.get_children_async(path, watch=on_children,
                                                                          include_data=True))
        known = {item.key: item for item in await _gathered(read, names) if item is not None}
        pzxid = parent.pzxid
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
            await children_changed.wait()
            children_changed.clear()
            changed, data_changed = data_changed, set()
            # Watches fire once: reading again re-arms them. Only new children and children whose
            # data changed are read, so a change costs one listing, not a read of every key.
            names, parent = await self._await(self._client.get_children_async(path, watch=on_children,
                                                                              include_data=True))
            present = {prefix + name for name in names}
            events = [WatchEvent(EventKind.DELETE, key, b"", parent.pzxid) for key in known if key not in present]
            for key in [key for key in known if key not in present]:
                del known[key]
            to_read = [name for name in names
                       if prefix + name not in known or name in changed or _EVERY_CHILD in changed]
            for item in await _gathered(read, to_read):
                if item is None:
                    continue
                if item.key not in known or known[item.key].revision != item.revision:
                    events.append(WatchEvent(EventKind.PUT, item.key, item.value, item.revision))
                known[item.key] = item
            for event in sorted(events, key=lambda e: e.revision):
                yield event

    def _call_on_loop(self, callback: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            pass  # the event loop is gone; nobody is watching any more

    async def close(self) -> None:
        await asyncio.to_thread(self._client.stop)
        await asyncio.to_thread(self._client.close)


READS_IN_FLIGHT = 256
# In a watch's set of changed children: every child (kazoo dropped the watches at a disconnect).
_EVERY_CHILD = "/"


async def _gathered(read: Any, names: list[str]) -> list[KeyValue | None]:
    """`read(name)` for every name, READS_IN_FLIGHT at a time (a directory of 10,000 keys is
    read in 40 round trips' time, not 10,000)."""
    results: list[KeyValue | None] = []
    for start in range(0, len(names), READS_IN_FLIGHT):
        results += await asyncio.gather(*(read(name) for name in names[start:start + READS_IN_FLIGHT]))
    return results
