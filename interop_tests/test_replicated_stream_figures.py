"""A replicated stream's figures on every node of a three-node cluster (issue 23 points 6 and 7;
docs/streams.md "Operations"), with pika and the nodes' management API, ctl and Prometheus.

RabbitMQ's management shows a stream's figures on any node. Here the node that leads a stream
holds it and the others hold a stand-in, so a node that does not lead asks the leader's API for
them (`stream_figures_node` names the leader) and adds its own replica's (`replica`). A
consumer attached on a node that does not lead is listed there with its offset.
"""

from __future__ import annotations

import io

import requests

from amqp_server.ctl.main import main as ctl_main
from interop_tests.broker_process import free_port
from interop_tests.cluster_nodes import ClusterNode, metric_samples, three_nodes
from interop_tests.test_replicated_streams import _declare, _publish, _Reader
from interop_tests.waiting import wait_until

FIGURES = ("messages", "messages_ready", "stream_first_offset", "stream_last_offset", "stream_segments",
           "stream_disk_bytes")


def _figures(item: dict) -> dict:
    return {name: item.get(name) for name in FIGURES}


def _listed(node: ClusterNode, name: str) -> dict:
    return next(item for item in node.api_json("queues") if item["name"] == name)


def test_every_node_shows_the_leaders_figures_and_its_own_consumers_offsets(tmp_path):
    metrics = {name: free_port() for name in "abc"}
    with three_nodes(tmp_path, node_args={name: ("--metrics-port", str(port)) for name, port in metrics.items()}) \
            as nodes:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        _declare(nodes, a, "ledger", **{"x-initial-cluster-size": 3})
        _publish(b, "ledger", [f"m{n}" for n in range(25)])
        leaders = a.api_json("queues/%2F/ledger")
        assert (leaders["node"], leaders["stream_figures_node"]) == ("a", "a")
        expected = _figures(leaders)
        assert expected["messages"] == 25 and (expected["stream_first_offset"], expected["stream_last_offset"]) == (0, 24)

        for node in (b, c):
            shown = node.api_json("queues/%2F/ledger")
            assert (shown["type"], shown["node"], shown["leader"]) == ("stream", "a", "a"), shown
            assert shown["stream_figures_node"] == "a", "the figures are the leader's"
            assert _figures(shown) == expected, node.name
            assert _figures(_listed(node, "ledger")) == expected, f"{node.name}'s /api/queues"
            assert shown["stream_segment_details"] == leaders["stream_segment_details"]
            # Its own replica's, labelled as such: the same records once replicated.
            wait_until(lambda node=node: node.api_json("queues/%2F/ledger")["replica"].get("stream_last_offset") == 24,
                       f"{node.name}'s replica has every record")
            replica = node.api_json("queues/%2F/ledger")["replica"]
            assert (replica["role"], replica["messages"], replica["stream_first_offset"]) == ("follower", 25, 0)
            # Where the leader is not asked (a peer's request; a UI session, which the leader does
            # not know), the node shows its replica's figures and says they are its own.
            own = requests.get(f"http://127.0.0.1:{node.management_port}/api/queues/%2F/ledger",
                               auth=("guest", "guest"), headers={"X-Amqp-Server-Local-Only": "1"}, timeout=5).json()
            assert (own["stream_figures_node"], _figures(own)) == (node.name, expected)

        # A follower's replica holds the leader's records, so its figures match the leader's and
        # could not tell a node that asks the leader from one that shows its replica's under the
        # leader's name. c holds no replica of a two-member stream: what it shows came from a.
        _declare(nodes, a, "pair", members=["a", "b"], **{"x-initial-cluster-size": 2})
        _publish(c, "pair", [f"p{n}" for n in range(7)])
        pairs = a.api_json("queues/%2F/pair")
        assert (pairs["stream_figures_node"], pairs["stream_last_offset"]) == ("a", 6)
        shown = c.api_json("queues/%2F/pair")
        assert "replica" not in shown, shown
        assert (shown["stream_figures_node"], _figures(shown)) == ("a", _figures(pairs))
        assert _figures(_listed(c, "pair")) == _figures(pairs), "c's /api/queues"
        own = requests.get(f"http://127.0.0.1:{c.management_port}/api/queues/%2F/pair",
                           auth=("guest", "guest"), headers={"X-Amqp-Server-Local-Only": "1"}, timeout=5).json()
        assert "stream_figures_node" not in own and own["stream_last_offset"] is None, own

        # A consumer on b, served through a's stream.
        reader = _Reader(b, "ledger", offset="first", prefetch=10)
        try:
            assert [offset for offset, _body in reader.read_until(25)] == list(range(25))
            details = b.api_json("queues/%2F/ledger")["consumer_details"]
            assert [(d["channel_details"]["node"], d["stream_offset"]) for d in details] == [("b", 25)], details
            on_b = [item for item in b.api_json("consumers") if item["queue"]["name"] == "ledger"]
            assert [item["stream_offset"] for item in on_b] == [25]
            # Every node counts it (the leader serves it), as RabbitMQ counts a stream's consumers.
            assert [node.api_json("queues/%2F/ledger")["consumers"] for node in (a, b, c)] == [1, 1, 1]

            out = io.StringIO()
            assert ctl_main(["--port", str(b.management_port), "list_stream_consumers"], out=out) == 0
            assert "ledger" in out.getvalue() and "\t25" in out.getvalue(), out.getvalue()
            out = io.StringIO()
            assert ctl_main(["--port", str(c.management_port), "list_queues", "name", "type", "messages",
                             "stream_first_offset", "stream_last_offset"], out=out) == 0
            assert "ledger\tstream\t25\t0\t24" in out.getvalue(), out.getvalue()

            # Prometheus: each member node reports its own copy, the leader's marked as such,
            # and the consumers attached to it.
            for name, port in metrics.items():
                samples = metric_samples(port)
                stream = frozenset({("vhost", "/"), ("queue", "ledger")})
                assert samples[("amqp_server_stream_last_offset", stream)] == 24, name
                assert samples[("amqp_server_stream_first_offset", stream)] == 0, name
                assert samples[("amqp_server_stream_leader", stream)] == (1 if name == "a" else 0), name
            offsets = [value for (family, labels), value in metric_samples(metrics["b"]).items()
                       if family == "amqp_server_stream_consumer_offset" and ("queue", "ledger") in labels]
            assert offsets == [25]
        finally:
            reader.close()
