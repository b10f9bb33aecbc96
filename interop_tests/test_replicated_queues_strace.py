"""Under strace, through the real broker: each confirm (and each tx.commit-ok) of a replicated
queue leaves only after a majority of its group (2 of 3: so at least one follower) fsynced the
message's record; and so does each confirm of a replicated stream, whose record is in the
stream's segment file on each node.

Three broker nodes and etcd (`three_nodes`, as in test_replicated_queues.py), a durable quorum
queue led by a, one strace attached to all three nodes (bench/strace_replicated_confirm_order.py
does the tracing and reads the trace: which node's fsync covered which message's record write,
and when the basic.ack covering it was written to the client's socket). Against the harness's
broken build (interop_tests/broken_replication_broker.py: confirms at once, replicates in 50 ms
batches) the same check must find violations. Needs strace (scripts/install-test-system-packages).
"""

from __future__ import annotations

from pathlib import Path

from bench.strace_replicated_confirm_order import (
    STREAM, ReplicatedVerdict, declare_replicated_queue, report, traced_run,
)
from interop_tests.cluster_nodes import three_nodes

MESSAGES = 50


def _traced(nodes, queue: str, publish_on: str, in_flight: int, per_transaction: int, workdir: Path,
            module: str) -> ReplicatedVerdict:
    verdict = traced_run(nodes, queue, "a", publish_on, MESSAGES, in_flight, 100, workdir, per_transaction)
    how = f"{per_transaction} per tx.commit" if per_transaction else f"{in_flight} in flight"
    print(report(verdict, f"{module}, publisher on {publish_on}, {MESSAGES} messages, {how}", every_message=False))
    return verdict


def test_each_confirm_leaves_after_a_majority_a_follower_included_fsynced_its_record(tmp_path):
    with three_nodes(tmp_path) as nodes:
        declare_replicated_queue(nodes, "a", "traced")
        # On the leader with 1 and 16 in flight, and in tx mode (5 per tx.commit); then through
        # b, whose stand-in forwards to a.
        for publish_on, in_flight, per_transaction in (("a", 1, 0), ("a", 16, 0), ("a", 0, 5), ("b", 16, 0)):
            verdict = _traced(nodes, "traced", publish_on, in_flight, per_transaction, tmp_path, "amqp_server")
            assert len(verdict.messages) == MESSAGES, "every confirmed message's ack is in the trace"
            assert verdict.not_held == 0, "every message's record write is in the trace"
            assert [m.line(verdict.nodes, verdict.majority) for m in verdict.violations] == []
            for message in verdict.messages:
                assert set(message.before_ack()) & {"b", "c"}, f"no follower fsynced message {message.number}"


def test_the_strace_check_catches_a_build_that_confirms_before_the_followers_fsync(tmp_path):
    """The fault test's broken build (confirm and commit-ok at once, records to the followers in
    50 ms batches) fails the same check, with confirms and with tx.commit-ok."""
    module = "interop_tests.broken_replication_broker"
    with three_nodes(tmp_path, module=module) as nodes:
        declare_replicated_queue(nodes, "a", "traced")
        for in_flight, per_transaction in ((16, 0), (0, 5)):
            verdict = _traced(nodes, "traced", "a", in_flight, per_transaction, tmp_path, module)
            assert len(verdict.messages) == MESSAGES and verdict.not_held == 0
            assert verdict.violations, f"the broken build's {verdict.reply}s passed the check"


def test_each_confirm_of_a_replicated_stream_leaves_after_a_majority_fsynced_its_record(tmp_path):
    """A stream's replicated log is its segment files: the record write the check finds on each
    node is the stream's own (the leader's, and each follower's copy of it)."""
    with three_nodes(tmp_path) as nodes:
        declare_replicated_queue(nodes, "a", "traced-stream", STREAM)
        for publish_on, in_flight in (("a", 1), ("a", 16), ("b", 16)):
            verdict = _traced(nodes, "traced-stream", publish_on, in_flight, 0, tmp_path, "amqp_server")
            assert len(verdict.messages) == MESSAGES and verdict.not_held == 0
            assert [m.line(verdict.nodes, verdict.majority) for m in verdict.violations] == []
            for message in verdict.messages:
                assert set(message.before_ack()) & {"b", "c"}, f"no follower fsynced message {message.number}"


def test_the_strace_check_catches_a_stream_build_that_confirms_on_the_leaders_append(tmp_path):
    """The broken build confirms a stream's publish on the leader's append and replicates in
    50 ms batches: every ack is a violation."""
    module = "interop_tests.broken_replication_broker"
    with three_nodes(tmp_path, module=module) as nodes:
        declare_replicated_queue(nodes, "a", "traced-stream", STREAM)
        verdict = _traced(nodes, "traced-stream", "a", 16, 0, tmp_path, module)
        # (Its records are still in the leader's write buffer when the trace ends, 50 ms before
        # its batch: not even written, let alone fsynced, before their acks.)
        assert len(verdict.messages) == MESSAGES
        assert len(verdict.violations) == MESSAGES, "the broken build's confirms passed the check"
