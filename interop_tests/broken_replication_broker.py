"""The broker with a deliberately broken replicated-queue journal, for the fault test only.

`python -m interop_tests.broken_replication_broker ARGS` runs the broker as `python -m
amqp_server ARGS` does, except that a replicated queue's journal confirms a record at once and
hands it to replication only with the next 50 ms batch (asynchronous replication: the confirm
leaves before any follower, or even the leader's own disk, has it). The fault test runs against
it to show that it notices a build that confirms before a majority fsynced: such a build must
report lost messages; so does the strace check (interop_tests/test_replicated_queues_strace.py),
which must find its confirms leaving before any fsync of their records. The switch lives here, in
the test harness, never in the product.
"""

from __future__ import annotations

import asyncio

from cluster.replication.replicated_journal import ReplicatedJournal
from cluster.replication.leader import NotLeader

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


ReplicatedJournal._replicate = _replicate_late  # type: ignore[method-assign]
ReplicatedJournal.request_sync = _confirm_at_once  # type: ignore[method-assign]

if __name__ == "__main__":
    from amqp_server.runtime.cli import main

    raise SystemExit(main())
