"""Partitions, pauses, kills and a full disk against a replicated stream (issue 27, "the same for
streams"): the harness of interop_tests/faults/ with ``queue_type="stream"``, three replicas,
publishers with confirms moving on after 5 s without one, consumers reading the stream from its
first record and resuming at the next offset they have not seen on another node, and the
stream checker (`history.check_stream`) over the history.

Needs root (namespaces, tmpfs), as CI runs; the network is removed when the test ends, also when
it fails. The long run is `python -m interop_tests.faults.long_run --queue-type stream`.
"""

from __future__ import annotations

from interop_tests.faults.cluster import FaultCluster
from interop_tests.faults.history import StreamVerdict, markdown_table
from interop_tests.faults.netns import leftover_namespaces
from interop_tests.faults.run import STREAM, FaultRun
from interop_tests.test_faults import HOLD_S, SERVED_AGAIN_WITHIN_S, SESSION_TTL
from interop_tests.waiting import wait_until

# The quorum queue's CI run sets the session TTL, the hold and the target (served again within
# TTL + 5 s); a stream's run takes a shorter list of faults, to keep CI's time.
CI_FAULTS = ("leader-from-brokers", "pause-leader", "kill-restart", "one-way-from-leader", "disk-full-follower")


def test_no_confirmed_record_is_lost_moved_or_skipped_over_partitions_pauses_kills_and_a_full_disk(tmp_path):
    prefix = None
    with FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL) as cluster:
        assert cluster.network is not None
        prefix = cluster.network.prefix
        with FaultRun(cluster, seed=27, queue_type="stream", served_within=SERVED_AGAIN_WITHIN_S) as run:
            run.start()
            run.inject_each(CI_FAULTS, HOLD_S)
            outcome = run.finish()
        print(markdown_table(outcome.table, stream=True))
        verdict = outcome.verdict
        assert isinstance(verdict, StreamVerdict)
        assert verdict.confirmed > 500, verdict.summary()
        assert verdict.ok, verdict.summary()
        # Every reader went through failovers: each consumer read on more than one node.
        nodes_read = {}
        for event in outcome.events:
            if event["type"] == "deliver":
                nodes_read.setdefault(event["consumer"], set()).add(event["node"])
        assert all(len(nodes) > 1 for nodes in nodes_read.values()) and len(nodes_read) == 2, nodes_read
        wait_until(run.caught_up, "every replica has the leader's commit index", 30)
    assert leftover_namespaces(prefix) == []


def test_the_stream_checker_catches_a_leader_that_confirms_without_a_majority(tmp_path):
    """The same run against interop_tests/broken_quorum_broker.py (a replica group's leader
    commits on its own fsync, which a stream's leader shares): cut off from its followers it
    confirms, and makes readable, records the majority's new leader never had, whose offsets the
    new leader gives to other records; the old leader's copy never agrees again."""
    with FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL, module="interop_tests.broken_quorum_broker",
                      disk_mb=None) as cluster:
        # A third consumer starts on a, the leader, and stays there: it reads what the cut-off
        # leader makes readable, at offsets the new leader gives to other records.
        with FaultRun(cluster, seed=27, queue_type="stream", consumers=3, stay=60.0) as run:
            run.start()
            leader = cluster.leader(STREAM)
            assert leader == "a"  # (the declaring node leads the first term)
            # A publisher connected to the leader itself: its confirms are the ones the cut-off
            # leader gives without a majority.
            wait_until(lambda: run.confirming_on(leader), f"confirms from a publisher on {leader}", 30)
            run.inject("leader-from-brokers", HOLD_S)
            run.settle()
            outcome = run.finish()
        verdict = outcome.verdict
        assert isinstance(verdict, StreamVerdict)
        assert verdict.lost, verdict.summary()
        assert outcome.table[0].lost == len(verdict.lost)
        assert verdict.conflicts, verdict.summary()
        assert verdict.replicas_differ, verdict.summary()
