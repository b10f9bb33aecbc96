"""The one interface both coordination backends (etcd, ZooKeeper) implement.

Keys are ``directory/leaf`` paths relative to the cluster's prefix; a leaf never contains "/"
(`leaf_name` makes any name safe). A key's `version` is an opaque token: compare it for equality
and pass it back to `compare_and_set`. A revision orders changes within one cluster: every change
a watch reports has a higher revision than the ones before it.

Ephemeral keys belong to this coordinator's session: they vanish when the session ends, whether
by `close()` or because the process died and stopped renewing it (after `session_ttl`).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from urllib.parse import quote

from amqp_server.broker.cluster_interface import CoordinationOutOfReach


class CoordinationUnavailable(CoordinationOutOfReach):
    """No member of the coordination service answered in time."""


class VersionConflict(Exception):
    """A compare-and-set found another version than expected; `current` is what is there now."""

    def __init__(self, key: str, current: "KeyValue | None") -> None:
        super().__init__(f"{key}: version conflict")
        self.key = key
        self.current = current


class HistoryLost(Exception):
    """A watch cannot resume from the revision asked for (compacted, or a backend without history
    of deletions): the caller lists the directory again and diffs against what it had."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    version: int  # opaque; for compare_and_set
    revision: int  # when it was last changed


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class WatchEvent:
    kind: EventKind
    key: str
    value: bytes  # b"" for DELETE
    revision: int


def leaf_name(name: str) -> str:
    """`name` as one key segment for both backends: no "/", and never "." or ".." (ZooKeeper)."""
    quoted = quote(name, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..", "") or quoted.startswith(".") else quoted


class Coordinator(abc.ABC):
    """An open connection to the coordination service, with one session for ephemeral keys."""

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, ephemeral: bool = False) -> int:
        """Write unconditionally; returns the new version."""

    @abc.abstractmethod
    async def compare_and_set(self, key: str, value: bytes, expected_version: int | None, *,
                              ephemeral: bool = False) -> int:
        """Write only if the key is at `expected_version` (None: only if it does not exist);
        returns the new version or raises VersionConflict."""

    @abc.abstractmethod
    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Remove the key (only at `expected_version` when given, else VersionConflict);
        False if it was not there."""

    @abc.abstractmethod
    async def list(self, directory: str) -> tuple[list[KeyValue], int]:
        """The keys directly in `directory` and the revision this listing is consistent with."""

    @abc.abstractmethod
    def watch(self, directory: str, after_revision: int,
              known_keys: Collection[str] | None = None) -> AsyncIterator[WatchEvent]:
        """Changes to keys directly in `directory` with a revision above `after_revision`, in
        revision order, until the iterator is closed. `known_keys` are the keys the caller had at
        `after_revision`: a backend without history (ZooKeeper) needs them to report deletions
        made before the watch started, and raises HistoryLost without them when there were some."""

    def hurry(self, within_s: float) -> None:
        """Every call from now on gives up (CoordinationUnavailable) once ``within_s`` seconds
        have passed, rather than after the backend's deadline each: a node that leaves does so
        in bounded time whatever the service does (its ephemeral keys expire on their own)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session (its ephemeral keys go at once) and the connection."""
