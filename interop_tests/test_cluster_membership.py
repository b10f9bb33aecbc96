"""Broker nodes joining a cluster on etcd and on ZooKeeper: every node lists the live nodes in
/api/nodes and `ctl cluster_status`, and a node killed with kill -9 drops out within seconds."""

from __future__ import annotations

import io
import subprocess
import sys
import time
import uuid

import pytest
import requests

from amqp_server.ctl.main import main as ctl_main
from interop_tests.broker_process import free_port, launch
from interop_tests.coordination_services import start_etcd, start_zookeeper
from interop_tests.waiting import poll

SESSION_TTL = 2
NODE_CONFIG = """
[server]
log_level = "info"

[cluster]
session_ttl = %d
""" % SESSION_TTL


@pytest.fixture(params=["etcd", "zookeeper"])
def coordination(request, tmp_path):
    service = start_etcd(tmp_path / "etcd") if request.param == "etcd" else start_zookeeper(tmp_path / "zk")
    yield service
    service.stop()


def _node_names(management_port: int) -> list[str]:
    reply = requests.get(f"http://127.0.0.1:{management_port}/api/nodes", auth=("guest", "guest"), timeout=5)
    reply.raise_for_status()
    return sorted(node["name"] for node in reply.json())


def _wait_for_nodes(management_port: int, expected: list[str], within: float) -> float:
    """Seconds it took until /api/nodes listed exactly `expected`."""
    started = time.monotonic()
    listed = poll(lambda: _node_names(management_port) == sorted(expected), within, every=0.1)
    assert listed, f"/api/nodes still lists {_node_names(management_port)}, expected {sorted(expected)}"
    return time.monotonic() - started


def test_nodes_see_each_other_and_a_killed_node_drops_out(coordination, tmp_path):
    url = coordination.url(f"cluster-{uuid.uuid4().hex[:6]}")
    nodes = {}
    try:
        metrics_port = free_port()
        for name in ("alpha", "beta", "gamma"):
            port = free_port()
            broker = launch(tmp_path / name, NODE_CONFIG, extra_args=(
                "--management-port", str(port), "--cluster", url, "--node-name", name,
                *(("--metrics-port", str(metrics_port)) if name == "alpha" else ())))
            nodes[name] = (broker, port)
        alpha_port = nodes["alpha"][1]
        _wait_for_nodes(alpha_port, ["alpha", "beta", "gamma"], within=10)
        _wait_for_nodes(nodes["gamma"][1], ["alpha", "beta", "gamma"], within=10)
        beta_seen = requests.get(f"http://127.0.0.1:{alpha_port}/api/nodes/beta", auth=("guest", "guest"),
                                 timeout=5).json()
        assert beta_seen["running"] and beta_seen["amqp_address"] == f"127.0.0.1:{nodes['beta'][0].port}"

        out = io.StringIO()
        assert ctl_main(["--port", str(alpha_port), "cluster_status"], out=out) == 0
        text = out.getvalue()
        assert "Running Nodes\n\nalpha\nbeta\ngamma\n" in text
        assert "Cluster name: " + url.rsplit("/", 1)[1] in text

        # Each node's metrics name it and the cluster (the address's prefix), as RabbitMQ's do.
        metrics = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        identity = next(line for line in metrics.splitlines() if line.startswith("rabbitmq_identity_info{"))
        assert 'rabbitmq_node="alpha"' in identity
        assert f'rabbitmq_cluster="{url.rsplit("/", 1)[1]}"' in identity

        nodes["beta"][0].kill()  # kill -9: no goodbye, only the session's expiry
        took = _wait_for_nodes(alpha_port, ["alpha", "gamma"], within=SESSION_TTL + 5)
        print(f"{coordination.scheme}: beta dropped out {took:.1f} s after kill -9")

        nodes["gamma"][0].stop()  # a clean stop leaves at once
        _wait_for_nodes(alpha_port, ["alpha"], within=2)
    finally:
        for broker, _port in nodes.values():
            broker.kill()


def test_a_second_live_node_with_the_same_name_is_refused(coordination, tmp_path):
    url = coordination.url("dup")
    first = launch(tmp_path / "one", NODE_CONFIG, extra_args=("--cluster", url, "--node-name", "same"))
    try:
        second = subprocess.run(
            [sys.executable, "-m", "amqp_server", "--host", "127.0.0.1", "--port", str(free_port()),
             "--data-dir", str(tmp_path / "two"), "--metrics-port", "0", "--management-port", "0",
             "--cluster", url, "--node-name", "same"],
            capture_output=True, text=True, timeout=SESSION_TTL + 20)
        assert second.returncode == 1
        assert "node name 'same' is held by another live node" in second.stderr
    finally:
        first.kill()


def test_a_node_whose_membership_key_is_removed_registers_again(coordination, tmp_path):
    """What a node does when its session expired while the coordination service was out of
    reach: it finds its key gone and writes it back, so it does not vanish for good."""
    import asyncio

    from cluster import connect, parse_cluster_address

    url = coordination.url("again")
    port = free_port()
    node = launch(tmp_path / "n", NODE_CONFIG, extra_args=(
        "--management-port", str(port), "--cluster", url, "--node-name", "lonely"))
    try:

        async def registered(coordinator) -> None:
            deadline = time.monotonic() + 10
            while (await coordinator.get("nodes/lonely")) is None:
                assert time.monotonic() < deadline, "the node is not registered"
                await asyncio.sleep(0.1)

        async def remove_and_wait_for_return() -> None:
            coordinator = await connect(parse_cluster_address(url), session_ttl=SESSION_TTL)
            try:
                await registered(coordinator)
                assert await coordinator.delete("nodes/lonely")
                await registered(coordinator)
            finally:
                await coordinator.close()

        asyncio.run(remove_and_wait_for_return())
        _wait_for_nodes(port, ["lonely"], within=5)
    finally:
        node.kill()
