"""Federation on a cluster: each link runs on exactly one node, under its lease in the
coordination service, and another node takes it over when that node is killed (kill -9).

Three nodes on one etcd federate an exchange from a separate upstream broker into a quorum queue
(replicated: it survives the node). Nothing confirmed upstream is lost across the take-over.
"""

from __future__ import annotations

import time

import pika
import requests

from interop_tests.cluster_nodes import ClusterNode, three_nodes
from interop_tests.federation_faults import Publisher, Tally
from interop_tests.federation_helpers import declare, launch_site
from interop_tests.waiting import poll, wait_until


def running_on(nodes: dict[str, ClusterNode], exchange: str) -> list[str]:
    """The nodes that run the exchange's link, as each says of itself (its own links only)."""
    found = []
    for name, node in nodes.items():
        try:
            reply = requests.get(f"http://127.0.0.1:{node.management_port}/api/federation-links",
                                 auth=("guest", "guest"), headers={"X-Amqp-Server-Local-Only": "1"}, timeout=5)
            links = reply.json()
        except (OSError, ValueError):
            continue
        found += [name for link in links if link.get("exchange") == exchange and link["status"] == "running"]
    return sorted(found)


def listed_by(node: ClusterNode, exchange: str) -> list[tuple[str, str]]:
    """(node, status) of the exchange's links as `node` lists them for the whole cluster."""
    return [(link["node"], link["status"]) for link in node.api_json("federation-links")
            if link.get("exchange") == exchange]


def test_a_link_runs_on_one_node_and_moves_when_it_dies(tmp_path):
    up = launch_site(tmp_path / "up")
    try:
        with three_nodes(tmp_path) as nodes:
            a = nodes["a"]
            assert a.api_write("PUT", "parameters/federation-upstream/%2F/up",
                               {"value": {"uri": up.amqp_url, "reconnect-delay": 0.5}}).status_code == 201
            assert a.api_write("PUT", "policies/%2F/fed", {"pattern": "^orders$", "apply-to": "exchanges",
                                                           "definition": {"federation-upstream": "up"}}).status_code == 201
            declare(up, exchange="orders")
            connection = a.connect()
            channel = connection.channel()
            channel.exchange_declare("orders", "topic", durable=True)
            channel.queue_declare("orders-here", durable=True, arguments={"x-queue-type": "quorum"})
            channel.queue_bind("orders-here", "orders", "#")
            connection.close()
            holder = wait_until(lambda: running_on(nodes, "orders") if len(running_on(nodes, "orders")) == 1 else None,
                                "the link running on exactly one node", 60)[0]
            time.sleep(1)
            assert running_on(nodes, "orders") == [holder], "still exactly one"
            for node in nodes.values():  # any node lists the link once, where it runs
                assert listed_by(node, "orders") == [(holder, "running")]
            tally = Tally()
            publisher = Publisher(up, "orders", "k", 600, tally, pause_s=0.005)
            publisher.start()
            wait_until(lambda: len(tally.confirmed) >= 200, "publishing under way", 60)
            nodes[holder].broker.kill()
            survivors = {name: node for name, node in nodes.items() if name != holder}
            new_holder = wait_until(lambda: running_on(survivors, "orders") if len(running_on(survivors, "orders")) == 1
                                    else None, "another node running the link", 60)[0]
            assert new_holder != holder
            publisher.join(timeout=120)
            assert not publisher.is_alive()
            reader = survivors[new_holder]

            def all_arrived() -> bool:
                try:
                    connection = reader.connect()
                except pika.exceptions.AMQPError:
                    return False
                try:
                    channel = connection.channel()
                    while True:
                        method, _properties, body = channel.basic_get("orders-here", auto_ack=True)
                        if method is None:
                            break
                        tally.arrived[int(body)] += 1
                except pika.exceptions.ChannelClosedByBroker as error:
                    # 404 while the quorum queue's leadership moves off the killed node
                    assert error.reply_code == 404, error
                    return False
                finally:
                    if connection.is_open:
                        connection.close()
                return not tally.lost

            arrived = poll(all_arrived, 120, every=0.5)
            if not arrived:  # (what the survivors say, for the failure's report)
                for name, node in survivors.items():
                    print(name, node.api_json("federation-links"), node.api_json("queues/%2F/orders-here"))
            assert arrived, f"{len(tally.lost)} confirmed messages never arrived: {tally.lost[:20]}"
            print(f"confirmed {len(tally.confirmed)}, duplicates {tally.duplicates}, moved {holder} -> {new_holder}")
            assert running_on(survivors, "orders") == [new_holder]
            for node in survivors.values():
                assert listed_by(node, "orders") == [(new_holder, "running")]
    finally:
        up.broker.kill()
