"""Partitions, pauses and full disks, as Jepsen tests a broker (issue 27): three nodes and a
three-member etcd, each in a network namespace the test makes (interop_tests/faults/), clients
recording a history, faults injected one after another, and the checker's verdict.

Needs root (namespaces, tmpfs), as CI runs; the network is removed when the test ends, also when
it fails. The long run (100 faults or more) is `python -m interop_tests.faults.long_run`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from interop_tests.broker_process import TEST_CONFIG, free_port
from interop_tests.coordination_services import start_etcd, start_zookeeper
from interop_tests.faults import cluster as cluster_module
from interop_tests.faults.cluster import FaultCluster
from interop_tests.faults.history import fault_table, markdown_table
from interop_tests.faults.netns import Network, leftover_namespaces
from interop_tests.faults.run import QUEUE, FaultRun
from interop_tests.waiting import wait_until

SESSION_TTL = 2
# The target: after a single-node fault the majority serves the queue again within this.
SERVED_AGAIN_WITHIN_S = SESSION_TTL + 5
CI_FAULTS = ("leader-from-brokers", "leader-from-etcd", "split-with-etcd", "one-way-from-leader", "pause-leader",
             "kill-restart", "disk-full-follower")
HOLD_S = 6.0


def test_no_confirmed_message_is_lost_over_partitions_pauses_kills_and_a_full_disk(tmp_path):
    prefix = None
    with FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL) as cluster:
        assert cluster.network is not None
        prefix = cluster.network.prefix
        with FaultRun(cluster, seed=27) as run:
            run.start()
            run.inject_each(CI_FAULTS, HOLD_S)
            outcome = run.finish()
        print(markdown_table(outcome.table))
        verdict = outcome.verdict
        assert verdict.confirmed > 500, verdict.summary()
        assert verdict.ok, verdict.summary()
        for row in outcome.table:
            assert max(row.unavailable) <= SERVED_AGAIN_WITHIN_S, f"{row.kind}: unavailable {row.unavailable} s"
        # On heal the old leaders caught up as followers: every member has the commit index.
        wait_until(run.caught_up, "every replica has the leader's commit index", 30)
    assert leftover_namespaces(prefix) == []


def test_the_checker_catches_a_leader_that_confirms_without_a_majority(tmp_path):
    """The same run against interop_tests/broken_quorum_broker.py (the leader commits on its own
    fsync): cut off from its followers it confirms until it steps down, and those are lost."""
    with FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL, module="interop_tests.broken_quorum_broker",
                      disk_mb=None) as cluster:
        with FaultRun(cluster, seed=27) as run:
            run.start()
            leader = cluster.leader(QUEUE)
            assert leader is not None
            # A publisher connected to the leader itself: its confirms are the ones the cut-off
            # leader gives without a majority.
            wait_until(lambda: run.confirming_on(leader), f"confirms from a publisher on {leader}", 30)
            run.inject("leader-from-brokers", HOLD_S)
            run.settle()
            outcome = run.finish()
        assert outcome.verdict.lost, outcome.verdict.summary()
        assert fault_table(outcome.events)[0].lost == len(outcome.verdict.lost)


def test_a_cluster_that_fails_to_start_leaves_no_process_mount_or_namespace_behind(tmp_path, monkeypatch):
    """Node a exits at once (a module that does not exist) after the etcd members run and every
    node's tmpfs is mounted: entering the cluster raises, and all of it is undone first."""
    networks: list[Network] = []

    class RecordedNetwork(Network):
        def __init__(self) -> None:
            super().__init__()
            networks.append(self)

    monkeypatch.setattr(cluster_module, "Network", RecordedNetwork)
    cluster = FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL, module="interop_tests.no_such_module")
    with pytest.raises(RuntimeError, match="broker exited"):
        with cluster:
            pytest.fail("the cluster started")
    [network] = networks
    assert network.hosts == {} and leftover_namespaces(network.prefix) == []
    assert all(member.process is not None and member.process.poll() is not None for member in cluster.etcd.values())
    assert len(cluster.etcd) == 3
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    assert not [point for point in mounted if point.startswith(str(tmp_path))], mounted


