"""The broker with a deliberately broken replicated-queue journal, for the fault test only.

`python -m interop_tests.broken_replication_broker ARGS` runs the broker as `python -m
amqp_server ARGS` does, except that a replicated queue's journal confirms a record at once and
hands it to replication only with the next 50 ms batch (asynchronous replication: the confirm
leaves before any follower, or even the leader's own disk, has it); and a replicated stream
confirms a publish on the leader's append and sends its records (and makes them durable) in
50 ms batches. The fault tests run against it to show that they notice a build that confirms
before a majority fsynced: such a build must report lost messages; so does the strace check
(interop_tests/test_replicated_queues_strace.py), which must find its confirms leaving before any
fsync of their records. The switch lives here, in the test harness, never in the product.
"""

from __future__ import annotations

import asyncio

from cluster.replication.replicated_journal import ReplicatedJournal
from cluster.replication.leader import NotLeader
from cluster.replication.replica import QueueReplica
from cluster.replication.stream_replica_log import StreamReplicaLog
from persistence.stream_log import StreamLog

BATCH_S = 0.05
_late: dict[int, list[bytes]] = {}  # id(journal) -> records not handed to replication yet


def _replicate_late(self: ReplicatedJournal, payload: bytes) -> None:
    batch = _late.setdefault(id(self), [])
    batch.append(payload)
    if len(batch) == 1:
        asyncio.get_running_loop().call_later(BATCH_S, _hand_over_batch, self)


def _hand_over_batch(journal: ReplicatedJournal) -> None:
    for payload in _late.pop(id(journal), []):
        try:
            journal.replica.publish(payload)
        except NotLeader:
            return


def _confirm_at_once(self: ReplicatedJournal, callback) -> None:
    asyncio.get_running_loop().call_soon(callback, None)


def _stream_confirm_at_once(self: StreamLog, callback) -> None:
    """A replicated stream (committed by its owner) confirms on the leader's append."""
    if not self.externally_committed:
        _request_commit(self, callback)
        return
    asyncio.get_running_loop().call_soon(callback, None)


def _stream_flush_late(self: QueueReplica) -> None:
    """A replicated stream's records go to its followers (and its own disk) in 50 ms batches."""
    if not isinstance(self.log, StreamReplicaLog):
        _flush_soon(self)
        return
    if not self._flush_scheduled:
        self._flush_scheduled = True
        asyncio.get_running_loop().call_later(BATCH_S, self._flush)


ReplicatedJournal._replicate = _replicate_late  # type: ignore[method-assign]
ReplicatedJournal.request_sync = _confirm_at_once  # type: ignore[method-assign]
_request_commit = StreamLog.request_commit
StreamLog.request_commit = _stream_confirm_at_once  # type: ignore[method-assign]
_flush_soon = QueueReplica._flush_soon
QueueReplica._flush_soon = _stream_flush_late  # type: ignore[method-assign]

if __name__ == "__main__":
    from amqp_server.runtime.cli import main

    raise SystemExit(main())
