"""Where each shovel and federation link runs on a cluster: on one node, under a lease.

Implements amqp_server/broker/cluster_interface.py's `LinkPlacement`. Each link's lease is an
ephemeral key ``link-leases/<kind/vhost/name>`` (a `leaf_name`) holding the holder's node name.
A node takes a lease by creating the key if it is absent (compare-and-set from nothing), so two
nodes never hold one at once; the key vanishes with its holder's session (a stopped node
deletes its keys at once, a killed or cut-off one loses them within the session TTL). Every
node mirrors the directory (list-then-watch, as membership.py), so the nodes that want a lease
see it go and race for it again: the winner runs the link.

A holder that loses touch with the coordination service cannot know whether its session still
holds its keys: it stops what it runs at once (`on_stop`), so that a link does not run on two
nodes for longer than the session TTL, and takes its leases back once in touch again (its key is
still there: it is its own; or the race is run again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, VersionConflict, leaf_name,
)

log = logging.getLogger(__name__)

LEASES = "link-leases"
RETRY_S = 1.0  # after the coordination service did not answer


class _Wanted:
    """A lease this node competes for, and what to call when it gets or loses it."""

    def __init__(self, on_run: Callable[[], None], on_stop: Callable[[], None]) -> None:
        self.on_run = on_run
        self.on_stop = on_stop
        self.held = False
        self.version: int | None = None  # of our key, while held

    def granted(self, version: int) -> None:
        self.held = True
        self.version = version

    def lost(self) -> None:
        self.held = False
        self.version = None


class LinkLeases:
    """This node's link leases (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, node: str) -> None:
        self._coordinator = coordinator
        self._node = node
        self._holders: dict[str, str] = {}  # key -> holder's node: the directory's mirror
        self._wanted: dict[str, _Wanted] = {}
        self._mirror: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._in_touch = False

    @staticmethod
    def _key(kind: str, vhost: str, name: str) -> str:
        return f"{LEASES}/{leaf_name(f'{kind}/{vhost}/{name}')}"

    # -- cluster_interface.LinkPlacement ----------------------------------------------------------

    def place(self, kind: str, vhost: str, name: str, on_run: Callable[[], None],
              on_stop: Callable[[], None]) -> None:
        key = self._key(kind, vhost, name)
        if key in self._wanted:
            return
        self._wanted[key] = _Wanted(on_run, on_stop)
        if self._in_touch and (key not in self._holders or self._holders[key] == self._node):
            self._spawn(self._try(key))

    def release(self, kind: str, vhost: str, name: str) -> None:
        key = self._key(kind, vhost, name)
        wanted = self._wanted.pop(key, None)
        if wanted is not None and wanted.held:
            self._spawn(self._delete(key, wanted.version))

    def holder(self, kind: str, vhost: str, name: str) -> str | None:
        return self._holders.get(self._key(kind, vhost, name))

    # -- running ------------------------------------------------------------------------------

    async def start(self) -> None:
        revision = await self._load()
        self._in_touch = True
        self._mirror = asyncio.get_running_loop().create_task(self._follow(revision))
        self._compete()

    async def stop(self) -> None:
        """Give up every lease held (the other nodes take them at once) and stop following."""
        if self._mirror is not None:
            self._mirror.cancel()
        for task in list(self._pending):
            task.cancel()
        for key, wanted in list(self._wanted.items()):
            if wanted.held:
                await self._delete(key, wanted.version)
        self._wanted.clear()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _compete(self) -> None:
        for key, wanted in self._wanted.items():
            if not wanted.held and self._holders.get(key, self._node) == self._node:
                self._spawn(self._try(key))

    async def _try(self, key: str) -> None:
        wanted = self._wanted.get(key)
        if wanted is None or wanted.held:
            return
        try:
            version = await self._coordinator.compare_and_set(key, self._node.encode(), None, ephemeral=True)
        except VersionConflict as conflict:
            current = conflict.current
            if current is None or current.value.decode(errors="replace") != self._node:
                return  # another node holds it: the deletion of its key brings us back here
            # Our own key from before: this node's session survived a moment out of touch, or it
            # is this node's previous, killed process's (it is dead: the key is ours to keep).
            version = current.version
        except CoordinationUnavailable as error:
            log.warning("link lease %s: %s; trying again", key, error)
            await asyncio.sleep(RETRY_S)
            if self._in_touch:
                self._spawn(self._try(key))
            return
        if self._wanted.get(key) is not wanted:  # released meanwhile
            await self._delete(key, version)
            return
        wanted.granted(version)
        self._holders[key] = self._node
        log.info("link lease %s: this node runs it", key)
        wanted.on_run()

    async def _delete(self, key: str, version: int | None) -> None:
        try:
            await self._coordinator.delete(key, version)
        except (CoordinationUnavailable, VersionConflict) as error:
            log.warning("link lease %s not given up at once (%s): it expires with this node's session", key, error)

    def _stop_all(self) -> None:
        """Out of touch: stop what runs under our leases until we know we still hold them."""
        for key, wanted in self._wanted.items():
            if wanted.held:
                wanted.lost()
                log.warning("link lease %s: the coordination service is out of reach; stopping the link", key)
                wanted.on_stop()

    async def _load(self) -> int:
        items, revision = await self._coordinator.list(LEASES)
        self._holders = {item.key: item.value.decode(errors="replace") for item in items}
        return revision

    async def _follow(self, revision: int) -> None:
        while True:
            try:
                if not revision:
                    revision = await self._load()
                    self._in_touch = True
                    self._compete()
                async for event in self._coordinator.watch(LEASES, revision, list(self._holders)):
                    revision = event.revision
                    if event.kind is EventKind.PUT:
                        self._holders[event.key] = event.value.decode(errors="replace")
                        continue
                    self._holders.pop(event.key, None)
                    wanted = self._wanted.get(event.key)
                    if wanted is None:
                        continue
                    if wanted.held:  # our key went: our session expired
                        wanted.lost()
                        log.warning("link lease %s: lost (this node's session expired)", event.key)
                        wanted.on_stop()
                    self._spawn(self._try(event.key))
            except HistoryLost:
                revision = 0
            except CoordinationUnavailable as error:
                log.warning("link lease watch interrupted: %s", error)
                self._in_touch = False
                self._stop_all()
                await asyncio.sleep(RETRY_S)
                revision = 0  # list again: who holds what may have changed meanwhile
            except asyncio.CancelledError:
                raise
            except Exception:  # the mirror must never silently stop following
                log.exception("link lease watch failed; listing the leases again")
                self._in_touch = False
                self._stop_all()
                revision = 0
                await asyncio.sleep(RETRY_S)
