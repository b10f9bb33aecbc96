"""Cluster membership: each live node holds an ephemeral key ``nodes/<name>`` with its record.

`Membership.join` writes this node's record (create-if-absent, so two live nodes can never share
a name) and then mirrors the ``nodes/`` directory by list-then-watch; `live_nodes()` is that
mirror. A node killed with kill -9 loses its key when its session expires, and every other node's
mirror drops it from the watch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from cluster.coordinator import (
    CoordinationUnavailable, Coordinator, EventKind, HistoryLost, VersionConflict, leaf_name,
)

log = logging.getLogger(__name__)

NODES = "nodes"


class NodeNameInUse(Exception):
    """Another live node holds this node name."""


@dataclass(frozen=True)
class NodeRecord:
    name: str
    amqp_address: str  # host:port clients connect to
    management_address: str  # host:port of the management API ("" when it is off)
    started_at: float  # seconds since the epoch

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "NodeRecord":
        fields = json.loads(data)
        return cls(str(fields["name"]), str(fields["amqp_address"]), str(fields["management_address"]),
                   float(fields["started_at"]))


class Membership:
    """This node's registration and the live nodes as the coordination service sees them."""

    def __init__(self, coordinator: Coordinator, me: NodeRecord, session_ttl: float) -> None:
        self._coordinator = coordinator
        self.me = me
        self._session_ttl = session_ttl
        self._live: dict[str, NodeRecord] = {}
        self._mirror: asyncio.Task[None] | None = None
        self._key = f"{NODES}/{leaf_name(me.name)}"
        self._left_listeners: list[Callable[[str], None]] = []

    def on_node_left(self, listener: Callable[[str], None]) -> None:
        """Call `listener(name)` whenever another node leaves the live list (stopped, or its
        session expired: killed, hung or cut off)."""
        self._left_listeners.append(listener)

    def _left(self, node: NodeRecord) -> None:
        if node.name == self.me.name:
            return
        for listener in self._left_listeners:
            try:
                listener(node.name)
            except Exception:  # one listener must not stop the membership watch
                log.exception("a node-left listener failed for %s", node.name)

    def live_nodes(self) -> list[NodeRecord]:
        """Every live node, this one included, by name."""
        return sorted(self._live.values(), key=lambda node: node.name)

    async def join(self) -> None:
        """Register; a key left by this name's previous, killed process is waited out (it expires
        within the session TTL). Raises NodeNameInUse if a live node keeps it longer."""
        key = self._key
        deadline = time.monotonic() + self._session_ttl + 2
        while True:
            try:
                await self._coordinator.compare_and_set(key, self.me.encode(), None, ephemeral=True)
                break
            except VersionConflict:
                if time.monotonic() > deadline:
                    raise NodeNameInUse(f"node name {self.me.name!r} is held by another live node") from None
                await asyncio.sleep(0.2)
        revision = await self._load()
        self._mirror = asyncio.create_task(self._follow(revision))

    async def _load(self) -> int:
        items, revision = await self._coordinator.list(NODES)
        before = self._live
        self._live = {}
        for item in items:
            self._add(item.key, item.value)
        for key, node in before.items():
            if key not in self._live:
                self._left(node)
        return revision

    def _add(self, key: str, value: bytes) -> None:
        try:
            node = NodeRecord.decode(value)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring an unreadable node record at %s", key)
            return
        self._live[key] = node

    async def _follow(self, revision: int) -> None:
        while True:
            try:
                if not revision:
                    revision = await self._load()
                async for event in self._coordinator.watch(NODES, revision, list(self._live)):
                    revision = event.revision
                    if event.kind is EventKind.PUT:
                        self._add(event.key, event.value)
                    else:
                        gone = self._live.pop(event.key, None)
                        if gone is not None:
                            self._left(gone)
                        if event.key == self._key:
                            await self._register_again()
            except HistoryLost:
                revision = 0  # list again
            except CoordinationUnavailable as error:
                # Resume from the revision reached; the keys we had let it report what went.
                log.warning("membership watch interrupted: %s", error)
                await asyncio.sleep(1)
            except Exception:  # the live list must never silently stop following
                log.exception("membership watch failed; listing the nodes again")
                revision = 0
                await asyncio.sleep(1)

    async def _register_again(self) -> None:
        """Our key went while we are alive: the session expired while the coordination service
        was out of reach (it has a new one now), or someone deleted it. Write it back."""
        log.warning("this node's membership key %s was removed; registering again", self._key)
        while True:
            try:
                await self._coordinator.compare_and_set(self._key, self.me.encode(), None, ephemeral=True)
                return
            except VersionConflict as conflict:
                if conflict.current is None or conflict.current.value != self.me.encode():
                    log.error("node name %r was taken by another node while this one was out", self.me.name)
                return
            except CoordinationUnavailable as error:
                # Still out of reach: keep trying, or this node stays out of every other node's
                # live list (the watch that resumes later has no event to bring it back).
                log.warning("cannot register again yet: %s", error)
                await asyncio.sleep(1)

    async def leave(self) -> None:
        if self._mirror is not None:
            self._mirror.cancel()
        await self._coordinator.delete(self._key)
