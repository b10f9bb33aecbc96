"""Where each shovel and federation link runs on a cluster: on exactly one node, under a lease.

The core asks for this through `LinkPlacement` (amqp_server/broker/cluster_interface.py); this is
its implementation on the coordination service. One key per link, ephemeral in the holder's
session (it vanishes within the session TTL when the holder dies, or at once when it leaves):

    link-leases/<kind>,<vhost>,<name>       {"node": holder}

Every node that has the link (every node: its definition is shared) asks for the lease; the one
whose create-if-absent succeeds runs it (`on_run`), the others follow the directory with one
watch and try again when the key goes. A holder that sees its own key go (its session expired
while the service was out of reach, and another node may have taken it) stops the link
(`on_stop`) and competes again: a link may then run on two nodes for the moments it takes the
old holder to notice, which an on-confirm shovel survives (the destination may get duplicates,
the source loses nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, VersionConflict, WatchEvent, leaf_name,
)

log = logging.getLogger(__name__)

DIRECTORY = "link-leases"
RETRY_S = 1.0  # after the service did not answer


@dataclass(frozen=True)
class _Wanted:
    on_run: Callable[[], None]
    on_stop: Callable[[], None]


def lease_key(kind: str, vhost: str, name: str) -> str:
    return f"{DIRECTORY}/{leaf_name(kind)},{leaf_name(vhost)},{leaf_name(name)}"


class LinkLeases:
    """This node's side of the link leases (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, node: str) -> None:
        self._coordinator = coordinator
        self._node = node
        self._value = json.dumps({"node": node}).encode()
        self._wanted: dict[str, _Wanted] = {}
        self._held: set[str] = set()  # keys of the leases this node holds
        self._trying: set[str] = set()  # keys a create-if-absent is under way for
        self._holders: dict[str, str] = {}  # key -> holder node, as last seen
        self._tasks: set[asyncio.Task[None]] = set()
        self._follower: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """List the leases and follow them from now on."""
        revision = await self._relist()
        self._follower = asyncio.get_running_loop().create_task(self._follow(revision))

    async def stop(self) -> None:
        """Give up every lease held here (the links stopped first) and stop following."""
        if self._follower is not None:
            self._follower.cancel()
        for task in list(self._tasks):
            task.cancel()
        for key in list(self._held):
            if key in self._wanted:
                try:
                    await self._coordinator.delete(key)
                except CoordinationUnavailable:
                    pass  # it lapses with the session
        self._wanted.clear()
        self._held.clear()

    # -- LinkPlacement ----------------------------------------------------------------------------

    def place(self, kind: str, vhost: str, name: str, on_run: Callable[[], None],
              on_stop: Callable[[], None]) -> None:
        key = lease_key(kind, vhost, name)
        if key in self._wanted:
            return
        self._wanted[key] = _Wanted(on_run, on_stop)
        self._try(key)

    def release(self, kind: str, vhost: str, name: str) -> None:
        key = lease_key(kind, vhost, name)
        self._wanted.pop(key, None)
        if key in self._held:
            self._held.discard(key)
            self._spawn(self._delete(key))

    def holder(self, kind: str, vhost: str, name: str) -> str | None:
        return self._holders.get(lease_key(kind, vhost, name))

    # -- taking ---------------------------------------------------------------------------------------

    def _try(self, key: str) -> None:
        wanted = self._wanted.get(key)
        if wanted is None or key in self._held or key in self._trying or key in self._holders:
            return
        self._trying.add(key)
        self._spawn(self._take(key, wanted))

    async def _take(self, key: str, wanted: _Wanted) -> None:
        try:
            while True:
                try:
                    await self._coordinator.compare_and_set(key, self._value, None, ephemeral=True)
                except VersionConflict as conflict:
                    if conflict.current is None:
                        continue  # gone again meanwhile
                    self._holders[key] = _holder_of(conflict.current.value)
                    return  # someone holds it: tried again when its key goes
                except CoordinationUnavailable as error:
                    log.warning("link lease %s: the coordination service is out of reach (%s); retrying", key, error)
                    await asyncio.sleep(RETRY_S)
                    continue
                break
        finally:
            self._trying.discard(key)
        if self._wanted.get(key) is not wanted:  # released meanwhile
            await self._delete(key)
            return
        self._held.add(key)
        self._holders[key] = self._node
        log.info("this node holds %s: the link runs here", key)
        wanted.on_run()

    async def _delete(self, key: str) -> None:
        try:
            current = await self._coordinator.get(key)
            if current is not None and _holder_of(current.value) == self._node:
                await self._coordinator.delete(key, current.version)
        except (CoordinationUnavailable, VersionConflict):
            pass  # gone, or another's now; a lease of ours lapses with the session anyway

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- following -------------------------------------------------------------------------------------

    async def _relist(self) -> int:
        items, revision = await self._coordinator.list(DIRECTORY)
        listed = {item.key: _holder_of(item.value) for item in items}
        for key in [key for key in self._holders if key not in listed]:
            self._gone(key)
        for key, node in listed.items():
            self._seen(key, node)
        for key in self._wanted:
            self._try(key)
        return revision

    async def _follow(self, revision: int) -> None:
        while True:
            try:
                if not revision:
                    revision = await self._relist()
                async for event in self._coordinator.watch(DIRECTORY, revision, list(self._holders)):
                    revision = event.revision
                    self._event(event)
            except HistoryLost:
                revision = 0
            except CoordinationUnavailable as error:
                log.warning("watch of %s interrupted: %s", DIRECTORY, error)
                revision = 0
                await asyncio.sleep(RETRY_S)
            except asyncio.CancelledError:
                raise
            except Exception:  # the leases must never silently stop following
                log.exception("watch of %s failed; listing it again", DIRECTORY)
                revision = 0
                await asyncio.sleep(RETRY_S)

    def _event(self, event: WatchEvent) -> None:
        if event.kind is EventKind.PUT:
            self._seen(event.key, _holder_of(event.value))
        else:
            self._gone(event.key)

    def _seen(self, key: str, node: str) -> None:
        self._holders[key] = node
        wanted = self._wanted.get(key)
        if wanted is not None and key in self._held and node != self._node:
            self._lost(key, wanted)

    def _gone(self, key: str) -> None:
        self._holders.pop(key, None)
        wanted = self._wanted.get(key)
        if wanted is None:
            return
        if key in self._held:  # our own lease lapsed (session expired): stop, then compete again
            self._lost(key, wanted)
        self._try(key)

    def _lost(self, key: str, wanted: _Wanted) -> None:
        self._held.discard(key)
        log.warning("this node lost %s: the link stops here", key)
        wanted.on_stop()


def _holder_of(value: bytes) -> str:
    try:
        document = json.loads(value)
    except ValueError:
        return ""
    return str(document.get("node", "")) if isinstance(document, dict) else ""
