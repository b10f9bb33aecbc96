"""A shovel on a three-node cluster (etcd) runs on exactly one node, under a lease, and moves to
another node when that one is killed with SIGKILL; with on-confirm nothing is lost across the
move. The shovel's ends are two single brokers outside the cluster, so the node that dies takes
only the shovel with it."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from interop_tests.broker_process import launch
from interop_tests.cluster_nodes import three_nodes
from interop_tests.shovel_helpers import depth, drain_numbered, publish_numbered
from interop_tests.waiting import poll, wait_until

pytestmark = pytest.mark.skipif(bool(os.environ.get("INTEROP_BROKER_URL")), reason="starts its own brokers")

MESSAGES = 20_000


def _running_on(nodes) -> list[str]:
    """The nodes that say they run the shovel themselves."""
    found = []
    for node in nodes.values():
        if node.broker.process is None or node.broker.process.poll() is not None:
            continue
        for status in node.api_json("shovels"):
            if status["name"] == "moved" and status["node"] == node.name and status["state"] == "running":
                found.append(node.name)
    return found


@pytest.mark.timeout(300)
def test_a_shovel_runs_on_one_node_and_moves_when_it_dies(tmp_path):
    source = launch(tmp_path / "source")
    destination = launch(tmp_path / "destination")
    try:
        publish_numbered(source.url(), "work", MESSAGES)
        with three_nodes(tmp_path / "cluster") as nodes:
            value = {"src-uri": source.url(), "src-queue": "work", "dest-uri": destination.url(),
                     "dest-queue": "work", "reconnect-delay": 0.2, "src-prefetch-count": 200}
            reply = nodes["a"].api_write("PUT", "parameters/shovel/%2F/moved", {"value": value})
            assert reply.status_code == 201, reply.text
            wait_until(lambda: len(_running_on(nodes)) == 1, "the shovel runs on one node", 30)
            holder = _running_on(nodes)[0]
            others = [name for name in nodes if name != holder]
            # Every other node lists it, at the node that runs it.
            for name in others:
                assert [(s["name"], s["node"]) for s in nodes[name].api_json("shovels")] == [("moved", holder)]
            assert poll(lambda: depth(destination, "work") >= MESSAGES // 5, 60, every=0.05)
            nodes[holder].broker.kill()
            wait_until(lambda: _running_on(nodes) in ([others[0]], [others[1]]), "another node runs the shovel", 60)
            assert poll(lambda: depth(source, "work") == 0 and depth(destination, "work") >= MESSAGES, 120,
                        every=0.2)
            assert len(_running_on(nodes)) == 1
        got = Counter(drain_numbered(destination, "work"))
        lost = sum(1 for n in range(MESSAGES) if n not in got)
        duplicates = sum(count - 1 for count in got.values())
        print(f"moved from {holder}: lost {lost}, duplicates {duplicates}")
        assert lost == 0
    finally:
        source.stop()
        destination.stop()