def test_a_publish_through_a_node_cut_off_from_the_owner_is_nacked_within_seconds(tmp_path):
    """A classic queue owned by a; b cut off from a (both still reach etcd): a publish with
    confirms on b is nacked within seconds (the link's connect timeout and heartbeats), not hung."""
    with FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL, disk_mb=None) as cluster:
        assert cluster.network is not None
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(a.url()))) as connection:
            connection.channel().queue_declare("owned-by-a", durable=True)
        wait_until(lambda: b.api_json("queues/%2F/owned-by-a").get("node") == "a", "b knows a's queue")
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(b.url()))) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", "owned-by-a", b"before")  # the link is open
            cluster.network.partition(["a"], ["b"])
            outcomes = []
            for _ in range(3):  # the first rides the hung link, the next ones a new link
                began = time.monotonic()
                try:
                    channel.basic_publish("", "owned-by-a", b"during")
                    outcomes.append(("acked", time.monotonic() - began))
                except pika.exceptions.NackError:
                    outcomes.append(("nacked", time.monotonic() - began))
            cluster.network.heal()
        assert [outcome for outcome, _ in outcomes] == ["nacked"] * 3, outcomes
        assert max(seconds for _, seconds in outcomes) < 6.0, outcomes


def test_a_consumer_on_a_node_cut_off_from_the_queue_is_told(tmp_path):
    """A quorum queue led by a (members a, b, c); a consumer on b; b cut off from a and c (all
    still reach etcd): the queue stays with a and c, and b's consumer, which b cannot serve, gets
    basic.cancel (within the link's 4 s and PARKED_CANCEL_S), so its client can move."""
    with FaultCluster(tmp_path / "cluster", session_ttl=SESSION_TTL, disk_mb=None) as cluster:
        assert cluster.network is not None
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(a.url()))) as connection:
            connection.channel().queue_declare("served", durable=True, arguments={"x-queue-type": "quorum"})
        wait_until(lambda: cluster.leader("served") == "a", "a leads the queue", 30)
        wait_until(lambda: (cluster.queue_view("b", "served") or {}).get("leader") == "a", "b knows the queue")
        cancelled: list[float] = []
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(b.url()))) as connection:
            channel = connection.channel()
            channel.add_on_cancel_callback(lambda _frame: cancelled.append(time.monotonic()))
            channel.basic_consume("served", lambda *_: None)
            connection.process_data_events(0.5)
            cluster.network.partition(["b"], ["a", "c"])
            began = time.monotonic()
            wait_until(lambda: cancelled, "b's consumer gets basic.cancel", 30, every=0.2,
                       pump=lambda seconds: connection.process_data_events(seconds))
            cluster.network.heal()
        assert cancelled[0] - began < 4 + 10 + 5, f"told after {cancelled[0] - began:.1f} s"
        assert cluster.leader("served") == "a"  # the majority side kept serving it


def _stop_without_coordination(tmp_path, backend: str, workers: int) -> tuple[int, float, str]:
    """A node (`workers` processes) on `backend`, the service killed, then SIGTERM: (exit code,
    seconds to exit, log)."""
    service = start_etcd(tmp_path / "etcd") if backend == "etcd" else start_zookeeper(tmp_path / "zk")
    try:
        port, management = free_port(), free_port()
        workdir = tmp_path / "node"
        workdir.mkdir()
        (workdir / "broker.toml").write_text(TEST_CONFIG + "\n[cluster]\nsession_ttl = 2\n")
        log_path = workdir / "broker.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "amqp_server", "--host", "127.0.0.1", "--port", str(port),
                 "--data-dir", str(workdir / "data"), "--config", str(workdir / "broker.toml"),
                 "--metrics-port", "0", "--management-port", str(management), "--workers", str(workers),
                 "--cluster", service.url("stopping"), "--node-name", "s"],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: log_path.read_text().count("AMQP listener started") >= workers,
                       "every worker accepts clients", 30)
            with contextlib.closing(pika.BlockingConnection(pika.URLParameters(
                    f"amqp://guest:guest@127.0.0.1:{port}/%2F"))) as connection:
                connection.channel().queue_declare("held", durable=True, arguments={"x-queue-type": "quorum"})
            service.kill9_all()
            time.sleep(0.5)  # the service is gone, not merely going
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(60)
            return code, time.monotonic() - began, log_path.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finally:
        service.stop()


@pytest.mark.parametrize("backend, workers", [("etcd", 2), ("zookeeper", 1)])
def test_a_node_stops_promptly_and_cleanly_with_the_coordination_service_gone(tmp_path, backend, workers):
    code, seconds, log = _stop_without_coordination(tmp_path, backend, workers)
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert seconds < 10.0, f"stopping took {seconds:.1f} s"
