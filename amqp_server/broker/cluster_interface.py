"""What the core asks of a cluster, and nothing more: the interfaces the cluster plug-in implements.

A single node runs without any of it (every `Broker` attribute below stays None, and no module
of `cluster/` is imported). `amqp_server.runtime` loads the plug-in (cluster/node.py) only when
`--cluster` is given; the plug-in then registers its implementations with the broker:

- `Broker.joined_cluster(membership, link_channel_class)`: the cluster's live nodes, and the
  channel class a link from another node gets (it takes the publishes that node forwards);
- `Broker.share_definitions(shared)`: where each queue lives (`SharedDefinitions.owner_of`) and
  definition changes committed in the coordination service;
- `Broker.replicate_queues(replicated)`: the replicated implementation of the quorum queue type
  (a journal that a majority fsyncs), of streams (a log a majority fsyncs) and their membership
  operations;
- `Broker.place_links(placement)`: which node runs each shovel and federation link (exactly one,
  under a lease in the coordination service).

Queues of other nodes reach the vhost as queue-type implementations of their own
(queues/queue_type.py; the plug-in's cluster/links/remote_queue.py), so the codec, the
connection and the channel never ask where a queue lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from persistence.queue_store import QueueStore
    from persistence.stream_log import StreamLog
    from queues.journal import QueueJournal
    from queues.stream_queue import StreamKeeper, StreamQueue


class ClusterChangeRefused(Exception):
    """A cluster operation that cannot be made (a membership change of a replicated queue that
    would leave it without a majority, say); the text says why (HTTP 400)."""


class CoordinationOutOfReach(ConnectionError):
    """The coordination service did not answer in time (HTTP 503)."""


class RaftFigures(NamedTuple):
    """One replica's Raft figures, as RabbitMQ's ra_metrics row (the rabbitmq_raft_* families):
    ``snapshot_index`` is the last entry its snapshot stands for (the log stores none at or
    below it; 0: no snapshot), ``applied_index`` the last entry its state machine has applied,
    ``commit_index`` what a majority has fsynced as this replica knows it, ``last_written_index``
    its log's last entry. snapshot_index <= applied_index <= commit_index <= last_written_index
    holds for a queue's replica whose log is durable."""

    vhost: str
    queue: str
    term: int
    snapshot_index: int
    applied_index: int
    commit_index: int
    last_written_index: int


class NodeRecord(Protocol):
    """Another node of the cluster as its membership record describes it."""

    name: str
    amqp_address: str
    management_address: str
    started_at: float


class Membership(Protocol):
    def live_nodes(self) -> "list[Any]":
        """The live nodes' records (NodeRecord), this one included."""


class QueueOwner(Protocol):
    @property
    def node(self) -> str: ...

    @property
    def live(self) -> bool: ...


class SharedDefinitions(Protocol):
    """The cluster's shared definitions, once joined."""

    @property
    def changes(self) -> int: ...

    def owner_of(self, vhost: str, queue: str) -> "QueueOwner | None": ...

    def changed(self, kind: str, entry: dict[str, Any], present: bool) -> None: ...

    def access_changed(self, access: Any) -> None: ...

    def when_committed(self, changes: int, callback: Callable[[Exception | None], None]) -> None: ...


class ReplicatedQueues(Protocol):
    """The replicated quorum queue type (journals a majority fsyncs), replicated streams (logs a
    majority fsyncs), and their groups."""

    def journal_for(self, vhost: str, name: str, open_store: "Callable[[], QueueStore]",
                    arguments: dict[str, Any]) -> "QueueJournal": ...

    def stream_for(self, vhost: str, name: str, arguments: dict[str, Any], max_segment_bytes: int | None,
                   build: "Callable[[StreamLog, StreamKeeper], StreamQueue]") -> "StreamQueue":
        """A stream this node holds: `build(log, keeper)` makes it over its replica's files."""

    def describe(self, vhost: str, name: str) -> dict[str, Any] | None: ...

    def replica_stream(self, vhost: str, name: str) -> "StreamLog | None":
        """The files of this node's replica of the replicated stream (None: it holds none), for
        the figures of a stream another node leads (metrics/stream_figures.py)."""

    def raft_figures(self) -> list[RaftFigures]: ...

    async def add_member(self, vhost: str, name: str, node: str) -> None: ...

    async def delete_member(self, vhost: str, name: str, node: str) -> None: ...

    async def transfer_leadership(self, vhost: str, name: str, node: str) -> None: ...


class LinkPlacement(Protocol):
    """Runs each shovel or federation link on exactly one node of the cluster, under a lease.

    `place` asks for the lease of (kind, vhost, name): `on_run()` is called when this node holds
    it (at once, or later when the node that held it dies and its lease expires), `on_stop()`
    when this node loses it (its session with the coordination service expired); `release`
    gives it up (the shovel was deleted here, or the node stops). Both callbacks come on the
    event loop and must not block."""

    def place(self, kind: str, vhost: str, name: str, on_run: Callable[[], None],
              on_stop: Callable[[], None]) -> None: ...

    def release(self, kind: str, vhost: str, name: str) -> None: ...

    def holder(self, kind: str, vhost: str, name: str) -> str | None:
        """The node holding the lease now, as last seen (None: nobody)."""
