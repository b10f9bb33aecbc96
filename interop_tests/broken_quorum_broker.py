"""The broker with a deliberately broken commit rule, for the fault checker's test only.

`python -m interop_tests.broken_quorum_broker ARGS` runs the broker as `python -m amqp_server
ARGS` does, except that a replicated queue's leader commits (and so confirms) an entry once its
own disk has it: it confirms without a majority. Cut off from its followers it goes on
confirming until check-quorum steps it down, and the majority elects a leader without those
records: the fault checker (interop_tests/faults/history.py) must report them lost. The switch
lives here, in the test harness, never in the product.
"""

from __future__ import annotations

from cluster.replication.leader import LeaderReplication, LeaderRole


def _commit_on_own_disk(self: LeaderReplication) -> bool:
    if self.role is not LeaderRole.LEADING:
        return False
    durable = self.log.durable_index
    if durable > self.commit_index and self.log.term_at(durable) == self.term:
        self.commit_index = durable
        return True
    return False


LeaderReplication._advance_commit = _commit_on_own_disk  # type: ignore[method-assign]

if __name__ == "__main__":
    from amqp_server.runtime.cli import main

    raise SystemExit(main())
