"""Replicated streams on a clustered broker: a durable `x-queue-type: stream` whose log a group
of nodes replicates, as a quorum queue's (docs/replication.md "Streams", docs/streams.md "On a
cluster").

The replica's log is the stream's own files (cluster/replication/stream_replica_log.py): the
leader's broker appends its publishes to the stream as on one node, and the replica sends the
records, byte for byte, to the followers, which append them at the same offsets. What differs
from a stream on one node is when a record counts: it is readable by consumers, and its
publisher's confirm leaves, only once a majority of the group fsynced it (the commit index).

`ReplicatedStream` is the owner of one such stream where its replica leads: the `StreamQueue`
the broker holds there keeps its log through it (`StreamKeeper`). It lets the stream take
publishes while its replica leads (or, for a stream just declared here, before its group's
first term: they are entries of no term, committed by the first leader's no-op), and when the
replica stops leading it refuses them, fails the confirms still waiting (basic.nack: nothing
unreplicated is confirmed) and hands the queue over (replicated_queues.py). A stream deleted
here deletes its group, so every member drops its copy.

Imported only on a clustered broker.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from cluster.replication.replica import QueueReplica, Role
from cluster.replication.stream_replica_log import StreamReplicaLog

log = logging.getLogger(__name__)

STREAM_KIND = "stream"


def stream_id(vhost: str, name: str) -> str:
    """The replica group's name of stream `name` in `vhost` (a quorum queue's has no kind)."""
    return json.dumps([vhost, name, STREAM_KIND], separators=(",", ":"))


def is_stream_id(replica_id: str) -> bool:
    try:
        parts = json.loads(replica_id)
    except (ValueError, TypeError):
        return False
    return isinstance(parts, list) and len(parts) == 3 and parts[2] == STREAM_KIND


class NotReplicated(OSError):
    """The stream's replica stopped leading before a majority stored the record."""


class ReplicatedStream:
    """See the module docstring. ``on_lost(owner)``: the replica stopped leading (hand the
    queue over); ``on_deleted(owner)``: the stream was deleted here."""

    def __init__(self, replica: QueueReplica, log: StreamReplicaLog, max_segment_bytes: int | None,
                 on_lost: Callable[["ReplicatedStream"], None],
                 on_deleted: Callable[["ReplicatedStream"], None], *, new_group: bool) -> None:
        self.replica = replica
        self.log = log
        self._max_segment_bytes = max_segment_bytes
        self._on_lost = on_lost
        self._on_deleted = on_deleted
        self._leading = False
        self._released = False
        if new_group and replica.role is not Role.LEADER:
            # Declared here a moment ago: its group takes its first term in a round trip to the
            # coordination service. Publishes meanwhile are kept, and confirmed once committed
            # (entries of no term, before the first leader's no-op), and so is its segment size.
            log.stream.set_writable(True)
            self._log_segment_size()

    @property
    def replica_id(self) -> str:
        return self.replica.queue

    # -- the replica's reports (ReplicaManager.own) ---------------------------------------------

    def on_commit(self, index: int) -> None:
        """(The replica tells the log itself: records become readable, confirms leave.)"""

    def on_role(self, role: Role) -> None:
        stream = self.log.stream
        if role is Role.LEADER:
            if self._leading or self._released:
                return
            self._leading = True
            stream.set_writable(True)
            self._log_segment_size()
            return
        was_leading, self._leading = self._leading, False
        stream.set_writable(False)
        stream.fail_commits(NotReplicated(f"the replica of {self.replica_id} stopped leading before a majority "
                                          "stored it"))
        if was_leading and not self._released:
            self._on_lost(self)

    def _log_segment_size(self) -> None:
        """Append the stream's segment size (a CONFIG entry) if it is not the one in force. A
        full disk must not fail the role change that asks for it (the replica's own report): the
        stream rolls at the size in force, the same on every copy, until a later term logs it."""
        if self._max_segment_bytes is None:
            return
        try:
            self.log.set_segment_size(self._max_segment_bytes)
        except OSError as error:
            log.warning("%s: its segment size stays %d for now: %s", self.replica_id,
                        self.log.stream.max_segment_bytes, error)

    # -- the queue's end (StreamKeeper) -----------------------------------------------------------

    def released(self, deleted: bool) -> None:
        """The broker's queue object of the stream goes: deleted, handed over, or the broker stops."""
        if self._released:
            return
        self._released = True
        self._leading = False
        stream = self.log.stream
        stream.set_writable(False)
        stream.fail_commits(NotReplicated(f"the stream {self.replica_id} is no longer served here"))
        if deleted:
            self._on_deleted(self)
