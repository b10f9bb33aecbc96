"""`ctl cluster_status`: the cluster's name and its live nodes, in the sections and wording of
`rabbitmqctl cluster_status` (Basics, Disk Nodes, Running Nodes, Versions, Alarms, Network
Partitions). A node running alone is a cluster of one, as in RabbitMQ."""

from __future__ import annotations

import json
from typing import Any, TextIO

from amqp_server.ctl.admin_commands import Session, _call
from amqp_server.ctl.exit_codes import EX_OK


def write_cluster_status(out: TextIO, overview: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    names = sorted(node["name"] for node in nodes)
    running = sorted(node["name"] for node in nodes if node.get("running"))
    version = f"{overview.get('product_name', '')} {overview.get('product_version', '')} on " \
              f"{overview.get('erlang_version', '')}"
    alarms = [f"Node {node['name']} reports a memory alarm" for node in nodes if node.get("mem_alarm")]
    alarms += [f"Node {node['name']} reports a free disk space alarm" for node in nodes if node.get("disk_free_alarm")]
    out.write(f"Cluster status of node {overview.get('node', '')} ...\n")
    sections = [
        ("Basics", [f"Cluster name: {overview.get('cluster_name', '')}"]),
        ("Disk Nodes", names),
        ("Running Nodes", running),
        ("Versions", [f"{name}: {version}" for name in running]),
        ("Alarms", alarms or ["(none)"]),
        ("Network Partitions", ["(none)"]),
    ]
    for title, lines in sections:
        out.write(f"{title}\n\n" + "".join(line + "\n" for line in lines) + "\n")


def cluster_status(session: Session, formatter: str = "table") -> int:
    overview = _call(lambda: session.client.get("/api/overview"))
    nodes = _call(lambda: session.client.get("/api/nodes"))
    if formatter == "json":
        session.out.write(json.dumps({
            "cluster_name": overview.get("cluster_name"),
            "disk_nodes": sorted(node["name"] for node in nodes),
            "running_nodes": sorted(node["name"] for node in nodes if node.get("running")),
        }) + "\n")
    else:
        write_cluster_status(session.out, overview, nodes)
    return EX_OK
